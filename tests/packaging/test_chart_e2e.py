"""The Helm chart end to end, the way a newcomer follows the README: a test cluster
without an operator process (KUBETRAIN_OPERATOR=chart tests/cluster/cluster-up.sh:
etcd + kube-apiserver + kube-controller-manager + the node agent, which gives pods
service-account tokens), then ONLY helm and kubectl: `helm install --wait` brings
the CRD and the operator, which runs as the chart's Deployment pod
(`kubetrain-operator --in-cluster`, resolved from bin/ by the node agent), and a
TrainingJob applied with kubectl trains to Succeeded.

By default the chart is installed with the images `make images` built (names and tags
from docker/images.env), and the node agent runs the operator pod from the operator
image and every PS/worker pod from the runtime image (as uid 65532, read-only root, only
the chart's ServiceAccount token to reach the API server): the path a user takes.
KUBETRAIN_E2E_IMAGES=0 is the fast development mode: the chart's default tags (no such
local images) and host binaries from bin/ (node agent --host-binaries).

Run: python3 -m pytest -q tests/packaging/test_chart_e2e.py   (as root; needs `make build`,
     and `make images` unless KUBETRAIN_E2E_IMAGES=0)
"""
import glob
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
import image_rootfs  # noqa: E402
import testlib  # noqa: E402

RELEASE = "kubetrain"
JOB = "chart-e2e"

WITH_IMAGES = os.environ.get("KUBETRAIN_E2E_IMAGES", "1") != "0"
IMAGES = image_rootfs.images_env()
OPERATOR_IMAGE, RUNTIME_IMAGE = IMAGES["KUBETRAIN_OPERATOR_IMAGE"], IMAGES["KUBETRAIN_RUNTIME_IMAGE"]


def _image_values():
    """helm --set flags naming the local images (repository:tag from docker/images.env)."""
    out = []
    for key, image in (("image", OPERATOR_IMAGE), ("runtimeImage", RUNTIME_IMAGE)):
        repo, _, tag = image.rpartition(":")
        out += ["--set", f"{key}.repository={repo}", "--set", f"{key}.tag={tag}",
                "--set", f"{key}.pullPolicy=Never"]
    return out


@pytest.fixture(scope="module")
def chart_cluster(pk, helm_binary):
    testlib.require_root("the Helm chart e2e")
    for b in ("kubetrain-operator", "kubetrain-ps", "kubetrain-worker"):
        if not os.access(os.path.join(pk.BIN, b), os.X_OK):
            pytest.fail(f"{pk.BIN}/{b} missing: run `make build` first")
    if WITH_IMAGES:
        testlib.require_images(pytest.fail)
    t0 = time.time()
    with testlib.running_cluster("kubetrain-chart-e2e.", pytest.fail, KUBETRAIN_OPERATOR="chart",
                                 KUBETRAIN_HOST_BINARIES="0" if WITH_IMAGES else "1") as (state, env, ex):
        for sub in ("config", "cache", "data"):  # private helm dirs, never the user's
            env[f"HELM_{sub.upper()}_HOME"] = os.path.join(state, "helm", sub)
        k = pk.Kubectl(os.path.join(os.path.dirname(helm_binary), "kubectl"), env)
        k.state, k.helm, k.up_seconds = state, helm_binary, time.time() - t0
        k.apiserver_url = ex["KUBETRAIN_APISERVER_URL"]
        yield k


def _logs(k):
    out = []
    for pattern in ("logs/node-agent.log", "logs/kube-controller-manager.log",
                    "node-agent/logs/kubetrain-system_*_operator.log"):
        for path in sorted(glob.glob(os.path.join(k.state, pattern))):
            with open(path, errors="replace") as f:
                out.append(f"--- {os.path.relpath(path, k.state)} (tail)\n{f.read()[-3000:]}")
    return "\n".join(out)


def _helm(k, *args, timeout=300):
    proc = subprocess.run([k.helm, *args], capture_output=True, text=True, env=k.env, timeout=timeout)
    assert proc.returncode == 0, (f"helm {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}\n{_logs(k)}")
    return proc


