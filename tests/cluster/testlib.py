"""Test plumbing shared by every suite that starts the test cluster or a server:
free ports, the cache dir of the control-plane binaries, a kubectl wrapper, and
starting/stopping tests/cluster/up.sh (etcd + kube-apiserver) or cluster-up.sh
(the whole test cluster: + the CRD, the operator and the node agent).

The suites import it the way they import image_rootfs (no package):
    sys.path.insert(0, <repo>/tests/cluster); import testlib
"""
import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLUSTER = os.path.join(ROOT, "tests", "cluster")
BIN = os.path.join(ROOT, "bin")
CRD_FILE = os.path.join(ROOT, "deploy", "crd", "kubetrain.io_trainingjobs.yaml")
CRD_NAME = "trainingjobs.kubetrain.io"
# The down script of each up script.
DOWN = {"up.sh": "down.sh", "cluster-up.sh": "cluster-down.sh"}


def free_port():
    """A TCP port free on 127.0.0.1 right now (the caller binds it soon after)."""
    return free_ports(1)[0]


def free_ports(n):
    """n distinct TCP ports free on 127.0.0.1 right now (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cache_dir():
    return os.environ.get("KUBETRAIN_CACHE", os.path.expanduser("~/.cache/kubetrain"))


def cache_bin():
    """Where tests/cluster/build.sh puts etcd, kube-apiserver and kubectl."""
    return os.path.join(cache_dir(), "bin")


def have_go():
    """A Go >= 1.21 as build.sh finds it (tests/cluster/go-env.sh)."""
    return subprocess.run([os.path.join(CLUSTER, "go-env.sh"), "--have-go"]).returncode == 0


class Tool:
    """Runs a command-line client (kubectl, helm) with the test cluster's env; a failed call
    (check=True) raises AssertionError with its output (the last `tail` characters)."""
    name, timeout, tail = "tool", 60, None

    def __init__(self, binary, env):
        self.binary = binary
        self.env = env

    def run(self, *args, input=None, check=True, timeout=None):
        proc = subprocess.run([self.binary, *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=timeout or self.timeout)
        if check and proc.returncode != 0:
            cut = -self.tail if self.tail else None
            raise AssertionError(
                f"{self.name} {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout[cut:]}\nstderr:\n{proc.stderr[cut:]}")
        return proc


class Kubectl(Tool):
    """Runs kubectl against the test cluster; never touches the user's kubeconfig."""
    name = "kubectl"

    def json(self, *args):
        return json.loads(self.run(*args, "-o", "json").stdout)


def wait_for(fn, timeout, what, interval=0.5):
    """fn()'s first truthy value within timeout seconds, else AssertionError naming what."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def wait_established(k, crd, timeout=60):
    """Waits until CRD `crd` is Established and its kind is in kubectl's discovery. Polls
    the condition itself: `kubectl wait --for=condition=Established` fails at once, rather
    than waiting, when it reads the CRD before the API server has written any condition."""
    def established():
        proc = k.run("get", f"crd/{crd}", "-o",
                     "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                     check=False)
        return proc.returncode == 0 and proc.stdout.strip() == "True"
    wait_for(established, timeout, f"crd/{crd} Established")
    kind = crd.split(".", 1)[0]
    wait_for(lambda: k.run("get", kind, "-A", check=False).returncode == 0, 30,
             f"{kind} in discovery")


def e2e_images():
    """Image mode (KUBETRAIN_E2E_IMAGES=1, the default of `make test`): pods run from the images
    `make images` built, never silently from host binaries. KUBETRAIN_E2E_IMAGES=0 (or
    KUBETRAIN_HOST_BINARIES=1) is the fast development mode with host binaries."""
    return (os.environ.get("KUBETRAIN_E2E_IMAGES", "1") != "0"
            and os.environ.get("KUBETRAIN_HOST_BINARIES", "0") != "1")


def require_images(fail):
    """In image mode, fail(message) unless both images are in buildah's local storage: the node
    agent would otherwise run their pods from host binaries without a word."""
    import image_rootfs
    env = image_rootfs.images_env()
    missing = [env[k] for k in ("KUBETRAIN_OPERATOR_IMAGE", "KUBETRAIN_RUNTIME_IMAGE")
               if not image_rootfs.image_exists(env[k])]
    if missing:
        fail(f"image mode (KUBETRAIN_E2E_IMAGES=1, the default): {', '.join(missing)} not in buildah's "
             "local storage: run `make images` first (or KUBETRAIN_E2E_IMAGES=0 for the host-binary "
             "fast mode)")


def require_root(what):
    """The node agent needs root (mount and network namespaces); CI runs as root. Not a skip:
    the image and network-namespace e2e must not vanish from `make test` unnoticed."""
    if os.geteuid() != 0:
        import pytest
        pytest.fail(f"{what} needs root (the test node agent makes mount and network namespaces): "
                    "run the tests as root, as CI does (e.g. sudo make test)")


def exports(stdout):
    """The `export VAR=value` lines up.sh / cluster-up.sh print, as a dict (quotes stripped;
    the $PATH in cluster-up.sh's PATH line replaced by this process's PATH)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            out[key] = value.strip('"').replace("$PATH", os.environ.get("PATH", ""))
    return out


