"""The operator end to end against a real kube-apiserver + etcd, with the test node agent
running every pod from the runtime image (make images; KUBETRAIN_E2E_IMAGES=0: host binaries)
in its own network namespace (tests/cluster/cluster-up.sh): kubectl apply -> pods train for
real -> kubectl get/describe tell the truth. Job lifecycle and run policies: success with
status and printer columns, a Chief, failures by replica, restarts by exit code, backoff
limit, deadline, suspend/resume, TTL, an operator killed mid-reconcile, data volumes.
The other concerns: test_e2e_objects.py (malformed jobs, owned objects, refusals, events),
test_e2e_gang.py, test_e2e_parameters.py, test_e2e_auth.py; helpers in e2e_helpers.py."""
import json
import os
import re
import signal
import subprocess
import time

from conftest import CLUSTER, ROOT
from e2e_helpers import (apply, auth_secret, check_certificate, condition, container_pid, job, pods,
    started_pod, status, task_logs, wait_state)


def test_sync_example_succeeds_with_status_and_printer_columns(cluster):
    k = cluster
    k.run("apply", "-f", os.path.join(ROOT, "examples", "fashion-mnist-sync.yaml"))
    st = wait_state(k, "fashion-mnist-sync", {"Succeeded", "Failed"}, timeout=600)
    assert st["state"] == "Succeeded", st
    assert st["progress"]["accuracy"] >= 0.85, st["progress"]
    assert st["progress"]["globalStep"] == 3750
    # .status.result is the camelCase projection of the chief's report.
    assert st["result"]["testAccuracy"] == st["progress"]["accuracy"], st["result"]
    assert st["result"]["globalStep"] == 3750 and "test_accuracy" not in st["result"], st["result"]
    table = k.run("get", "tj", "fashion-mnist-sync").stdout
    assert "Succeeded" in table and "3750" in table and "0.8" in table, table
    # Every pod, PS included, exited by itself with success.
    deadline = time.time() + 30
    while time.time() < deadline:
        ps = pods(k, "fashion-mnist-sync")
        if len(ps) == 4 and all(p["status"].get("phase") == "Succeeded" for p in ps):
            break
        time.sleep(0.5)
    assert len(ps) == 4 and all(p["status"]["phase"] == "Succeeded" for p in ps), \
        [(p["metadata"]["name"], p["status"].get("phase")) for p in ps]
    job_uid = k.json("get", "tj", "fashion-mnist-sync")["metadata"]["uid"]
    for p in ps:
        owner = p["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "TrainingJob" and owner["uid"] == job_uid and owner["controller"] is True
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        tf = json.loads(env["TF_CONFIG"])
        assert tf["cluster"] == {
            "ps": [f"fashion-mnist-sync-ps-{i}.default.svc:2222" for i in range(2)],
            "worker": [f"fashion-mnist-sync-worker-{i}.default.svc:2222" for i in range(2)]}
        labels = p["metadata"]["labels"]
        assert tf["task"] == {"type": labels["kubetrain.io/replica-type"],
                              "index": int(labels["kubetrain.io/replica-index"])}
    for s in k.json("get", "svc", "-l", "kubetrain.io/job-name=fashion-mnist-sync")["items"]:
        assert s["spec"]["clusterIP"] == "None" and s["spec"]["publishNotReadyAddresses"] is True
        assert s["metadata"]["ownerReferences"][0]["uid"] == job_uid
    describe = k.run("describe", "tj", "fashion-mnist-sync").stdout
    assert "TrainingJobSucceeded" in describe
    assert "SuccessfulCreatePod" in describe and "SuccessfulCreateService" in describe
    # It trained with tokens and TLS (the default): its Secret and NetworkPolicy, as the real
    # API server stores them.
    data = auth_secret(k, "fashion-mnist-sync", job_uid)
    assert sorted(data) == ["ca.crt", "job.key", "tls.crt", "tls.key", "token.worker-0", "token.worker-1"]
    check_certificate(data)
    for i in range(2):  # the PS tasks checked tokens and spoke mutual TLS
        with open(os.path.join(k.state, "node-agent", "logs", f"default_fashion-mnist-sync-ps-{i}_kubetrain.log")) as f:
            log = f.read()
        assert (f"ps:{i} admits only fashion-mnist-sync's tasks: tokens checked, mutual TLS under the job's CA"
                in log), log[-2000:]
        # ... and served the bulk data plane on its pod's port "bulk", which carried the job's
        # pulls and pushes (the workers reached it through the NetworkPolicy, in TLS).
        assert "(bulk data plane on port 2223)" in log, log[-2000:]
        calls = re.search(r"; (\d+) pulls and pushes over the bulk data plane", log)
        assert calls and int(calls.group(1)) >= 3750, log[-2000:]
    for p in ps:
        assert [c["name"] for c in p["spec"]["containers"][0]["ports"]] == (
            ["kubetrain", "metrics", "bulk"] if "-ps-" in p["metadata"]["name"] else ["kubetrain", "metrics"])
    for i in range(2):  # no worker fell back to gRPC
        with open(os.path.join(k.state, "node-agent", "logs",
                               f"default_fashion-mnist-sync-worker-{i}_kubetrain.log")) as f:
            log = f.read()
        assert "bulk data plane" not in log, log[-2000:]
    np = k.json("get", "networkpolicy", "fashion-mnist-sync")
    assert np["metadata"]["ownerReferences"][0]["uid"] == job_uid
    same_job = {"matchLabels": {"kubetrain.io/job-name": "fashion-mnist-sync"}}
    assert np["spec"] == {"podSelector": same_job, "policyTypes": ["Ingress"],
                          "ingress": [{"from": [{"podSelector": same_job}]},
                                      {"ports": [{"protocol": "TCP", "port": 9090}]}]}, np["spec"]


def test_chief_replica_job_succeeds_with_accuracy(cluster):
    """A Chief replica without a template runs the kubetrain runtime as a real
    task type: the operator gives it kubetrain-worker and the result file, the
    chief coordinates (evaluates, reports, ends the job) and the job succeeds
    with the chief's accuracy in its status."""
    k = cluster
    obj = job("chief", steps=300, extra_training={"evaluation": {"everySteps": 100}})
    obj["spec"]["replicaSpecs"]["Chief"] = {"replicas": 1}
    apply(k, obj)
    st = wait_state(k, "chief", {"Succeeded", "Failed"}, timeout=300)
    assert st["state"] == "Succeeded", st
    assert st["result"]["testAccuracy"] > 0.5, st["result"]
    assert st["progress"]["accuracy"] == st["result"]["testAccuracy"], st
    assert st["progress"]["globalStep"] == 300, st["progress"]
    assert st["replicaStatuses"]["Chief"]["succeeded"] == 1, st["replicaStatuses"]
    by_name = {p["metadata"]["name"]: p["spec"]["containers"][0] for p in pods(k, "chief")}
    assert by_name["chief-chief-0"]["command"] == ["kubetrain-worker"]
    assert "--result_file=/dev/termination-log" in by_name["chief-chief-0"]["args"]
    for name, container in by_name.items():
        if name != "chief-chief-0":
            assert "--result_file=/dev/termination-log" not in container["args"], name
            assert container["command"] == ["kubetrain-ps" if "-ps-" in name else "kubetrain-worker"], name
    table = k.run("get", "tj", "chief").stdout
    assert "Succeeded" in table and "300" in table, table


def test_worker_failing_under_never_fails_the_job_naming_the_replica(cluster):
    k = cluster
    # The worker cannot read its data: a permanent error (exit 2), no restart.
    apply(k, job("never", extra_training={"dataset": {"name": "fashion-mnist", "path": "/nonexistent"}}))
    st = wait_state(k, "never", {"Failed", "Succeeded"})
    assert st["state"] == "Failed"
    msg = condition(st, "Failed")["message"]
    assert "Worker replica" in msg and "exited with code 2" in msg, msg
    # ... and why: the task's reason, from its termination message.
    assert "(restartPolicy Never): " in msg and "/nonexistent/train-" in msg, msg
    assert "cannot open: No such file or directory" in msg, msg


def test_a_crash_looping_worker_is_restarting_with_its_reason(cluster):
    k = cluster
    apply(k, job("crashloop", worker_policy="OnFailure", run_policy={"backoffLimit": 2},
                 extra_training={"dataset": {"name": "fashion-mnist", "path": "/nonexistent"}}))
    deadline = time.time() + 120
    msg = ""
    while time.time() < deadline:
        st = status(k, "crashloop")
        c = condition(st, "Restarting")
        if c and c["status"] == "True" and "CrashLoopBackOff" in c["message"]:
            msg = c["message"]
            break
        assert st.get("state") != "Failed", st
        time.sleep(0.5)
    assert msg, st
    assert "is restarting a replica: worker-" in msg and " exited 2 (CrashLoopBackOff, " in msg, msg
    assert "/nonexistent/train-" in msg, msg
    st = wait_state(k, "crashloop", {"Failed"}, timeout=180)
    failed = condition(st, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", st
    assert "exited 2" in failed["message"] and "/nonexistent/train-" in failed["message"], failed


def test_exit_137_under_exitcode_recreates_the_pod_then_succeeds(cluster):
    k = cluster
    apply(k, job("exitcode", steps=4000, worker_policy="ExitCode",
                 extra_training={"barrierTimeoutSeconds": 1}))
    wait_state(k, "exitcode", {"Running"})
    time.sleep(2)
    victim = started_pod(k, "exitcode", "exitcode-worker-1")
    os.kill(container_pid(victim), signal.SIGKILL)
    st = wait_state(k, "exitcode", {"Succeeded", "Failed"}, timeout=300)
    assert st["state"] == "Succeeded", st
    assert st["replicaStatuses"]["Worker"]["recreated"] == 1
    # It went through Restarting (briefly: the pod is recreated at once).
    assert condition(st, "Restarting") is not None, st["conditions"]
    assert condition(st, "Restarting")["reason"] in ("TrainingJobRestarting", "TrainingJobRunning",
                                                     "TrainingJobSucceeded")
    events = k.run("get", "events", "--field-selector", "involvedObject.name=exitcode").stdout
    assert "TrainingJobRestarting" in events


def test_backoff_limit_exceeded_fails_the_job(cluster):
    k = cluster
    apply(k, job("backoff", steps=100000, worker_policy="ExitCode", run_policy={"backoffLimit": 0}))
    wait_state(k, "backoff", {"Running"})
    victim = started_pod(k, "backoff", "backoff-worker-0")
    os.kill(container_pid(victim), signal.SIGKILL)
    st = wait_state(k, "backoff", {"Failed"}, timeout=60)
    assert condition(st, "Failed")["reason"] == "BackoffLimitExceeded"


def test_active_deadline_fails_the_job_on_time(cluster):
    k = cluster
    apply(k, job("deadline", steps=10000000, run_policy={"activeDeadlineSeconds": 6}))
    start = time.time()
    st = wait_state(k, "deadline", {"Failed"}, timeout=60)
    elapsed = time.time() - start
    assert condition(st, "Failed")["reason"] == "DeadlineExceeded"
    assert elapsed < 6 + 5, elapsed  # a timer, not the next event
    deadline = time.time() + 20
    while time.time() < deadline and any(p["status"].get("phase") in ("Running", "Pending")
                                         for p in pods(k, "deadline")):
        time.sleep(0.5)
    assert not any(p["status"].get("phase") == "Running" for p in pods(k, "deadline"))


def test_suspend_deletes_pods_and_resume_recreates_them(cluster):
    """Created suspended, as a queueing system (Kueue: the kueue.x-k8s.io/queue-name label)
    creates a job it has not admitted yet: no pod until suspend is set false. Then suspended
    while running (preemption): every pod goes; resumed: all come back."""
    k = cluster
    obj = job("suspend", steps=10000000, run_policy={"suspend": True})
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    apply(k, obj)
    st = wait_state(k, "suspend", {"Suspended"})
    # The pass that wrote Suspended is the one that would have created the pods.
    assert condition(st, "Suspended")["status"] == "True", st
    assert not pods(k, "suspend")
    assert not k.json("get", "services", "-l", "kubetrain.io/job-name=suspend")["items"]
    assert "startTime" not in st, st  # activeDeadlineSeconds would count from admission
    events = k.json("get", "events", "--field-selector", "involvedObject.name=suspend")["items"]
    assert not any(e["reason"].startswith("SuccessfulCreate") for e in events), events
    assert k.json("get", "tj", "suspend")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    k.run("patch", "tj", "suspend", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    st = wait_state(k, "suspend", {"Running"})
    assert condition(st, "Suspended")["status"] == "False", st
    assert "startTime" in st, st
    assert len(pods(k, "suspend")) == 3
    k.run("patch", "tj", "suspend", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    wait_state(k, "suspend", {"Suspended"})
    deadline = time.time() + 30
    while time.time() < deadline and pods(k, "suspend"):
        time.sleep(0.5)
    assert not pods(k, "suspend")
    k.run("patch", "tj", "suspend", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    st = wait_state(k, "suspend", {"Running"})
    assert condition(st, "Suspended")["status"] == "False"
    assert len(pods(k, "suspend")) == 3
    k.run("delete", "tj", "suspend")


def test_ttl_deletes_the_finished_job(cluster):
    k = cluster
    apply(k, job("ttl", steps=50, run_policy={"ttlSecondsAfterFinished": 3}))
    wait_state(k, "ttl", {"Succeeded"})
    deadline = time.time() + 30
    while time.time() < deadline:
        if k.run("get", "tj", "ttl", check=False).returncode != 0:
            break
        time.sleep(0.5)
    assert k.run("get", "tj", "ttl", check=False).returncode != 0, "the job was not deleted"
    assert not pods(k, "ttl")


def test_operator_killed_mid_reconcile_creates_no_duplicates(cluster):
    k = cluster
    pidfile = os.path.join(k.state, "operator.pid")
    pid = int(open(pidfile).read())
    apply(k, job("restart-op", steps=800, workers=3, ps=2))
    time.sleep(0.3)  # the operator is creating objects
    os.kill(pid, signal.SIGKILL)
    os.remove(pidfile)
    # Start it again (cluster-up.sh only starts what is not running).
    subprocess.run([os.path.join(CLUSTER, "cluster-up.sh")], capture_output=True, text=True,
                   env=dict(k.env, KUBETRAIN_STATE=k.state), timeout=600, check=True)
    st = wait_state(k, "restart-op", {"Succeeded", "Failed"}, timeout=300)
    assert st["state"] == "Succeeded", st
    names = [p["metadata"]["name"] for p in pods(k, "restart-op")]
    assert len(names) == len(set(names)) <= 5, names
    assert not any(n.startswith("restart-op") and n.count("-") > 3 for n in names), names


def test_census_job_reads_its_data_from_a_volume_mounted_into_the_runtime(cluster):
    """The Census example with its CSV files on a hostPath volume: a `kubetrain` container
    without a command in each template mounts it into kubetrain's runtime (the operator keeps
    its command, flags and job file), at a path that exists only inside the pods; the job
    trains from it and reports test accuracy on the original test set."""
    import yaml
    k = cluster
    with open(os.path.join(ROOT, "examples", "census-income-mlp.yaml")) as f:
        obj = yaml.safe_load(f)
    obj["metadata"] = {"name": "census-volume"}
    mount = "/mnt/kubetrain-e2e-census"
    assert not os.path.exists(os.path.join(mount, "adult.data.gz")), "the data must come from the volume"
    training = obj["spec"]["training"]
    dataset = training["dataset"]
    dataset["trainFiles"] = [f"{mount}/adult.data.gz"]
    dataset["testFiles"] = [f"{mount}/adult.test.gz"]
    training.pop("epochs")
    training.update(steps=400, startupTimeoutSeconds=60, evaluation={"everySteps": 400})
    template = {"spec": {
        "containers": [{"name": "kubetrain",
                        "volumeMounts": [{"name": "census", "mountPath": mount, "readOnly": True}]}],
        "volumes": [{"name": "census", "hostPath": {"path": os.path.join(ROOT, "data", "census-income"),
                                                    "type": "Directory"}}]}}
    for replica in obj["spec"]["replicaSpecs"].values():
        replica["template"] = template
    apply(k, obj)
    st = wait_state(k, "census-volume", {"Succeeded", "Failed"}, timeout=300)
    assert st["state"] == "Succeeded", json.dumps(condition(st, "Failed")) + task_logs(k, "census-volume")
    # 400 steps of 64 rows: well past the majority class (0.76 of the test set).
    assert st["result"]["testAccuracy"] > 0.8, st["result"]
    for p in pods(k, "census-volume"):
        c = p["spec"]["containers"]
        assert len(c) == 1 and c[0]["command"][0] in ("kubetrain-ps", "kubetrain-worker"), c
        assert [m["mountPath"] for m in c[0]["volumeMounts"]][2:] == [mount], c[0]["volumeMounts"]
    k.run("delete", "tj", "census-volume")
