"""The operator's per-job NetworkPolicy, enforced and shown to work: a real kube-apiserver,
the operator, and the test node agent, which loads each pod's ingress rules into the pod's
network namespace with nftables (tests/cluster/netpolicy.py; the rules themselves are unit
tested in tests/cluster/test_netpolicy.py).

The policy (operator/desired_auth.cc BuildNetworkPolicy) selects the job's pods and admits
(1) the job's own pods on any port and (2) anyone on the metrics port 9090 (Prometheus, the
operator's progress reads). Probe pods (python3 on the host, in their own network namespace)
try TCP connects to the job's PS and exit 0 only if every connect succeeds.

Run (as root, with nft): python3 -m pytest -q tests/operator/test_networkpolicy.py
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import CLUSTER
from e2e_helpers import RUNTIME_IMAGE, apply, job, started_pod, status, wait_for, wait_state

sys.path.insert(0, CLUSTER)
import testlib  # noqa: E402

JOB = "np"
STRAY_NS = "np-stray"
PROBE = """
import socket, sys, urllib.request
ok = True
for target in sys.argv[1:]:
    if target.startswith("http://"):
        try:
            body = urllib.request.urlopen(target, timeout=3).read().decode()
            print(target, "HTTP 200", "kubetrain metrics" if "kubetrain_" in body else "no kubetrain metrics")
        except Exception as e:
            print(target, "failed:", type(e).__name__, e); ok = False
        continue
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close(); print(target, "open")
    except socket.timeout:
        print(target, "timed out"); ok = False
    except OSError as e:
        print(target, type(e).__name__, e); ok = False
sys.exit(0 if ok else 1)
"""
SERVE = ("import socket\ns=socket.socket(); s.bind(('0.0.0.0',2222)); s.listen(8)\n"
         "while True: s.accept()[0].close()\n")


@pytest.fixture(scope="module", autouse=True)
def enforcement_prerequisites():
    """CI runs as root with nftables: without them nothing would enforce the policy, so fail."""
    if os.geteuid() != 0:
        pytest.fail("NetworkPolicy e2e needs root: the node agent makes a network namespace per pod and "
                    "loads nftables rules into it")
    if not shutil.which("nft"):
        pytest.fail("NetworkPolicy e2e needs nft (apt-get install nftables; `make deps` installs it): "
                    "without it the node agent enforces no NetworkPolicy")


@pytest.fixture(scope="module")
def ps(cluster):
    """A running job (1 PS, 2 workers, training for long); yields its PS pod once the PS listens on
    2222 and 9090 (the node, here the test process, is always admitted, as in Kubernetes)."""
    k = cluster
    apply(k, {"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": STRAY_NS, "labels": {"team": "tools"}}})
    apply(k, job(JOB, steps=10000000))
    wait_state(k, JOB, {"Running"})
    pod = started_pod(k, JOB, f"{JOB}-ps-0", timeout=90)
    ip = pod["status"]["podIP"]
    for port in (2222, 9090):
        wait_for(k, f"the PS to listen on {ip}:{port}", lambda: connects(ip, port), 60)
    yield pod
    k.run("delete", "tj", JOB, "--wait=false", check=False)


def connects(ip, port):
    try:
        socket.create_connection((ip, port), timeout=2).close()
        return True
    except OSError:
        return False


def probes(k, *specs):
    """Runs probe pods (name, namespace, labels, targets) at once; returns {name: (exit code, log)}."""
    for name, ns, labels, targets in specs:
        apply(k, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                  "spec": {"restartPolicy": "Never",
                           "containers": [{"name": "probe", "image": "kubetrain-probe:host",
                                           "command": ["python3", "-c", PROBE, *targets]}]}}, ns=ns)
    out = {}
    for name, ns, _, _ in specs:
        def ended():
            pod = json.loads(k.run("get", "pod", name, "-n", ns, "-o", "json").stdout)
            return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None
        pod = wait_for(k, f"probe {ns}/{name} to end", ended, 60)
        code = pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
        with open(os.path.join(k.state, "node-agent", "logs", f"{ns}_{name}_probe.log")) as f:
            out[name] = (code, f.read())
        k.run("delete", "pod", name, "-n", ns, "--wait=false")
    return out


def nft_table_of(k, pod):
    """The kubetrain_netpol table in the pod's network namespace, as nft lists it ('' if none)."""
    uid8 = pod["metadata"]["uid"].replace("-", "")[:8]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    ns = next(n for n in names if n.endswith(uid8))
    p = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "--", "nft", "list", "table", "inet",
                        "kubetrain_netpol"], capture_output=True, text=True)
    return p.stdout


