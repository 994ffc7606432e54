"""Tests for tests/cluster/node_agent.py against a real kube-apiserver + etcd (up.sh).

Run: python3 -m pytest -q tests/cluster/test_node_agent.py   (as root: the agent uses mount namespaces)
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import testlib  # noqa: E402

CACHE_BIN = testlib.cache_bin()
NODE = "kubetrain-node-0"



class Cluster:
    def __init__(self, state, env, agent_state):
        self.state, self.env, self.agent_state = state, env, agent_state

    def kubectl(self, *args, input=None, check=True):
        p = subprocess.run([os.path.join(CACHE_BIN, "kubectl"), *args], input=input, capture_output=True,
                           text=True, env=self.env, timeout=60)
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def get(self, *args):
        p = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(p.stdout) if p.returncode == 0 else None

    def apply(self, obj):
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def wait_pod(self, name, pred, timeout=60):
        deadline, pod = time.time() + timeout, None
        while time.time() < deadline:
            pod = self.get("pod", name)
            if pod and pred(pod):
                return pod
            time.sleep(0.3)
        raise AssertionError(f"pod {name} did not reach the expected state in {timeout}s; last:\n"
                             f"{json.dumps(pod, indent=1)}\nagent log:\n{self.agent_log()}")

    def agent_log(self):
        try:
            return open(os.path.join(self.state, "node-agent.log")).read()[-6000:]
        except OSError:
            return ""

    def pod_log(self, pod, container):
        return open(os.path.join(self.agent_state, "logs", f"default_{pod}_{container}.log")).read()


@pytest.fixture(scope="module", autouse=True)
def as_root():
    testlib.require_root("tests/cluster/test_node_agent.py")


@pytest.fixture(scope="module")
def cluster():
    if not all(os.access(os.path.join(CACHE_BIN, b), os.X_OK) for b in ("etcd", "kube-apiserver", "kubectl")):
        pytest.skip(f"control-plane binaries missing in {CACHE_BIN} (run tests/cluster/build.sh)")
    try:
        state, env, ex = testlib.cluster_up("kubetrain-agenttest.", "up.sh", timeout=180, down_args=("--quiet",),
                                            KUBETRAIN_SKIP_BUILD="1")
    except testlib.ClusterUpFailed as e:
        pytest.fail(str(e))
    agent = None
    try:
        env["KUBECONFIG"] = ex["KUBECONFIG"]
        assert env["KUBECONFIG"] == os.path.join(state, "kubeconfig")
        agent_state = os.path.join(state, "agent")
        with open(os.path.join(state, "node-agent.log"), "w") as logf:
            agent = subprocess.Popen([sys.executable, os.path.join(HERE, "node_agent.py"),
                                      "--kubeconfig", env["KUBECONFIG"], "--bin-dir", os.path.join(ROOT, "bin"),
                                      "--state-dir", agent_state, "--node-name", NODE],
                                     stdout=logf, stderr=subprocess.STDOUT)
        c = Cluster(state, env, agent_state)
        deadline = time.time() + 30
        while not c.get("node", NODE):
            assert agent.poll() is None and time.time() < deadline, f"agent did not register:\n{c.agent_log()}"
            time.sleep(0.3)
        yield c
    finally:
        if agent and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        if agent and agent.returncode:
            print(f"node agent exited {agent.returncode}; log:\n" + Cluster(state, env, "").agent_log())
        testlib.cluster_down(env, "up.sh", "--quiet", timeout=60)
        if os.environ.get("KUBETRAIN_KEEP_STATE") != "1":
            shutil.rmtree(state, ignore_errors=True)


def cond(obj, typ):
    return next((c["status"] for c in obj["status"].get("conditions", []) if c["type"] == typ), None)


def group_cmdlines(pgid):
    """argv of the live (non-zombie) processes in process group pgid."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            if int(stat[2]) == pgid and stat[0] != "Z":
                out.append(open(f"/proc/{pid}/cmdline").read().split("\0")[:-1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def test_node_is_ready(cluster):
    node = cluster.get("node", NODE)
    assert cond(node, "Ready") == "True"
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert len(internal) == 1 and internal[0].startswith("10.244."), node["status"]["addresses"]  # the bridge
    assert node["status"]["allocatable"]["pods"] == "110"


def test_failed_pod_with_configmap_env_dns_and_termination_message(cluster):
    cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc-a"},
                   "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "a"},
                            "ports": [{"port": 2222}]}})
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-a"},
                   "data": {"x": "hello-from-configmap\n"}})
    script = ("echo $MY_IP > /dev/termination-log; cat /etc/kubetrain/x; "
              "echo \"hosts: $(getent hosts svc-a.default.svc)\"; echo \"expanded: $EXPANDED\"; exit 3")
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-a", "labels": {"app": "a"}},
                   "spec": {"restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "kubetrain/runtime:ignored",
                                            "command": ["/bin/sh", "-c", script],
                                            "env": [{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                                    {"name": "EXPANDED", "value": "$(MY_IP):1 $$(MY_IP) $(NOPE)"}],
                                            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/kubetrain", "readOnly": True}]}],
                            "volumes": [{"name": "cfg", "configMap": {"name": "cm-a"}}]}})
    pod = cluster.wait_pod("pod-a", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    st = pod["status"]
    ip = st["podIP"]
    assert pod["spec"]["nodeName"] == NODE
    assert st["phase"] == "Failed", st
    assert ip.startswith("10.244.") and st["podIPs"] == [{"ip": ip}] and st["hostIP"].startswith("10.244.")
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert term["message"].strip() == ip
    assert cond(pod, "PodScheduled") == "True" and cond(pod, "Ready") == "False"
    out = cluster.pod_log("pod-a", "main")
    assert "hello-from-configmap" in out
    assert f"hosts: {ip}" in out and "svc-a.default.svc" in out, out
    assert f"expanded: {ip}:1 $(MY_IP) $(NOPE)" in out, out
    # The ConfigMap was mounted only inside the pod's mount namespace.
    assert not os.path.exists("/etc/kubetrain/x")


def test_onfailure_restarts_in_place(cluster):
    counter_dir = tempfile.mkdtemp(prefix="kt-agent-counter.", dir="/tmp")
    counter = os.path.join(counter_dir, "n")
    try:
        script = f'n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}; echo run $n; [ $n -ge 3 ]'
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-retry"},
                       "spec": {"restartPolicy": "OnFailure",
                                "containers": [{"name": "main", "image": "x", "command": ["sh", "-c", script]}]}})
        pod = cluster.wait_pod("pod-retry", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
        cs = pod["status"]["containerStatuses"][0]
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        assert cs["restartCount"] == 2
        assert cs["state"]["terminated"]["exitCode"] == 0 and cs["state"]["terminated"]["reason"] == "Completed"
        assert cs["lastState"]["terminated"]["exitCode"] == 1
        assert open(counter).read().strip() == "3"
        assert cluster.pod_log("pod-retry", "main").split() == ["run", "1", "run", "2", "run", "3"]
    finally:
        shutil.rmtree(counter_dir, ignore_errors=True)


def test_delete_running_pod_kills_process(cluster):
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-sleep", "labels": {"app": "a"}},
                   "spec": {"containers": [{"name": "main", "image": "x", "command": ["sleep", "1000"]}]}})
    pod = cluster.wait_pod("pod-sleep", lambda p: p["status"].get("phase") == "Running" and cond(p, "Ready") == "True")
    cs = pod["status"]["containerStatuses"][0]
    assert cs["ready"] and cs["started"] and "running" in cs["state"]
    pgid = int(cs["containerID"].rsplit("/", 1)[1])  # the container's process group
    is_sleep = lambda argv: os.path.basename(argv[0]) == "sleep" and argv[1:] == ["1000"]
    deadline = time.time() + 10  # the container's sh may still be setting up its mounts
    while not any(map(is_sleep, group_cmdlines(pgid))) and time.time() < deadline:
        time.sleep(0.1)
    assert any(map(is_sleep, group_cmdlines(pgid))), group_cmdlines(pgid)
    # The running pod matches svc-a, so the agent's hosts file names it (publishNotReadyAddresses).
    hosts = open(os.path.join(cluster.agent_state, "hosts")).read()
    assert f"{pod['status']['podIP']}\tsvc-a svc-a.default svc-a.default.svc svc-a.default.svc.cluster.local" in hosts
    t0 = time.time()
    cluster.kubectl("delete", "pod", "pod-sleep", "--wait=true", "--timeout=30s")
    assert time.time() - t0 < 10
    assert cluster.get("pod", "pod-sleep") is None
    assert group_cmdlines(pgid) == []
    assert pod["status"]["podIP"] not in open(os.path.join(cluster.agent_state, "hosts")).read()


