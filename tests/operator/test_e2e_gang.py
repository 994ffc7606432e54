"""The operator e2e (see test_e2e.py), gang scheduling: PodGroups against the schedulers'
real CRDs (tests/operator/crds: scheduler-plugins and Volcano)."""
import json
import os

from conftest import ROOT
from e2e_helpers import apply, condition, get_or_none, job, pods, status, task_logs, wait_for, wait_state


CRDS = os.path.join(ROOT, "tests", "operator", "crds")
SP_CRD = os.path.join(CRDS, "scheduler-plugins", "scheduling.x-k8s.io_podgroups.yaml")
VOLCANO_CRD = os.path.join(CRDS, "volcano", "scheduling.volcano.sh_podgroups.yaml")


def install_crd(k, path, name):
    k.run("apply", "--server-side", "--field-manager=kubetrain-tests", "-f", path)
    k.run("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def gang_job(name, scheduler, policy, steps=50):
    obj = job(name, steps=steps, run_policy={"schedulingPolicy": policy})
    # Only the Worker template names the scheduler: PS pods get the job's.
    obj["spec"]["replicaSpecs"]["Worker"]["template"] = {"spec": {"schedulerName": scheduler}}
    return obj


def test_gang_job_waits_for_the_podgroup_crd_then_gets_a_podgroup_the_api_server_accepts(cluster):
    """scheduler-plugins: before its CRD is installed the job's pods wait (PodGroupFailing,
    PodGroupAPIMissing) and the operator runs on; once it is, at the next retry the PodGroup is
    created (stored with every field: the real schema prunes unknown ones), then the pods,
    labelled with it, and the job runs to success."""
    k = cluster
    assert k.run("get", "crd", "podgroups.scheduling.x-k8s.io", check=False).returncode != 0
    apply(k, gang_job("gang-sp", "scheduler-plugins-scheduler",
                      {"scheduleTimeoutSeconds": 60, "minResources": {"cpu": "2", "memory": "1Gi"}}))

    def failing():
        st = status(k, "gang-sp")
        return st if (condition(st, "PodGroupFailing") or {}).get("status") == "True" else None
    st = wait_for(k, "PodGroupFailing", failing, 60)
    failing = condition(st, "PodGroupFailing")
    assert failing["reason"] == "PodGroupAPIMissing", st
    assert "does not serve podgroups in scheduling.x-k8s.io/v1alpha1" in failing["message"], failing
    assert not pods(k, "gang-sp")
    assert "PodGroupAPIMissing" in k.run("describe", "tj", "gang-sp").stdout
    pid = int(open(os.path.join(k.state, "operator.pid")).read())
    os.kill(pid, 0)  # still running

    install_crd(k, SP_CRD, "podgroups.scheduling.x-k8s.io")
    pg = wait_for(k, "PodGroup gang-sp", lambda: get_or_none(k, "podgroups.scheduling.x-k8s.io", "gang-sp"), 90)
    uid = k.json("get", "tj", "gang-sp")["metadata"]["uid"]
    assert pg["spec"] == {"minMember": 3, "scheduleTimeoutSeconds": 60,
                          "minResources": {"cpu": "2", "memory": "1Gi"}}, pg["spec"]
    owner = pg["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("TrainingJob", "gang-sp", uid, True)
    st = wait_state(k, "gang-sp", {"Succeeded", "Failed"}, timeout=300)
    assert st["state"] == "Succeeded", json.dumps(condition(st, "Failed")) + task_logs(k, "gang-sp")
    assert condition(st, "PodGroupFailing")["status"] == "False", st
    assert condition(st, "PodGroupFailing")["reason"] == "PodGroupCreated", st
    got = pods(k, "gang-sp")
    assert len(got) == 3, [p["metadata"]["name"] for p in got]
    for p in got:
        assert p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang-sp", p["metadata"]
        assert p["spec"]["schedulerName"] == "scheduler-plugins-scheduler", p["metadata"]["name"]
        # The PodGroup was there before the pod.
        assert p["metadata"]["creationTimestamp"] >= pg["metadata"]["creationTimestamp"]
    events = k.json("get", "events", "--field-selector", "involvedObject.name=gang-sp")["items"]
    reasons = [e["reason"] for e in events]
    assert reasons.count("SuccessfulCreatePodGroup") == 1 and reasons.count("PodGroupAPIMissing") == 1, reasons
    k.run("delete", "tj", "gang-sp")
    wait_for(k, "PodGroup gang-sp deleted",
             lambda: k.run("get", "podgroups.scheduling.x-k8s.io", "gang-sp", check=False).returncode != 0, 30)


def test_volcano_gang_job_gets_its_podgroup_with_queue_and_priority(cluster):
    k = cluster
    install_crd(k, VOLCANO_CRD, "podgroups.scheduling.volcano.sh")
    k.run("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "kubetrain-e2e-high"}, "value": 1000}))
    obj = gang_job("gang-vc", "volcano",
                   {"minAvailable": 2, "queue": "research", "priorityClass": "kubetrain-e2e-high"})
    # Workers request resources (in the runtime container they customise): the PodGroup's
    # minResources is what its gang of minAvailable (the PS and one worker) requests.
    obj["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"] = [
        {"name": "kubetrain", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]
    apply(k, obj)
    pg = wait_for(k, "PodGroup gang-vc", lambda: get_or_none(k, "podgroups.scheduling.volcano.sh", "gang-vc"), 60)
    assert pg["spec"] == {"minMember": 2, "queue": "research", "priorityClassName": "kubetrain-e2e-high",
                          "minResources": {"cpu": "100m", "memory": "67108864"}}, pg
    assert pg["metadata"]["ownerReferences"][0]["uid"] == k.json("get", "tj", "gang-vc")["metadata"]["uid"]
    st = wait_state(k, "gang-vc", {"Succeeded", "Failed"}, timeout=300)
    assert st["state"] == "Succeeded", json.dumps(condition(st, "Failed")) + task_logs(k, "gang-vc")
    got = pods(k, "gang-vc")
    assert len(got) == 3
    for p in got:
        ann = p["metadata"].get("annotations", {})
        assert ann.get("scheduling.k8s.io/group-name") == "gang-vc", p["metadata"]
        assert ann.get("volcano.sh/task-spec") == p["metadata"]["labels"]["kubetrain.io/replica-type"]
        assert p["spec"]["schedulerName"] == "volcano"
        # The API server resolved the PriorityClass (Priority admission).
        assert p["spec"]["priorityClassName"] == "kubetrain-e2e-high" and p["spec"]["priority"] == 1000
        assert "scheduling.x-k8s.io/pod-group" not in p["metadata"]["labels"]
    k.run("delete", "tj", "gang-vc")
    wait_for(k, "PodGroup gang-vc deleted",
             lambda: k.run("get", "podgroups.scheduling.volcano.sh", "gang-vc", check=False).returncode != 0, 30)
    k.run("delete", "priorityclass", "kubetrain-e2e-high")


def test_a_gang_jobs_podgroup_follows_edits_and_comes_back_when_deleted(cluster):
    """While the job runs, its PodGroup is what its schedulingPolicy says: an edited policy is
    patched into it (the real CRD stores it), an edit of the PodGroup itself is put back, and a
    deleted PodGroup is created again from its watch event."""
    k = cluster
    install_crd(k, SP_CRD, "podgroups.scheduling.x-k8s.io")
    apply(k, gang_job("gang-edit", "scheduler-plugins-scheduler", {"minAvailable": 2}, steps=10000000))
    pg_of = lambda: get_or_none(k, "podgroups.scheduling.x-k8s.io", "gang-edit")  # noqa: E731
    assert wait_for(k, "PodGroup gang-edit", pg_of, 60)["spec"] == {"minMember": 2}
    wait_state(k, "gang-edit", {"Running"})
    k.run("patch", "tj", "gang-edit", "--type=merge", "-p",
          '{"spec":{"runPolicy":{"schedulingPolicy":{"minAvailable":3,"scheduleTimeoutSeconds":120}}}}')
    wait_for(k, "the edited policy in the PodGroup",
             lambda: (pg_of() or {}).get("spec") == {"minMember": 3, "scheduleTimeoutSeconds": 120}, 30)
    k.run("patch", "podgroups.scheduling.x-k8s.io", "gang-edit", "--type=merge", "-p", '{"spec":{"minMember":1}}')
    wait_for(k, "the PodGroup put back", lambda: (pg_of() or {}).get("spec", {}).get("minMember") == 3, 30)
    uid = pg_of()["metadata"]["uid"]
    k.run("delete", "podgroups.scheduling.x-k8s.io", "gang-edit")
    again = wait_for(k, "the PodGroup created again",
                     lambda: (lambda pg: pg if pg and pg["metadata"]["uid"] != uid else None)(pg_of()), 30)
    assert again["spec"] == {"minMember": 3, "scheduleTimeoutSeconds": 120}, again
    assert again["metadata"]["ownerReferences"][0]["uid"] == k.json("get", "tj", "gang-edit")["metadata"]["uid"]
    assert status(k, "gang-edit")["state"] == "Running"
    reasons = [e["reason"] for e in
               k.json("get", "events", "--field-selector", "involvedObject.name=gang-edit")["items"]]
    assert "SuccessfulUpdatePodGroup" in reasons and reasons.count("SuccessfulCreatePodGroup") == 1, reasons
    k.run("delete", "tj", "gang-edit")
