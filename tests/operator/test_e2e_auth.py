"""The operator e2e (see test_e2e.py), authentication and isolation: the job's Secret,
each pod's files, impostors refused."""
import json
import os

from e2e_helpers import (RUNTIME_IMAGE, apply, auth_secret, condition, get_or_none, job,
    started_pod, status, wait_for, wait_state)


def auth_dir_of(k, pod):
    """What the node agent mounted at the pod's credentials directory (its volume on this machine)."""
    uid8 = pod["metadata"]["uid"][:8]
    return os.path.join(k.state, "node-agent", "pods", f"default_{pod['metadata']['name']}_{uid8}",
                        "volumes", "kubetrain-auth")


def impostor(k, job_name, name, tf_config, items=None, config_map=None):
    """A pod inside the job's network (labelled as its pods are, so its NetworkPolicy admits it)
    running kubetrain-worker as worker 1, with `items` of the job's Secret as its credentials
    (None: no credentials at all) and the job file of `config_map` (default: the job's)."""
    env = [{"name": "TF_CONFIG", "value": tf_config},
           {"name": "KUBETRAIN_TERMINATION_LOG", "value": "/dev/termination-log"}]
    mounts = [{"name": "config", "mountPath": "/etc/kubetrain"}]
    volumes = [{"name": "config", "configMap": {"name": config_map or f"{job_name}-config"}}]
    if items is not None:
        env.append({"name": "KUBETRAIN_AUTH_DIR", "value": "/var/run/kubetrain/auth"})
        mounts.append({"name": "auth", "mountPath": "/var/run/kubetrain/auth"})
        volumes.append({"name": "auth", "secret": {"secretName": f"{job_name}-auth", "items": items}})
    apply(k, {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": name, "labels": {"kubetrain.io/job-name": job_name}},
              "spec": {"restartPolicy": "Never", "volumes": volumes,
                       "containers": [{"name": "kubetrain", "image": RUNTIME_IMAGE,
                                       "command": ["kubetrain-worker"],
                                       "args": ["--config=/etc/kubetrain/trainingjob.yaml"],
                                       "env": env, "volumeMounts": mounts}]}})