# --- a network namespace per pod ----------------------------------------------------------
SERVE = ("import socket,sys\n"
         "s=socket.socket(); s.bind(('0.0.0.0',2222)); s.listen(8)\n"  # every pod: the same port
         "while True:\n c,_=s.accept(); c.sendall(sys.argv[1].encode()); c.close()\n")
FETCH = ("import socket,ssl,sys\n"
         "def get(h):\n"
         " s=socket.create_connection((h,2222),timeout=5); d=s.recv(100).decode(); s.close(); return d\n"
         "print('got', get('net-a.default.svc'), get('net-b.default.svc'))\n"
         "try:\n socket.create_connection(('127.0.0.1',2222),timeout=2); print('localhost: open')\n"
         "except OSError as e:\n print('localhost: closed', type(e).__name__)\n"
         "ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE\n"
         "t=ctx.wrap_socket(socket.create_connection(('10.0.0.1',443),timeout=5))\n"
         "t.sendall(b'GET /version HTTP/1.1\\r\\nHost: kubernetes\\r\\nConnection: close\\r\\n\\r\\n')\n"
         "print('api:', t.recv(100).decode().splitlines()[0])\n")


def test_each_pod_has_its_own_network_namespace(cluster):
    for name in ("net-a", "net-b"):
        cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                       "spec": {"clusterIP": "None", "selector": {"app": name}, "ports": [{"port": 2222}]}})
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
                       "spec": {"containers": [{"name": "main", "image": "x",
                                                "command": ["python3", "-c", SERVE, f"I am {name}"]}]}})
    pods = [cluster.wait_pod(n, lambda p: cond(p, "Ready") == "True") for n in ("net-a", "net-b")]
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 2 and all(ip.startswith("10.244.") for ip in ips), ips
    # The host reaches each pod's own 0.0.0.0:2222 through the bridge.
    for ip, name in zip(ips, ("net-a", "net-b")):
        deadline = time.time() + 10
        while True:
            try:
                with socket.create_connection((ip, 2222), timeout=2) as s:
                    assert s.recv(100).decode() == f"I am {name}"
                break
            except ConnectionRefusedError:
                assert time.time() < deadline, f"{name} never listened on {ip}:2222"
                time.sleep(0.2)
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "net-c"},
                   "spec": {"restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "x", "command": ["python3", "-c", FETCH]}]}})
    pod = cluster.wait_pod("net-c", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    out = cluster.pod_log("net-c", "main")
    assert pod["status"]["phase"] == "Succeeded", out
    assert "got I am net-a I am net-b" in out, out
    assert "localhost: closed ConnectionRefusedError" in out, out  # its localhost is its own
    assert "api: HTTP/1.1 " in out, out  # 10.0.0.1:443 reaches the API server
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    uid8 = pods[0]["metadata"]["uid"].replace("-", "")[:8]
    assert uid8 in netns, netns  # net-a runs in its own namespace
    for name in ("net-a", "net-b", "net-c"):
        cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=30s")
    deadline = time.time() + 10  # the agent tears the namespace down on its next pass
    while uid8 in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout:
        assert time.time() < deadline, "the finished pod's network namespace was never released"
        time.sleep(0.2)


def test_host_path_volume(cluster):
    d = tempfile.mkdtemp(prefix="kt-agent-hostpath.", dir="/tmp")
    try:
        with open(os.path.join(d, "data.csv"), "w") as f:
            f.write("1,2,3\n")
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-hp"},
                       "spec": {"restartPolicy": "Never",
                                "containers": [{"name": "main", "image": "x", "command": ["cat", "/data/data.csv"],
                                                "volumeMounts": [{"name": "d", "mountPath": "/data", "readOnly": True}]}],
                                "volumes": [{"name": "d", "hostPath": {"path": d, "type": "Directory"}}]}})
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-hp-missing"},
                       "spec": {"restartPolicy": "Never",
                                "containers": [{"name": "main", "image": "x", "command": ["true"],
                                                "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
                                "volumes": [{"name": "d", "hostPath": {"path": d + "/nope", "type": "Directory"}}]}})
        pod = cluster.wait_pod("pod-hp", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
        assert pod["status"]["phase"] == "Succeeded" and cluster.pod_log("pod-hp", "main").strip() == "1,2,3"
        pod = cluster.wait_pod("pod-hp-missing", lambda p: "waiting" in (p["status"].get("containerStatuses")
                                                                          or [{}])[0].get("state", {}))
        waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
        assert pod["status"]["phase"] == "Pending" and "is not a directory" in waiting["message"], waiting
        cluster.kubectl("delete", "pod", "pod-hp", "pod-hp-missing", "--wait=true", "--timeout=30s")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def secret_obj(name, **data):
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_secret_volumes_hold_their_items_with_their_modes_read_only(cluster):
    """As the kubelet writes them: only the listed items at their paths, mode per item, else
    defaultMode, else 0644, owned by root; the fsGroup as group plus group read; mounted read-only
    whatever the volumeMount says; an optional missing Secret is an empty volume."""
    cluster.apply(secret_obj("sec-a", a="alpha", b="beta", c="gamma"))
    m = "/var/run/kt-agent-test"  # host mode: mount points are made on this machine
    script = (f"cd {m}/s && find . -type f | sort && for f in x/a b; do stat -c '%a %u %g %n' $f; done; "
              f"cat x/a b; echo; cd {m}/all && stat -c '%a %u %g %n' a c; "
              f"echo hi > {m}/s/new || echo RO; ls -A {m}/opt | wc -l")
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-sec"},
                   "spec": {"restartPolicy": "Never", "securityContext": {"fsGroup": 2000},
                            "containers": [{"name": "main", "image": "x", "command": ["/bin/sh", "-c", script],
                                            "volumeMounts": [{"name": n, "mountPath": f"{m}/{n}"}
                                                             for n in ("s", "all", "opt")]}],
                            "volumes": [{"name": "s", "secret": {"secretName": "sec-a", "defaultMode": 0o400,
                                                                 "items": [{"key": "a", "path": "x/a"},
                                                                           {"key": "b", "path": "b", "mode": 0o404}]}},
                                        {"name": "all", "secret": {"secretName": "sec-a"}},
                                        {"name": "opt", "secret": {"secretName": "nope", "optional": True}}]}})
    pod = cluster.wait_pod("pod-sec", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    out = cluster.pod_log("pod-sec", "main").split("\n")
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], out)
    assert out[:2] == ["./b", "./x/a"], out  # c is not listed: not there
    assert out[2:4] == ["440 0 2000 x/a", "444 0 2000 b"], out  # fsGroup adds group read
    assert out[4] == "alphabeta", out
    assert out[5:7] == ["644 0 2000 a", "644 0 2000 c"], out
    assert "Read-only file system" in "\n".join(out) and "RO" in out, out
    assert out[-2] == "0", out  # the optional Secret that does not exist: an empty volume
    cluster.kubectl("delete", "pod", "pod-sec", "--wait=true", "--timeout=30s")