def test_networkpolicy_lets_the_jobs_workers_reach_the_ps(cluster, ps):
    k, ip = cluster, ps["status"]["podIP"]
    # The agent enforces the operator's policy in the PS's namespace (so what follows is not
    # passing for want of a rule).
    table = wait_for(k, "the PS's ingress rules", lambda: "selected by default/np" in nft_table_of(k, ps)
                     and nft_table_of(k, ps), 30)
    assert "counter packets" in table and "drop" in table, table
    # Per network namespace, so whether the PS runs from its image (make images; the default) or
    # as a host process (KUBETRAIN_HOST_BINARIES=1) makes no difference; say which one this was.
    with open(os.path.join(k.state, "logs", "node-agent.log")) as f:
        started = [line for line in f if f"started default/{JOB}-ps-0 " in line]
    print("PS started:", started[-1].split(": ")[0])
    if testlib.e2e_images():  # the cluster fixture made sure the images exist
        assert f" image {RUNTIME_IMAGE}" in started[-1], started
    # The workers train against the PS: the global step moves.
    before = (status(k, JOB).get("progress") or {}).get("globalStep", 0)
    wait_for(k, "more steps", lambda: (status(k, JOB).get("progress") or {}).get("globalStep", 0) > before, 60)
    for w in (f"{JOB}-worker-0", f"{JOB}-worker-1"):
        assert started_pod(k, JOB, w)["status"]["podIP"]  # both workers run (and so reach the PS)
    # A pod labelled as the job's pods reaches the PS's training port.
    got = probes(k, ("np-member", "default", {"kubetrain.io/job-name": JOB}, [f"{ip}:2222"]))
    assert got["np-member"] == (0, f"{ip}:2222 open\n"), got


def test_networkpolicy_refuses_another_jobs_pod(cluster, ps):
    """Another TrainingJob whose worker is the probe (templates with their own containers, so the
    operator makes and labels its pods as any job's): it cannot reach this job's PS."""
    k, ip = cluster, ps["status"]["podIP"]
    other = {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "metadata": {"name": "np-other"},
             "spec": {"replicaSpecs": {"PS": {"replicas": 1, "template": {"spec": {"containers": [
                                           {"name": "ps", "image": "kubetrain-probe:host", "command": ["sleep", "600"]}]}}},
                                       "Worker": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {
                 "containers": [{"name": "probe", "image": "kubetrain-probe:host",
                                 "command": ["python3", "-c", PROBE, f"{ip}:2222"]}]}}}}}}
    apply(k, other)
    st = wait_state(k, "np-other", {"Succeeded", "Failed"}, timeout=120)
    pod = json.loads(k.run("get", "pod", "np-other-worker-0", "-o", "json").stdout)
    assert pod["metadata"]["labels"]["kubetrain.io/job-name"] == "np-other"
    with open(os.path.join(k.state, "node-agent", "logs", "default_np-other-worker-0_probe.log")) as f:
        log = f.read()
    assert st["state"] == "Failed" and log == f"{ip}:2222 timed out\n", (st, log)
    k.run("delete", "tj", "np-other", "--wait=false")


def test_networkpolicy_refuses_a_stray_pod(cluster, ps):
    ip = ps["status"]["podIP"]
    got = probes(cluster, ("stray-here", "default", {}, [f"{ip}:2222"]),
                 ("stray-there", STRAY_NS, {"app": "debug"}, [f"{ip}:2222"]))
    # One in the job's namespace without the job's labels, one in another namespace.
    assert got["stray-here"] == (1, f"{ip}:2222 timed out\n"), got
    assert got["stray-there"] == (1, f"{ip}:2222 timed out\n"), got