def metric(ip, name, labels):
    import urllib.request
    with urllib.request.urlopen(f"http://{ip}:9090/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"{name}{{{labels}}} "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def ended_pod(k, name, timeout=120):
    def ended():
        pod = get_or_none(k, "pod", name)
        return pod if pod and pod["status"].get("phase") in ("Succeeded", "Failed") else None
    return wait_for(k, f"pod {name} to end", ended, timeout)


def test_each_pod_gets_only_its_credentials_and_an_impostor_is_refused(cluster):
    """A running job (TLS on): every pod's credentials directory holds exactly its own files (a
    PS the job key, a worker its own token, never the job key), readable by the runtime's user;
    then two pods inside the job's network try to act as worker 1: one with worker 0's token,
    one with the job's TLS files but no token. The PS refuses both (the runtime's socket-level
    tests cover each refusal in detail; this shows the wiring end to end) and the job trains on."""
    k = cluster
    apply(k, job("auth-iso", steps=10000000))
    wait_state(k, "auth-iso", {"Running"})
    data = auth_secret(k, "auth-iso", k.json("get", "tj", "auth-iso")["metadata"]["uid"])
    tls = ["ca.crt", "tls.crt", "tls.key"]
    for name in ("auth-iso-ps-0", "auth-iso-worker-0", "auth-iso-worker-1"):
        d = auth_dir_of(k, started_pod(k, "auth-iso", name))
        want = {f: data[f] for f in tls}
        if "-ps-" in name:
            want["job.key"] = data["job.key"]
        else:
            want["token"] = data[f"token.worker-{name.rsplit('-', 1)[1]}"]
        assert sorted(os.listdir(d)) == sorted(want), (name, os.listdir(d))
        for f, content in want.items():
            assert open(os.path.join(d, f), "rb").read() == content, (name, f)
            assert os.stat(os.path.join(d, f)).st_mode & 0o777 == 0o444, (name, f)
    ps = get_or_none(k, "pod", "auth-iso-ps-0")
    ps_log = open(os.path.join(k.state, "node-agent", "logs", "default_auth-iso-ps-0_kubetrain.log")).read()
    assert "ps:0 admits only auth-iso's tasks: tokens checked, mutual TLS under the job's CA" in ps_log, ps_log[-2000:]
    w1 = get_or_none(k, "pod", "auth-iso-worker-1")
    tf_config = next(e["value"] for e in w1["spec"]["containers"][0]["env"] if e["name"] == "TF_CONFIG")
    # Worker 0's token (and the job's TLS files) presented as worker 1.
    impostor(k, "auth-iso", "auth-iso-impostor", tf_config,
             items=[{"key": "token.worker-0", "path": "token"}] + [{"key": f, "path": f} for f in tls])
    # No credentials at all (it gives up on the PS after 5 s instead of the job's 60).
    job_file = json.loads(k.json("get", "configmap", "auth-iso-config")["data"]["trainingjob.yaml"])
    job_file["spec"]["training"]["startupTimeoutSeconds"] = 5
    apply(k, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "auth-iso-no-creds-config"},
              "data": {"trainingjob.yaml": json.dumps(job_file)}})
    impostor(k, "auth-iso", "auth-iso-no-creds", tf_config, config_map="auth-iso-no-creds-config")
    step_before = (status(k, "auth-iso").get("progress") or {}).get("globalStep", 0)
    # The PS refuses the token: a configuration error, exit 2 with its reason.
    term = ended_pod(k, "auth-iso-impostor")["status"]["containerStatuses"][0]["state"]["terminated"]
    print(f"impostor: exit {term['exitCode']}: {term.get('message', '').strip()}")
    assert term["exitCode"] == 2, term
    assert "the token presented as worker/1 is not that task's token in this job" in term["message"], term
    assert metric(ps["status"]["podIP"], "kubetrain_rpc_auth_failures_total", 'reason="unauthenticated"') >= 1
    # Plaintext, no certificate: the TLS handshake never completes, so no call reaches the PS.
    term = ended_pod(k, "auth-iso-no-creds")["status"]["containerStatuses"][0]["state"]["terminated"]
    print(f"no credentials: exit {term['exitCode']}: {term.get('message', '').strip()}")
    assert term["exitCode"] != 0 and "gave up on connect to ps:0" in term["message"], term

    # The job was not disturbed (and the operator ignores pods it does not own): still
    # Running with both workers, still stepping.
    def stepping():
        st = status(k, "auth-iso")
        step = (st.get("progress") or {}).get("globalStep", 0)
        return st if st.get("state") == "Running" and step > step_before else None
    st = wait_for(k, "more steps", stepping, 60)
    assert st["replicaStatuses"]["Worker"]["active"] == 2, st
    k.run("delete", "tj", "auth-iso")


def test_a_deleted_secret_is_not_replaced_and_the_job_fails_when_a_task_must_start_again(cluster):
    """The running tasks keep their copy and the job runs on (AuthSecretMissing); a new Secret
    would hold a new key that the running PS would refuse, so none is made, and when worker 1's
    pod is deleted and must be created again, the job fails saying why."""
    k = cluster
    apply(k, job("lost-key", steps=10000000))
    wait_state(k, "lost-key", {"Running"})
    for name in ("lost-key-ps-0", "lost-key-worker-0", "lost-key-worker-1"):
        started_pod(k, "lost-key", name)
    k.run("delete", "secret", "lost-key-auth")

    def missing():
        st = status(k, "lost-key")
        return st if (condition(st, "AuthSecretMissing") or {}).get("status") == "True" else None
    st = wait_for(k, "AuthSecretMissing", missing, 60)
    assert st["state"] == "Running", st
    assert condition(st, "AuthSecretMissing")["reason"] == "AuthSecretLost", st
    assert "Secret lost-key-auth was deleted" in condition(st, "AuthSecretMissing")["message"], st
    assert get_or_none(k, "secret", "lost-key-auth") is None  # not replaced
    k.run("delete", "pod", "lost-key-worker-1", "--wait=false")
    st = wait_state(k, "lost-key", {"Failed"}, timeout=120)
    failed = condition(st, "Failed")
    assert failed["reason"] == "AuthSecretLost", st
    assert failed["message"] == (
        "TrainingJob lost-key has failed because Secret lost-key-auth was deleted while it ran, and pod "
        "lost-key-worker-1 cannot be started without it (a new key would lock it out of the running PS "
        "tasks); delete and re-create the TrainingJob to run it again."), failed
    assert "AuthSecretLost" in k.run("describe", "tj", "lost-key").stdout
    k.run("delete", "tj", "lost-key")