def test_a_pod_waits_for_its_secret_and_for_every_listed_key(cluster):
    vol = lambda items=None: {"name": "s", "secret": {"secretName": "sec-late", **({"items": items} if items else {})}}
    pod = lambda name, items=None: {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "volumes": [vol(items)],
                 "containers": [{"name": "main", "image": "x", "command": ["cat", "/s/token"],
                                 "volumeMounts": [{"name": "s", "mountPath": "/s"}]}]}}
    waiting = lambda p: "waiting" in ((p["status"].get("containerStatuses") or [{}])[0].get("state") or {})
    cluster.apply(pod("pod-sec-late"))
    cluster.apply(pod("pod-sec-key", [{"key": "token.worker-1", "path": "token"}]))
    p = cluster.wait_pod("pod-sec-late", waiting)
    assert p["status"]["phase"] == "Pending", p["status"]
    assert 'secret "sec-late" not found' in p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    cluster.apply(secret_obj("sec-late", token="t0\n", **{"token.worker-0": "w0"}))
    p = cluster.wait_pod("pod-sec-late", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    assert p["status"]["phase"] == "Succeeded" and cluster.pod_log("pod-sec-late", "main") == "t0\n"
    # A listed key the Secret does not have: the kubelet does not start the pod either.
    p = cluster.wait_pod("pod-sec-key", lambda p: waiting(p) and "has no key" in
                         p["status"]["containerStatuses"][0]["state"]["waiting"]["message"])
    assert "'token.worker-1'" in p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    cluster.kubectl("delete", "pod", "pod-sec-late", "pod-sec-key", "--wait=true", "--timeout=30s")


# --- pods from images (make images) ------------------------------------------------------
sys.path.insert(0, HERE)
import image_rootfs  # noqa: E402

IMAGES = image_rootfs.images_env()
RUNTIME, OPERATOR = IMAGES["KUBETRAIN_RUNTIME_IMAGE"], IMAGES["KUBETRAIN_OPERATOR_IMAGE"]


def need_images():
    if os.environ.get("KUBETRAIN_E2E_IMAGES", "1") == "0":
        pytest.skip("KUBETRAIN_E2E_IMAGES=0: the host-binary fast mode was asked for")
    testlib.require_images(pytest.fail)


def working_containers():
    p = subprocess.run(["buildah", "containers", "--format", "{{.ContainerName}}"], capture_output=True, text=True)
    return p.stdout.split()


def test_pod_runs_from_its_image(cluster):
    need_images()
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-img"},
                   "data": {"x": "configmap-in-image\n"}})
    script = ("id -u; id -g; cat /etc/kubetrain/x; ls /usr/share/datasets/fashion-mnist | head -1; "
              "touch /probe 2>&1 || true; echo scratch-ok > /scratch/f && cat /scratch/f; "
              "echo \"hosts: $(getent hosts svc-a.default.svc)\"; kubetrain-ps --help >/dev/null && echo PS_OK; "
              f"[ -e {ROOT}/Makefile ] && echo HOST_ROOT_VISIBLE || echo HOST_ROOT_HIDDEN; "
              "echo $MY_IP > /dev/termination-log; exit 4")
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-img", "labels": {"app": "a"}},
                   "spec": {"restartPolicy": "Never",
                            "containers": [{"name": "main", "image": RUNTIME, "command": ["/bin/sh", "-c", script],
                                            "env": [{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                                            "securityContext": {"readOnlyRootFilesystem": True, "runAsUser": 65532,
                                                                "runAsGroup": 65532, "runAsNonRoot": True},
                                            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/kubetrain", "readOnly": True},
                                                             {"name": "scratch", "mountPath": "/scratch"}]}],
                            "volumes": [{"name": "cfg", "configMap": {"name": "cm-img"}},
                                        {"name": "scratch", "emptyDir": {}}]}})
    pod = cluster.wait_pod("pod-img", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), timeout=90)
    st = pod["status"]
    term = st["containerStatuses"][0]["state"]["terminated"]
    out = cluster.pod_log("pod-img", "main")
    assert term["exitCode"] == 4, (term, out)
    assert term["message"].strip() == st["podIP"], term
    lines = out.split("\n")
    assert lines[:2] == ["65532", "65532"], out
    assert "configmap-in-image" in out and "t10k-images-idx3-ubyte.gz" in out, out
    assert "Read-only file system" in out and "scratch-ok" in out and "PS_OK" in out, out
    assert f"hosts: {st['podIP']}" in out, out
    assert "HOST_ROOT_HIDDEN" in out, out  # it saw the image's root, not this machine's
    assert f"image {RUNTIME}:" in cluster.agent_log()
    uid8 = pod["metadata"]["uid"][:8]
    assert not [c for c in working_containers() if uid8 in c], working_containers()


