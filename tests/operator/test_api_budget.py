"""What the operator costs the API server, counted by the API server itself
(apiserver_request_total on its /metrics) over the whole lifecycle of 20 jobs
(1 PS + 4 workers each) against a real kube-apiserver + etcd: create, every
pod Running, idle, every pod Succeeded, the jobs deleted and their objects
cleaned up. The test plays the kubelet (PATCH pods/status); it never lists
pods, Services or ConfigMaps, so every such request on the API server is the
operator's.

Asserts: at most 3 requests per object the operator created (pods, Services,
ConfigMaps, and per job a Secret and a NetworkPolicy), no duplicate creates, nothing but watches while the jobs idle,
and the operator's own request counter agrees with the API server's."""
import os
import re
import subprocess
import tempfile
import time

import pytest

from conftest import ROOT
from testlib import expected_creates, free_port, operator_objects, operator_requests, OPERATOR_KINDS
from kube_api import KubeApi, delta, request_counts

BIN = os.path.join(ROOT, "bin")
NS = "budget"
JOBS = 20
WORKERS = 4
PER_OBJECT_BUDGET = 3.0

def job(name):
    return {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicaSpecs": {"PS": {"replicas": 1, "restartPolicy": "OnFailure"},
                                      "Worker": {"replicas": WORKERS, "restartPolicy": "Never"}},
                     "training": {"model": {"type": "softmax"}, "steps": 10}}}


@pytest.fixture(scope="module")
def setup(crd_installed):
    k = crd_installed
    k.run("create", "namespace", NS)
    api = KubeApi(k.env["KUBECONFIG"])
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="operator.", suffix=".log", delete=False)
    proc = subprocess.Popen([os.path.join(BIN, "kubetrain-operator"), "--kubeconfig", k.env["KUBECONFIG"],
                             f"--metrics_address=127.0.0.1:{port}", "--health_address=",
                             f"--namespace={NS}"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline and "cache synced" not in open(log.name).read():
        time.sleep(0.1)
    assert "cache synced" in open(log.name).read(), open(log.name).read()
    try:
        yield k, api, port, log.name
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def operator_metrics(port):
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def gauge(text, name, labels=""):
    m = re.search(rf"^{name}{{?{re.escape(labels)}}}? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def wait_cache(port, want, timeout=120):
    """Until the operator's cache holds want[resource] objects of each resource."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = operator_metrics(port)
        if all(gauge(text, "kubetrain_operator_cache_objects", f'resource="{r}"') == n for r, n in want.items()):
            return
        time.sleep(0.2)
    raise AssertionError(f"cache never reached {want}")


def wait_states(api, state, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        items = api.get(f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs")["items"]
        states = [j.get("status", {}).get("state") for j in items]
        if len(items) == JOBS and all(s == state for s in states):
            return
        time.sleep(0.3)
    raise AssertionError(f"jobs never all {state}: {states}")


def pod_names():
    for j in range(JOBS):
        yield f"b{j}-ps-0"
        for w in range(WORKERS):
            yield f"b{j}-worker-{w}"


def test_request_budget_per_object_over_a_20_job_lifecycle(setup):
    k, api, port, log = setup
    before = request_counts(api.metrics())
    for j in range(JOBS):
        api.request("POST", f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs", job(f"b{j}"))
    wait_cache(port, expected_creates(JOBS, 1 + WORKERS))
    for name in pod_names():
        api.merge_patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": {"phase": "Running"}})
    wait_states(api, "Running")

    # Idle: running jobs re-check their progress every few seconds, but with
    # nothing changed that costs the API server nothing (watches aside).
    time.sleep(3)  # a coalesced status write (<= 1 s) and Events in flight land first
    idle_before = request_counts(api.metrics())
    time.sleep(12)
    idle = operator_requests(delta(request_counts(api.metrics()), idle_before))
    assert not {key: n for key, n in idle.items() if key[0] != "WATCH"}, idle

    for name in pod_names():
        api.merge_patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "kubetrain", "restartCount": 0, "ready": False,
                                   "image": "kubetrain-runtime:latest", "imageID": "",
                                   "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})
    wait_states(api, "Succeeded")
    for j in range(JOBS):
        api.request("DELETE", f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs/b{j}")
    wait_cache(port, {r: 0 for r in OPERATOR_KINDS})
    time.sleep(1)
    used = operator_requests(delta(request_counts(api.metrics()), before))

    objects = operator_objects(JOBS, 1 + WORKERS)  # pods, Services; a ConfigMap, Secret, NetworkPolicy per job
    creates = {r: used.get(("POST", r, ""), 0) for r in OPERATOR_KINDS}
    assert creates == expected_creates(JOBS, 1 + WORKERS), used  # each once
    total = sum(used.values())
    per_object = total / objects
    by_verb = {}
    for (verb, resource, sub), n in sorted(used.items()):
        by_verb[f"{verb} {resource}{'/' + sub if sub else ''}"] = int(n)
    print(f"operator requests over the lifecycle of {JOBS} jobs: {int(total)} for {objects} objects "
          f"= {per_object:.2f} per object; {by_verb}")
    assert not any(v == "LIST" and n > 1 for (v, r, s), n in used.items()), used  # one list per kind
    assert per_object <= PER_OBJECT_BUDGET, by_verb

    # The operator's own count of its writes agrees with the API server's
    # (lists and watches are left out: it also lists trainingjobs once, which
    # this tally leaves to the test; Events are sent in the background).
    text = operator_metrics(port)
    own = sum(float(v) for labels, v in re.findall(
        r'^kubetrain_operator_api_requests_total\{([^}]*)\} ([0-9.e+]+)$', text, re.M)
        if not any(f'{k}' in labels for k in ('verb="watch"', 'verb="list"', 'resource="events"')))
    mine = sum(n for (v, r, s), n in used.items() if v not in ("WATCH", "LIST") and r != "events")
    assert own == mine, (own, mine, text)