class ClusterUpFailed(Exception):
    pass


def cluster_env(state, **extra):
    """os.environ for a cluster in state: KUBETRAIN_STATE set, the user's KUBECONFIG never used."""
    env = dict(os.environ, KUBETRAIN_STATE=state, **extra)
    env.pop("KUBECONFIG", None)
    return env


def cluster_down(env, script="cluster-up.sh", *args, timeout=120):
    """Stops what `script` started in env's state dir (args: e.g. --purge, --quiet)."""
    subprocess.run([os.path.join(CLUSTER, DOWN[script]), *args], env=env, timeout=timeout)


def cluster_up(prefix, script="cluster-up.sh", timeout=3600, down_args=("--purge",), **extra_env):
    """Runs tests/cluster/<script> (up.sh or cluster-up.sh) in a fresh state dir.
    Returns (state, env, exports): env is cluster_env() plus extra_env; exports holds the
    script's `export` lines (the caller picks what it needs, e.g. KUBECONFIG). On failure
    it stops what started (down script with down_args) and raises ClusterUpFailed."""
    state = tempfile.mkdtemp(prefix=prefix)
    env = cluster_env(state, **extra_env)
    proc = subprocess.run([os.path.join(CLUSTER, script)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if proc.returncode != 0:
        cluster_down(env, script, *down_args)
        raise ClusterUpFailed(f"tests/cluster/{script} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    ex = exports(proc.stdout)
    if "KUBECONFIG" not in ex:
        raise ClusterUpFailed(f"tests/cluster/{script} printed no KUBECONFIG:\n{proc.stdout}")
    return state, env, ex


@contextlib.contextmanager
def running_cluster(prefix, fail, script="cluster-up.sh", down_args=("--purge",), **extra_env):
    """cluster_up() for a `with` block; yields (state, env with KUBECONFIG, exports) and stops
    the cluster afterwards. fail(message) reports a failed start (pytest.fail, sys.exit)."""
    try:
        state, env, ex = cluster_up(prefix, script, down_args=down_args, **extra_env)
    except ClusterUpFailed as e:
        fail(str(e))
        raise
    env["KUBECONFIG"] = ex["KUBECONFIG"]
    try:
        yield state, env, ex
    finally:
        cluster_down(env, script, *down_args)


# --- The operator's per-job work, as the API server counts it -------------------------------
# One filter for every suite that counts the operator's requests and objects
# (tests/operator/test_api_budget.py, tests/scale/run_scale.py): which kinds the
# operator creates for a job, and which of the API server's requests
# (apiserver_request_total, as kube_api.request_counts() reads it) are its work.

# Created once per task (a pod and a headless Service) and once per job.
PER_TASK_KINDS = ("pods", "services")
PER_JOB_KINDS = ("configmaps", "secrets", "networkpolicies")
OPERATOR_KINDS = PER_TASK_KINDS + PER_JOB_KINDS
# Resources whose requests are the operator's (less the kubelet's share on pods below).
OPERATOR_RESOURCES = frozenset(OPERATOR_KINDS + ("events", "podgroups"))


def expected_creates(jobs, tasks_per_job):
    """{kind: objects} the operator creates for `jobs` jobs of `tasks_per_job` tasks each."""
    return {**{k: jobs * tasks_per_job for k in PER_TASK_KINDS}, **{k: jobs for k in PER_JOB_KINDS}}


def operator_objects(jobs, tasks_per_job):
    """How many objects the operator creates for those jobs (all kinds)."""
    return sum(expected_creates(jobs, tasks_per_job).values())


def operator_requests(counts):
    """The operator's share of {(verb, resource, subresource): n} (kube_api.request_counts):
    every request on the kinds it owns and on Events, its status writes and watches of
    TrainingJobs. Left out: what a kubelet (kwok, or a test playing one) sends on pods
    (status, binding, PATCH/PUT/GET: the operator only creates and deletes pods), and the
    callers' own TrainingJob creates, lists and deletes."""
    out = {}
    for (verb, resource, sub), n in counts.items():
        if resource in OPERATOR_RESOURCES:
            if resource == "pods" and (sub in ("status", "binding") or verb in ("PATCH", "PUT", "GET")):
                continue  # the kubelet's
            out[(verb, resource, sub)] = n
        elif resource == "trainingjobs" and ((verb == "PUT" and sub == "status") or verb == "WATCH"):
            out[(verb, resource, sub)] = n
    return out
