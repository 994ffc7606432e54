"""Fixtures for the operator tests: a real, minimal Kubernetes control plane
(etcd + kube-apiserver on 127.0.0.1) started by tests/cluster/up.sh into a
private state dir, and a kubectl wrapper bound to its kubeconfig."""
import json
import os
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLUSTER = os.path.join(ROOT, "tests", "cluster")
CRD_FILE = os.path.join(ROOT, "deploy", "crd", "kubetrain.io_trainingjobs.yaml")
CRD_NAME = "trainingjobs.kubetrain.io"
BIN = os.path.join(ROOT, "bin")


def _cache_bin():
    cache = os.environ.get("KUBETRAIN_CACHE", os.path.expanduser("~/.cache/kubetrain"))
    return os.path.join(cache, "bin")


def _have_go():
    """A Go >= 1.21 as build.sh finds it (tests/cluster/go-env.sh)."""
    return subprocess.run([os.path.join(CLUSTER, "go-env.sh"), "--have-go"]).returncode == 0


class Kubectl:
    """Runs kubectl against the test cluster; never touches the user's kubeconfig."""

    def __init__(self, binary, env):
        self.binary = binary
        self.env = env

    def run(self, *args, input=None, check=True, timeout=60):
        proc = subprocess.run([self.binary, *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def json(self, *args):
        return json.loads(self.run(*args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def kube_cluster():
    """Starts etcd + kube-apiserver (tests/cluster/up.sh) in a fresh state dir for
    the module and stops them afterwards (down.sh --purge). Yields a Kubectl."""
    bin_dir = _cache_bin()
    have_bins = all(os.access(os.path.join(bin_dir, b), os.X_OK)
                    for b in ("etcd", "kube-apiserver", "kubectl"))
    if not have_bins and not _have_go():
        pytest.fail(f"no control-plane binaries in {bin_dir} and no Go toolchain to build them "
                    "(make deps installs one; tests/cluster/build.sh)")
    state = tempfile.mkdtemp(prefix="kubetrain-optest.")
    env = dict(os.environ, KUBETRAIN_STATE=state)
    env.pop("KUBECONFIG", None)
    proc = subprocess.run([os.path.join(CLUSTER, "up.sh")], capture_output=True, text=True,
                          env=env, timeout=3600)
    if proc.returncode != 0:
        subprocess.run([os.path.join(CLUSTER, "down.sh"), "--purge", "--quiet"], env=env)
        pytest.fail(f"tests/cluster/up.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    # up.sh prints `export VAR=value` lines (values without spaces).
    for line in proc.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            env[key] = value
    assert "KUBECONFIG" in env, proc.stdout
    kubectl = os.path.join(env.get("KUBETRAIN_BIN", bin_dir), "kubectl")
    try:
        yield Kubectl(kubectl, env)
    finally:
        subprocess.run([os.path.join(CLUSTER, "down.sh"), "--purge", "--quiet"], env=env,
                       timeout=120)


@pytest.fixture(scope="module")
def crd_installed(kube_cluster):
    """The TrainingJob CRD, applied and Established."""
    k = kube_cluster
    k.run("apply", "--server-side", "--field-manager=kubetrain-tests", "-f", CRD_FILE)
    k.run("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    # kubectl's discovery cache can lag a just-Established CRD for a moment.
    for _ in range(30):
        if k.run("get", "trainingjobs", "-A", check=False).returncode == 0:
            break
        time.sleep(1)
    return k


@pytest.fixture(scope="module")
def cluster():
    """A whole test cluster for the module (tests/cluster/cluster-up.sh: etcd, kube-apiserver,
    the CRD, the operator and the node agent), stopped afterwards. Yields a Kubectl with .state."""
    for b in ("kubetrain-operator", "kubetrain-ps", "kubetrain-worker"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            pytest.fail(f"{BIN}/{b} missing: run make build")
    state = tempfile.mkdtemp(prefix="kubetrain-e2e.")
    env = dict(os.environ, KUBETRAIN_STATE=state)
    env.pop("KUBECONFIG", None)
    proc = subprocess.run([os.path.join(CLUSTER, "cluster-up.sh")], capture_output=True, text=True,
                          env=env, timeout=3600)
    if proc.returncode != 0:
        subprocess.run([os.path.join(CLUSTER, "cluster-down.sh"), "--purge"], env=env)
        pytest.fail(f"cluster-up.sh failed:\n{proc.stderr[-4000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("export KUBECONFIG="):
            env["KUBECONFIG"] = line.split("=", 1)[1].strip('"')
    k = Kubectl(os.path.join(_cache_bin(), "kubectl"), env)
    k.state = state
    try:
        yield k
    finally:
        subprocess.run([os.path.join(CLUSTER, "cluster-down.sh"), "--purge"], env=env, timeout=120)
