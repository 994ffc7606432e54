"""An unmodified TensorFlow 2 program under a TrainingJob (`make tf-compat-test`, opt-in: it
needs TensorFlow from PyPI in a cached virtualenv, tests/tensorflow/setup-venv.sh).

examples/tensorflow/ps-strategy.yaml runs examples/tensorflow/train.py — a plain
ParameterServerStrategy program reading only TF_CONFIG — as Chief + 2 PS + 2 workers on the test
cluster (real kube-apiserver + etcd, the operator, the node agent with a network namespace per
pod: every TensorFlow server binds 0.0.0.0:2222). The job must reach Succeeded from the chief's
exit, the model's variables must live on both PS tasks, the chief must report a test accuracy, and
cleanPodPolicy must stop the PS and worker tasks, which serve until stopped."""
import ast
import json
import os
import re
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import testlib  # noqa: E402
from testlib import ROOT, Kubectl  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "tensorflow")
JOB = "tf-ps-strategy"


def venv_python():
    p = subprocess.run([os.path.join(HERE, "setup-venv.sh")], capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, f"setup-venv.sh failed:\n{p.stderr[-3000:]}"
    return p.stdout.strip()


@pytest.fixture(scope="module")
def cluster():
    python = venv_python()
    with testlib.running_cluster("kubetrain-tf.", pytest.fail) as (state, env, _):
        k = Kubectl(os.path.join(testlib.cache_bin(), "kubectl"), env)
        k.state, k.python = state, python
        yield k


def pod_log(k, pod):
    try:
        return open(os.path.join(k.state, "node-agent", "logs", f"default_{pod}_tensorflow.log")).read()
    except OSError:
        return ""


def test_unmodified_tensorflow_program_succeeds(cluster):
    k = cluster
    k.run("create", "configmap", "tf-ps-strategy-program", "--from-file", os.path.join(EXAMPLE, "train.py"))
    # The example as written, but for the interpreter: the test node runs it as a host process
    # (the example's image is not in local storage), so it names the cached venv's python.
    manifest = open(os.path.join(EXAMPLE, "ps-strategy.yaml")).read()
    assert "command: [python3, /program/train.py]" in manifest
    manifest = manifest.replace("command: [python3,", f"command: [{k.python},")
    k.run("apply", "-f", "-", input=manifest)

    deadline, st = time.time() + 900, {}
    while time.time() < deadline:
        st = k.json("get", "tj", JOB).get("status", {})
        if st.get("state") in ("Succeeded", "Failed"):
            break
        time.sleep(2)
    chief = pod_log(k, f"{JOB}-chief-0")
    assert st.get("state") == "Succeeded", (json.dumps(st)[:2000], chief[-4000:], pod_log(k, f"{JOB}-ps-0")[-2000:])

    # TF_CONFIG named every task; the variables were partitioned over both PS tasks.
    m = re.search(r"chief: cluster (\{.*\})", chief)
    assert m, chief[-3000:]
    cluster_spec = ast.literal_eval(m.group(1))  # the dict TensorFlow printed
    assert sorted(cluster_spec) == ["chief", "ps", "worker"], cluster_spec
    assert len(cluster_spec["ps"]) == 2 and len(cluster_spec["worker"]) == 2, cluster_spec
    assert all(a.endswith(":2222") for addrs in cluster_spec.values() for a in addrs), cluster_spec
    devices = re.search(r"chief: variables on (.*)", chief).group(1)
    assert "/job:ps/replica:0/task:0" in devices and "/job:ps/replica:0/task:1" in devices, devices
    acc = float(re.search(r"chief: test accuracy ([0-9.]+)", chief).group(1))
    assert acc >= 0.75, chief[-3000:]  # 600 steps of a 784-128-10 MLP; measured ~0.83
    for task in ("ps-0", "ps-1", "worker-0", "worker-1"):
        assert "serving" in pod_log(k, f"{JOB}-{task}"), task

    # cleanPodPolicy Running: the PS and worker tasks (still serving) are deleted after the grace.
    deadline = time.time() + 120
    while True:
        left = [p["metadata"]["name"] for p in
                k.json("get", "pods", "-l", f"kubetrain.io/job-name={JOB}")["items"]
                if p["status"].get("phase") in ("Pending", "Running")]
        if not left:
            break
        assert time.time() < deadline, f"still running after the job succeeded: {left}"
        time.sleep(1)
    print(f"\ntf-compat: Succeeded, test accuracy {acc:.4f}, variables on {devices}")