def test_networkpolicy_keeps_the_metrics_port_reachable(cluster, ps):
    """The policy's second rule names only a port: anyone (a Prometheus pod in another namespace
    here) scrapes every task's metrics, while the training port stays closed to it."""
    k, ip = cluster, ps["status"]["podIP"]
    worker_ip = started_pod(k, JOB, f"{JOB}-worker-0")["status"]["podIP"]
    got = probes(k, ("prometheus", STRAY_NS, {"app": "prometheus"},
                     [f"http://{ip}:9090/metrics", f"http://{worker_ip}:9090/metrics", f"{ip}:2222"]))
    code, log = got["prometheus"]
    assert log.splitlines() == [f"http://{ip}:9090/metrics HTTP 200 kubetrain metrics",
                                f"http://{worker_ip}:9090/metrics HTTP 200 kubetrain metrics",
                                f"{ip}:2222 timed out"], log
    assert code == 1


def test_networkpolicy_leaves_pods_no_policy_selects_open(cluster, ps):
    k = cluster
    apply(k, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "open-server", "labels": {"app": "open"}},
              "spec": {"containers": [{"name": "main", "image": "kubetrain-probe:host",
                                       "command": ["python3", "-c", SERVE]}]}}, ns=STRAY_NS)
    pod = wait_for(k, "open-server to run", lambda: (lambda p: p if p["status"].get("podIP") and any(
        "running" in c["state"] for c in p["status"].get("containerStatuses") or []) else None)(
        json.loads(k.run("get", "pod", "open-server", "-n", STRAY_NS, "-o", "json").stdout)), 60)
    ip = pod["status"]["podIP"]
    wait_for(k, "open-server to listen", lambda: connects(ip, 2222), 30)
    # A job's own pod and a stray one both reach it: no policy selects it.
    got = probes(k, ("to-open-from-job", "default", {"kubetrain.io/job-name": JOB}, [f"{ip}:2222"]),
                 ("to-open-from-stray", "default", {}, [f"{ip}:2222"]))
    assert got == {"to-open-from-job": (0, f"{ip}:2222 open\n"), "to-open-from-stray": (0, f"{ip}:2222 open\n")}
    k.run("delete", "pod", "open-server", "-n", STRAY_NS, "--wait=false")


def test_networkpolicy_a_second_policy_admits_more_until_it_is_deleted(cluster, ps):
    """Policies selecting a pod add up; the agent re-evaluates when one comes and goes."""
    k, ip = cluster, ps["status"]["podIP"]
    debug = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "np-debug"},
             "spec": {"podSelector": {"matchExpressions": [
                          {"key": "kubetrain.io/replica-type", "operator": "In", "values": ["ps"]},
                          {"key": "kubetrain.io/job-name", "operator": "Exists"}]},
                      "policyTypes": ["Ingress"],
                      "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "tools"}},
                                             "podSelector": {"matchLabels": {"app": "debug"}}}],
                                   "ports": [{"protocol": "TCP", "port": 2222}]}]}}
    apply(k, debug)
    wait_for(k, "the PS's rules to name np-debug", lambda: "default/np-debug" in nft_table_of(k, ps), 30)
    got = probes(k, ("debug-in", STRAY_NS, {"app": "debug"}, [f"{ip}:2222"]),
                 ("debug-wrong-label", STRAY_NS, {"app": "other"}, [f"{ip}:2222"]))
    assert got["debug-in"] == (0, f"{ip}:2222 open\n"), got
    assert got["debug-wrong-label"] == (1, f"{ip}:2222 timed out\n"), got
    k.run("delete", "networkpolicy", "np-debug")
    wait_for(k, "np-debug to leave the PS's rules", lambda: "default/np-debug" not in nft_table_of(k, ps), 30)
    got = probes(k, ("debug-after", STRAY_NS, {"app": "debug"}, [f"{ip}:2222"]))
    assert got["debug-after"] == (1, f"{ip}:2222 timed out\n"), got