def test_chart_operator_runs_a_job_to_success(chart_cluster, pk):
    k = chart_cluster
    # cluster-up started no operator process and applied no CRD: the chart brings both.
    assert not os.path.exists(os.path.join(k.state, "operator.pid"))
    assert k.run("get", "crd", pk.CRD_NAME, check=False).returncode != 0

    t0 = time.time()
    # metrics.port/health.port away from the chart's 8080/8081 defaults, so those values are
    # exercised too (each pod has its own network namespace, tests/cluster/pod_network.py, so
    # no port of the host or of a parallel run can clash with them).
    _helm(k, "install", RELEASE, pk.CHART, "-n", pk.NAMESPACE, "--create-namespace", "--wait", "--timeout", "3m",
          "--set", f"metrics.port={testlib.free_port()}", "--set", f"health.port={testlib.free_port()}",
          *(_image_values() if WITH_IMAGES else []))
    install_seconds = time.time() - t0

    # The operator is the chart's Deployment pod: Deployment -> ReplicaSet -> Pod (controller-manager).
    deploy = k.json("get", "deployment", RELEASE, "-n", pk.NAMESPACE)
    assert deploy["status"].get("availableReplicas") == 1, deploy["status"]
    pods = k.json("get", "pods", "-n", pk.NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod = pods[0]
    assert pod["status"]["phase"] == "Running", pod["status"]
    (rs_ref,) = pod["metadata"]["ownerReferences"]
    assert rs_ref["kind"] == "ReplicaSet"
    rs = k.json("get", "replicaset", rs_ref["name"], "-n", pk.NAMESPACE)
    (d_ref,) = rs["metadata"]["ownerReferences"]
    assert d_ref["kind"] == "Deployment" and d_ref["uid"] == deploy["metadata"]["uid"]
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["kubetrain-operator"] and "--in-cluster" in c["args"]
    assert pod["spec"]["serviceAccountName"] == RELEASE
    agent_log = open(os.path.join(k.state, "logs", "node-agent.log")).read()
    if WITH_IMAGES:  # the operator pod ran from its image, not from bin/
        assert c["image"] == OPERATOR_IMAGE, c["image"]
        assert "container operator pid" in agent_log and f"image {OPERATOR_IMAGE}:" in agent_log, agent_log[-3000:]

    # It authenticated with its service-account token and took the Lease in the release namespace.
    lease = pk.wait_for(lambda: (k.run("get", "lease", "kubetrain-operator", "-n", pk.NAMESPACE, "-o", "json",
                                       check=False).stdout or None), 60, "the operator's Lease")
    assert json.loads(lease)["spec"].get("holderIdentity"), lease
    (oplog,) = glob.glob(os.path.join(k.state, "node-agent", "logs",
                                      f"{pk.NAMESPACE}_{pod['metadata']['name']}_operator.log"))
    text = open(oplog).read()
    # --in-cluster: KUBERNETES_SERVICE_HOST/PORT and the mounted token led it to the test API server,
    # from its own network namespace through the `kubernetes` Service address (the node agent relays
    # 10.0.0.1:443 to the API server, as kube-proxy would).
    assert "server https://10.0.0.1:443," in text and "is the leader" in text, text[-3000:]
    assert "is the leader" in text and k.apiserver_url.startswith("https://127.0.0.1:")

    # A TrainingJob with kubectl only.
    job = pk.small_job(JOB)
    t1 = time.time()
    k.run("apply", "-n", "default", "-f", "-", input=json.dumps(job))
    deadline, st = time.time() + 240, {}
    while time.time() < deadline:
        st = k.json("get", "tj", JOB, "-n", "default").get("status", {})
        if st.get("state") in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    assert st.get("state") == "Succeeded", f"status: {json.dumps(st)[:2000]}\n{_logs(k)}"
    job_seconds = time.time() - t1
    assert st["progress"]["globalStep"] == 100, st["progress"]
    if WITH_IMAGES:  # every PS/worker pod of the job ran from the runtime image
        agent_log = open(os.path.join(k.state, "logs", "node-agent.log")).read()
        started = [l for l in agent_log.splitlines() if f"started default/{JOB}-" in l]
        assert started and all(f"image {RUNTIME_IMAGE}:" in l for l in started), "\n".join(started) or agent_log[-3000:]
    events = k.json("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={JOB}")
    assert events["items"], "no Events for the job"
    # Still the same single operator pod, never restarted, and no RBAC refusals.
    pods = k.json("get", "pods", "-n", pk.NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    assert [p["metadata"]["uid"] for p in pods] == [pod["metadata"]["uid"]]
    assert pods[0]["status"]["containerStatuses"][0]["restartCount"] == 0
    text = open(oplog).read()
    assert "403" not in text and "orbidden" not in text, text[-3000:]
    print(f"\ncluster-up {k.up_seconds:.1f}s, helm install --wait {install_seconds:.1f}s, "
          f"job to Succeeded {job_seconds:.1f}s")