def test_secret_files_in_an_image_pod_are_readable_by_its_user_as_the_modes_say(cluster):
    """In an image pod running as 65532 (the runtime's user): 0444 files are readable; 0400 ones
    (root's) are not, unless the pod's fsGroup makes them group-readable, as on a kubelet."""
    need_images()
    cluster.apply(secret_obj("sec-img", token="t-img"))
    script = "id -u; cat /a/token; echo; cat /b/token 2>&1; echo; cat /c/token; echo"
    vols = [{"name": n, "secret": {"secretName": "sec-img", "defaultMode": m}}
            for n, m in (("a", 0o444), ("b", 0o400))]
    base = {"restartPolicy": "Never", "volumes": vols,
            "containers": [{"name": "main", "image": RUNTIME, "command": ["/bin/sh", "-c", script],
                            "securityContext": {"runAsUser": 65532, "runAsNonRoot": True},
                            "volumeMounts": [{"name": n, "mountPath": f"/{n}"} for n in ("a", "b")]
                            + [{"name": "b", "mountPath": "/c"}]}]}
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-sec-img"}, "spec": base})
    with_group = json.loads(json.dumps(base))
    with_group["securityContext"] = {"fsGroup": 65532}
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-sec-img-fsgroup"}, "spec": with_group})
    for name in ("pod-sec-img", "pod-sec-img-fsgroup"):
        cluster.wait_pod(name, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), timeout=90)
    out = cluster.pod_log("pod-sec-img", "main").split("\n")
    assert out[0] == "65532" and out[1] == "t-img", out
    assert "Permission denied" in out[2], out
    out = cluster.pod_log("pod-sec-img-fsgroup", "main").split("\n")
    assert out[:4] == ["65532", "t-img", "t-img", "t-img"], out
    cluster.kubectl("delete", "pod", "pod-sec-img", "pod-sec-img-fsgroup", "--wait=true", "--timeout=60s")


def test_image_entrypoint_and_run_as_non_root(cluster):
    need_images()
    # No command: the image's ENTRYPOINT (kubetrain-operator) with the pod's args.
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-entry"},
                   "spec": {"restartPolicy": "Never",
                            "containers": [{"name": "main", "image": OPERATOR, "args": ["--help"],
                                            "securityContext": {"readOnlyRootFilesystem": True}}]}})
    # runAsNonRoot with uid 0 must not start (the kubelet refuses it too).
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-root"},
                   "spec": {"restartPolicy": "Never",
                            "securityContext": {"runAsNonRoot": True, "runAsUser": 0},
                            "containers": [{"name": "main", "image": RUNTIME, "command": ["kubetrain", "--help"]}]}})
    pod = cluster.wait_pod("pod-entry", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), timeout=90)
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], cluster.pod_log("pod-entry", "main"))
    assert "usage" in cluster.pod_log("pod-entry", "main").lower()
    pod = cluster.wait_pod("pod-root", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), timeout=90)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["reason"] == "StartError" and "runAsNonRoot" in term["message"], term
