"""Helpers of the operator e2e tests (test_e2e*.py, test_networkpolicy.py): job manifests,
kubectl shorthands, waiting for a job's state or a pod's start, the job's credentials as
core/job_credentials.h computes them, and the runtime image's name."""
import base64
import glob
import hashlib
import hmac
import json
import os
import subprocess
import tempfile
import time

from conftest import ROOT


def job(name, *, steps=300, workers=2, ps=1, worker_policy="Never", run_policy=None, extra_training=None,
        mode="sync"):
    spec = {
        "replicaSpecs": {"PS": {"replicas": ps, "restartPolicy": "OnFailure"},
                         "Worker": {"replicas": workers, "restartPolicy": worker_policy}},
        "training": {"mode": mode, "model": {"type": "mlp", "hiddenUnits": [32]},
                     "optimizer": {"type": "adam", "learningRate": 0.002}, "batchSize": 32,
                     "steps": steps, "seed": 3, "startupTimeoutSeconds": 60},
    }
    if run_policy:
        spec["runPolicy"] = run_policy
    if extra_training:
        spec["training"].update(extra_training)
    return {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}


def apply(k, obj, ns="default"):
    return k.run("apply", "-n", ns, "-f", "-", input=json.dumps(obj))


def status(k, name, ns="default"):
    return k.json("get", "tj", name, "-n", ns).get("status", {})


def wait_state(k, name, states, timeout=180, ns="default"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = status(k, name, ns)
        if last.get("state") in states:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{ns}/{name} never reached {states}: {json.dumps(last)[:3000]}\n"
                         + operator_log(k)[-3000:])


def operator_log(k):
    try:
        return open(os.path.join(k.state, "logs", "operator.log")).read()
    except OSError:
        return ""


def pods(k, name, ns="default"):
    return k.json("get", "pods", "-n", ns, "-l", f"kubetrain.io/job-name={name}")["items"]


def condition(st, type_):
    for c in st.get("conditions", []):
        if c["type"] == type_:
            return c
    return None


def container_pid(pod):
    cid = pod["status"]["containerStatuses"][0].get("containerID", "")
    return int(cid.rsplit("//", 1)[1])


def started_pod(k, job_name, pod_name, timeout=60):
    """The pod once its container runs (a containerID): the job can be Running before every
    pod has started, e.g. while the node agent mounts an image for it."""
    deadline = time.time() + timeout
    while True:
        pod = next((p for p in pods(k, job_name) if p["metadata"]["name"] == pod_name), None)
        cs = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        if "running" in cs[0].get("state", {}) and cs[0].get("containerID"):
            return pod
        assert time.time() < deadline, f"{pod_name} did not start in {timeout}s: {pod and pod.get('status')}"
        time.sleep(0.2)


def task_token(job_key, task_type, index):
    """core/job_credentials.h's TaskToken, computed independently."""
    return hmac.new(job_key, f"kubetrain/v1/{task_type}/{index}".encode(), hashlib.sha256).hexdigest()


def auth_secret(k, name, job_uid):
    """The job's Secret {name}-auth, decoded, after checking its shape and that every token is
    the one its task's name and the job key give."""
    secret = k.json("get", "secret", f"{name}-auth")
    assert secret["type"] == "Opaque", secret["type"]
    assert secret["metadata"]["labels"] == {"kubetrain.io/job-name": name}, secret["metadata"]
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", job_uid, True), owner
    data = {key: base64.b64decode(v) for key, v in secret["data"].items()}
    assert len(data["job.key"]) == 64 and all(c in b"0123456789abcdef" for c in data["job.key"]), data["job.key"]
    for key, value in data.items():
        if key.startswith("token."):
            task_type, index = key[len("token."):].rsplit("-", 1)
            assert value.decode() == task_token(data["job.key"], task_type, int(index)), key
    return data


def check_certificate(data):
    """The task certificate is signed by the job's CA, for the name every task checks."""
    with tempfile.TemporaryDirectory() as d:
        for name in ("ca.crt", "tls.crt"):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data[name])
        ca, crt = os.path.join(d, "ca.crt"), os.path.join(d, "tls.crt")
        verify = subprocess.run(["openssl", "verify", "-CAfile", ca, "-purpose", "sslserver", crt],
                                capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        san = subprocess.run(["openssl", "x509", "-in", crt, "-noout", "-ext", "subjectAltName"],
                             capture_output=True, text=True, check=True).stdout
        assert "DNS:kubetrain-task" in san, san


def wait_for(k, what, fn, timeout):
    deadline = time.time() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.time() < deadline, f"{what} not within {timeout}s\n" + operator_log(k)[-3000:]
        time.sleep(0.5)


def task_logs(k, name):
    """The tail of each task's container log (the node agent's files), for failure messages."""
    out = ""
    for path in sorted(glob.glob(os.path.join(k.state, "node-agent", "logs", f"default_{name}-*.log"))):
        with open(path, errors="replace") as f:
            out += f"\n--- {os.path.basename(path)}\n" + f.read()[-1500:]
    return out


def get_or_none(k, *args):
    proc = k.run("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


RUNTIME_IMAGE = next(line.split("=", 1)[1].strip() for line in open(os.path.join(ROOT, "docker", "images.env"))
                     if line.startswith("KUBETRAIN_RUNTIME_IMAGE="))
