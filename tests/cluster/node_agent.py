#!/usr/bin/env python3
"""Test-only node agent for kubetrain's cluster tests: it stands where a kubelet would.

Registers a Ready Node, binds unscheduled pods to it, and runs their containers on this
machine. A container whose image is in buildah's local storage (`make images`) runs
from it, as on a node: its command (or the image's ENTRYPOINT/CMD) inside the image's
root filesystem (tests/cluster/image_rootfs.py: buildah mount + chroot), as the
securityContext's runAsUser/runAsGroup (else the image's USER), read-only where it says
readOnlyRootFilesystem, runAsNonRoot enforced. Otherwise, or with --host-binaries, it
runs as a plain process of this machine (command[0] looked up in --bin-dir, then PATH).
Each pod gets its own network namespace on a bridge with an address from 10.244.0.0/16
(tests/cluster/pod_network.py; --pod-network loopback: the host network and a 127.10.x.y
each), ConfigMap, Secret, emptyDir and hostPath volumes (ConfigMaps and Secrets as the
kubelet writes them: items, file modes, fsGroup, mounted read-only), a termination-log file and a shared hosts
file (headless Service names) bind-mounted, in private mount + PID namespaces (unshare).
NetworkPolicy ingress rules are enforced with nftables in each pod's namespace (netpolicy.py).
Needs root.
With --service-account-tokens it also does what the kubelet does for in-cluster
clients: a TokenRequest token of the pod's ServiceAccount, the API server CA and the
namespace bind-mounted at /var/run/secrets/kubernetes.io/serviceaccount, and
KUBERNETES_SERVICE_HOST/PORT in every container (10.0.0.1:443 relayed to the API server of
the kubeconfig; with --pod-network loopback, that API server's own address).
Python 3.11 stdlib only. See tests/cluster/README.md ("Node agent").

Usage: node_agent.py --kubeconfig PATH --bin-dir DIR --state-dir DIR [--node-name NAME]
                     [--service-account-tokens] [--host-binaries] [--pod-network netns|loopback]
"""
import argparse, base64, ctypes, http.client, json, os, queue, re, shlex, shutil, signal, ssl
import subprocess, sys, threading, time, urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import image_rootfs  # noqa: E402
import netpolicy  # noqa: E402
import pod_network  # noqa: E402

BACKOFF_START, BACKOFF_CAP, GRACE_CAP, HEARTBEAT = 1.0, 10.0, 5.0, 10.0
# Grace periods up to Kubernetes' default are cut to GRACE_CAP (tests stay fast); a longer one
# was asked for on purpose (e.g. PS pods that may hold parameters they could not save) and is
# honoured, as the kubelet would.
DEFAULT_GRACE = 30
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_TOKEN_SECONDS, SA_RETRY = 3607, 2.0  # the kubelet's token lifetime; retry a missing ServiceAccount
WATCH_TIMEOUT = 60
# Volumes written from an API object: kind -> (resource, the field naming the object).
API_VOLUMES = {"configMap": ("configmaps", "name"), "secret": ("secrets", "secretName")}


def log(msg):
    print(f"node-agent {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def now_rfc3339():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- kubeconfig: JSON or the block-style YAML subset kubeconfigs use ---------------------
def parse_yaml(text):
    lines = [(len(l) - len(l.lstrip(" ")), l.strip()) for l in text.splitlines()
             if l.strip() and not l.strip().startswith("#")]

    def scalar(v):
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            return v[1:-1]
        return {"true": True, "false": False, "null": None, "~": None, "{}": {}, "[]": []}.get(v, v)

    def is_item(s):
        return s == "-" or s.startswith("- ")

    def block(i, ind):
        if not is_item(lines[i][1]):
            return mapping(i, ind)
        out = []
        while i < len(lines) and lines[i][0] == ind and is_item(lines[i][1]):
            rest = lines[i][1][1:].strip()
            if not rest:
                i += 1
                v, i = block(i, lines[i][0]) if i < len(lines) and lines[i][0] > ind else (None, i)
            elif re.match(r"[^\s\"']+:(\s|$)", rest):
                lines[i] = (ind + 2, rest)
                v, i = mapping(i, ind + 2)
            else:
                v, i = scalar(rest), i + 1
            out.append(v)
        return out, i

    def mapping(i, ind):
        out = {}
        while i < len(lines) and lines[i][0] == ind and not is_item(lines[i][1]):
            key, _, rest = lines[i][1].partition(":")
            i += 1
            if rest.strip():
                out[key.strip()] = scalar(rest)
            elif i < len(lines) and (lines[i][0] > ind or (lines[i][0] == ind and is_item(lines[i][1]))):
                out[key.strip()], i = block(i, lines[i][0])
            else:
                out[key.strip()] = None
        return out, i

    return block(0, lines[0][0])[0] if lines else {}


def load_kubeconfig(path, state_dir):
    text = open(path).read()
    cfg = json.loads(text) if text.lstrip().startswith("{") else parse_yaml(text)
    named = lambda kind, name: next((x.get(kind[:-1]) or {} for x in cfg.get(kind) or []
                                     if x.get("name") == name), {})
    ctx = named("contexts", cfg.get("current-context")) or (cfg["contexts"][0]["context"])
    cluster, user = named("clusters", ctx.get("cluster")), named("users", ctx.get("user"))
    url = urllib.parse.urlsplit(cluster["server"])
    if url.hostname is None or not url.hostname.startswith(("127.", "localhost")):
        raise SystemExit(f"refusing non-loopback API server {cluster['server']}")
    tls, ca_pem = ssl.create_default_context(), None
    if cluster.get("insecure-skip-tls-verify"):
        tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        tls.load_verify_locations(cadata=ca_pem)
    elif cluster.get("certificate-authority"):
        tls.load_verify_locations(cafile=cluster["certificate-authority"])
        ca_pem = open(cluster["certificate-authority"]).read()
    cert, key = user.get("client-certificate"), user.get("client-key")
    for field, fname in (("client-certificate-data", "client.crt"), ("client-key-data", "client.key")):
        if user.get(field):
            p = os.path.join(state_dir, fname)
            with open(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(base64.b64decode(user[field]))
            cert, key = (p, key) if fname == "client.crt" else (cert, p)
    if cert:
        tls.load_cert_chain(cert, key)
    return url.hostname, url.port or 443, tls, user.get("token"), ca_pem


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    def __init__(self, kubeconfig, state_dir):
        self.kubeconfig, self.state_dir, self.mtime, self.lock = kubeconfig, state_dir, None, threading.Lock()

    def load(self):
        with self.lock:  # (re)load the kubeconfig when it changes, e.g. the test cluster was restarted
            mtime = os.stat(self.kubeconfig).st_mtime_ns
            if mtime != self.mtime:
                self.host, self.port, self.tls, self.token, self.ca_pem = load_kubeconfig(self.kubeconfig,
                                                                                          self.state_dir)
                if self.mtime is not None:
                    log(f"reloaded {self.kubeconfig}")
                self.mtime = mtime
        return self

    def open(self, method, path, body=None, ctype="application/json", timeout=30):
        self.load()
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls, timeout=timeout)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = ctype
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=headers)
        return conn, conn.getresponse()

    def __call__(self, method, path, body=None, ctype="application/json"):
        conn, resp = self.open(method, path, body, ctype)
        try:
            data = resp.read().decode()
            if resp.status >= 300:
                raise ApiError(resp.status, data)
            return json.loads(data) if data else {}
        finally:
            conn.close()


# --- Kubernetes $(VAR) expansion (third_party/forked/golang/expansion) --------------------
def expand(s, env):
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                out.append("$"); i += 2; continue
            if s[i + 1] == "(":
                j = s.find(")", i + 2)
                if j != -1:
                    name = s[i + 2:j]
                    out.append(env[name] if name in env else s[i:j + 1]); i = j + 1; continue
        out.append(s[i]); i += 1
    return "".join(out)


_prctl, _agent_pid = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()


def set_pdeathsig():  # runs in the child between fork and exec: no imports, no dlopen here
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the agent (even on SIGKILL)
    if os.getppid() != _agent_pid:
        os._exit(137)


class Container:
    def __init__(self, spec):
        self.spec, self.name = spec, spec["name"]
        self.proc = self.started_at = self.state = self.last_state = None
        self.rootfs = None  # image_rootfs.Rootfs while it runs from its image
        self.restarts, self.backoff, self.next_start, self.done = 0, BACKOFF_START, 0.0, False


class PodRun:
    def __init__(self, pod, ip, pod_dir):
        self.pod, self.uid, self.ip, self.dir = pod, pod["metadata"]["uid"], ip, pod_dir
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.containers = [Container(c) for c in pod["spec"]["containers"]]
        self.mounts = None  # [(src, dst, readOnly)] once volumes are ready
        self.start_time, self.phase, self.conds, self.sent = now_rfc3339(), "Pending", {}, None
        self.kill_deadline = None  # set when terminating
        self.waiting = None  # (reason, message) while the containers cannot be created yet
        self.sa_dir, self.sa_refresh_at, self.sa_retry_at = None, 0.0, 0.0
        self.killed = self.vanished = False


class Agent:
    def __init__(self, args):
        self.node, self.bin_dir, self.state = args.node_name, os.path.abspath(args.bin_dir), args.state_dir
        self.sa_tokens = getattr(args, "service_account_tokens", False)
        self.host_binaries = getattr(args, "host_binaries", False)
        for d in ("pods", "logs"):
            os.makedirs(os.path.join(self.state, d), exist_ok=True)
        self.api = Api(args.kubeconfig, self.state)
        self.q, self.stop = queue.Queue(), threading.Event()
        self.runs, self.services = {}, {}
        if getattr(args, "pod_network", "netns") == "loopback":
            self.net = pod_network.LoopbackNetwork()
        else:
            self.api.load()
            self.net = pod_network.NetnsNetwork(self.state, self.api.host, self.api.port, log, self.state)
        self.netpol = netpolicy.Enforcer(self.net, log)  # NetworkPolicy ingress, per pod namespace
        self.bind_tried = {}
        self.hosts_path = os.path.join(self.state, "hosts")
        base = open("/etc/hosts").read() if os.path.exists("/etc/hosts") else "127.0.0.1 localhost\n"
        self.hosts_base = base.split("# kubetrain node agent")[0].rstrip("\n") + "\n"
        with open(self.hosts_path, "a"):
            pass
        self.hosts_dirty, self.hosts_text = True, None
        self.path = f"{self.bin_dir}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"

    # --- node ---------------------------------------------------------------------------
    def register_node(self):
        labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubetrain.io/node-agent": "true"}
        try:
            self.api("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                               "metadata": {"name": self.node, "labels": labels}})
            log(f"registered node {self.node}")
        except ApiError as e:
            if e.status != 409:
                raise
        self.node_since = now_rfc3339()
        self.heartbeat(first=True)

    def heartbeat(self, first=False):
        t = now_rfc3339()
        cond = lambda typ, st, reason, msg: {"type": typ, "status": st, "reason": reason, "message": msg,
                                             "lastHeartbeatTime": t, "lastTransitionTime": self.node_since}
        status = {"conditions": [cond("Ready", "True", "KubeletReady", "kubetrain node agent is posting ready status")]
                                + [cond(c, "False", "KubeletHasNo" + c, "ok") for c in ("MemoryPressure", "DiskPressure", "PIDPressure")]}
        if first:
            mem_kb = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal:")), "1048576")
            res = {"cpu": str(os.cpu_count() or 1), "memory": f"{mem_kb}Ki", "pods": "110"}
            status.update(addresses=[{"type": "InternalIP", "address": self.net.host_ip},
                                     {"type": "Hostname", "address": self.node}],
                          capacity=res, allocatable=res,
                          nodeInfo={"kubeletVersion": "v0.0.0-kubetrain-node-agent", "operatingSystem": "linux",
                                    "architecture": os.uname().machine, "containerRuntimeVersion": "kubetrain-agent://0",
                                    "kernelVersion": os.uname().release, "osImage": "host", "machineID": "",
                                    "systemUUID": "", "bootID": ""})
        self.api("PATCH", f"/api/v1/nodes/{self.node}/status", {"status": status}, "application/merge-patch+json")

    def heartbeat_loop(self):
        while not self.stop.wait(HEARTBEAT):
            try:
                self.heartbeat()
            except ApiError as e:
                if e.status == 404:
                    log(f"node {self.node} is gone; registering it again")
                    try:
                        self.register_node()
                    except Exception as e2:
                        log(f"node registration failed: {e2}")
                else:
                    log(f"heartbeat failed: {e}")
            except Exception as e:
                log(f"heartbeat failed: {e}")

    # --- list + watch -------------------------------------------------------------------
    def watch_loop(self, kind, path):
        backoff = 1
        while not self.stop.is_set():
            try:
                lst = self.api("GET", path)
                rv = lst["metadata"]["resourceVersion"]
                self.q.put((kind, "SYNC", lst.get("items") or []))
                backoff = 1
                while not self.stop.is_set() and rv:
                    rv = self.watch_once(kind, path, rv)
            except Exception as e:
                if self.stop.is_set():
                    return
                log(f"watch {kind}: {e}; retrying in {backoff}s")
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 30)

    def watch_once(self, kind, path, rv):
        """Streams one watch; returns the resourceVersion to resume from, or None to relist."""
        q = urllib.parse.urlencode({"watch": 1, "resourceVersion": rv, "allowWatchBookmarks": "true",
                                    "timeoutSeconds": WATCH_TIMEOUT})
        conn, resp = self.api.open("GET", f"{path}?{q}", timeout=WATCH_TIMEOUT + 30)
        try:
            if resp.status == 410:
                log(f"watch {kind}: 410 Gone; relisting")
                return None
            if resp.status != 200:
                raise ApiError(resp.status, resp.read().decode(errors="replace"))
            while not self.stop.is_set():
                line = resp.readline()
                if not line:
                    return rv  # server closed the stream (timeoutSeconds): resume
                if not line.strip():
                    continue
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev["type"] == "ERROR":
                    log(f"watch {kind}: ERROR {obj.get('code')} {obj.get('message')}; relisting")
                    return None
                rv = obj.get("metadata", {}).get("resourceVersion") or rv
                if ev["type"] != "BOOKMARK":
                    self.q.put((kind, ev["type"], obj))
            return rv
        finally:
            conn.close()

    # --- events (main thread only) ------------------------------------------------------
    def on_services(self, typ, obj):
        if typ == "SYNC":
            self.services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in obj}
        else:
            k = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if typ == "DELETED":
                self.services.pop(k, None)
            else:
                self.services[k] = obj
        self.hosts_dirty = True

    def on_pods(self, typ, obj):
        if typ == "SYNC":
            live = {p["metadata"]["uid"] for p in obj}
            for run in list(self.runs.values()):
                if run.uid not in live:
                    self.on_pods("DELETED", run.pod)
            for p in obj:
                self.on_pods("MODIFIED", p)
            return
        md, spec = obj["metadata"], obj.get("spec", {})
        uid, key = md["uid"], f"{md['namespace']}/{md['name']}"
        run = self.runs.get(uid)
        if typ == "DELETED":
            if run and not run.vanished:
                log(f"pod {key} was deleted; killing its processes")
                run.vanished = True
                self.begin_termination(run, 0)
            return
        if not spec.get("nodeName"):
            if obj.get("status", {}).get("phase", "Pending") == "Pending" and not md.get("deletionTimestamp") \
                    and time.time() - self.bind_tried.get(uid, 0) > 5:
                self.bind_tried[uid] = time.time()
                self.bind(md)
            return
        if spec["nodeName"] != self.node:
            return
        self.bind_tried.pop(uid, None)
        if run is None:
            if md.get("deletionTimestamp"):
                self.force_delete(md)  # ours, but nothing runs for it (e.g. agent restarted)
            elif obj.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                self.admit(obj)
            return
        run.pod = obj
        if md.get("deletionTimestamp"):
            grace = float(md.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)) or 0)
            grace = grace if grace > DEFAULT_GRACE else min(grace, GRACE_CAP)
            if run.kill_deadline is None:
                log(f"pod {key} is being deleted (grace {grace:g}s)")
                self.begin_termination(run, grace)
            elif time.time() + grace < run.kill_deadline:
                # Deleted again with a shorter grace period: as the kubelet, stop it again sooner.
                log(f"pod {key} is being deleted again (grace {grace:g}s)")
                self.begin_termination(run, grace)

    def bind(self, md):
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": md["name"], "namespace": md["namespace"],
                                                                    "uid": md["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
        try:
            self.api("POST", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/binding", body)
            log(f"bound {md['namespace']}/{md['name']} to {self.node}")
        except ApiError as e:
            log(f"binding {md['namespace']}/{md['name']} failed: {e}")

    def force_delete(self, md):
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": md["uid"]}}
        try:
            self.api("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}", body)
            log(f"deleted {md['namespace']}/{md['name']}")
        except ApiError as e:
            if e.status not in (404, 409):
                log(f"deleting {md['namespace']}/{md['name']} failed: {e}")

    def admit(self, pod):
        md = pod["metadata"]
        run = PodRun(pod, self.net.add(md["uid"]), os.path.join(self.state, "pods", f"{md['namespace']}_{md['name']}_{md['uid'][:8]}"))
        os.makedirs(run.dir, exist_ok=True)
        self.runs[run.uid] = run
        self.hosts_dirty = True
        try:  # catch up on this namespace's Services now, so DNS is right before the first start
            svcs = self.api("GET", f"/api/v1/namespaces/{md['namespace']}/services").get("items") or []
            self.services = {k: v for k, v in self.services.items() if k[0] != md["namespace"]}
            self.services.update({(md["namespace"], s["metadata"]["name"]): s for s in svcs})
        except Exception as e:
            log(f"listing services of {md['namespace']} failed: {e}")
        for warn in ("initContainers", "ephemeralContainers"):
            if pod["spec"].get(warn):
                log(f"warning: pod {run.key}: {warn} are not supported; ignored")
        log(f"admitted {run.key} ip {run.ip}")

    def setup_volumes(self, run):
        """Writes the pod's volumes into its dir; returns False to retry later (e.g. ConfigMap missing)."""
        vols, read_only = {}, set()
        for v in run.pod["spec"].get("volumes") or []:
            err, kind = None, next((k for k in API_VOLUMES if k in v), None)
            if "hostPath" in v:
                err = self.host_path(v["hostPath"])
                vols[v["name"]] = v["hostPath"]["path"]
            else:
                d = vols[v["name"]] = os.path.join(run.dir, "volumes", v["name"])
                os.makedirs(d, exist_ok=True)
                if "emptyDir" in v:
                    os.chmod(d, 0o777)  # as the kubelet: writable by the container's user
                elif kind:
                    err = self.write_api_volume(run, kind, v[kind], d)
                    read_only.add(v["name"])
                else:
                    log(f"warning: pod {run.key}: volume {v['name']} type {sorted(set(v) - {'name'})} unsupported; using an empty dir")
            if err:
                why = ("ContainerCreating", f"MountVolume.SetUp failed for volume {v['name']!r}: {err}")
                if run.waiting != why:
                    log(f"pod {run.key}: {why[1]}; waiting")
                run.waiting = why
                return False
        if self.sa_tokens and run.pod["spec"].get("automountServiceAccountToken") is not False:
            if time.time() < run.sa_retry_at or not self.write_sa_token(run):
                return False
        run.mounts, run.waiting = {}, None
        for c in run.containers:
            ms = []
            if run.sa_dir and not any(m.get("mountPath", "").rstrip("/") == SA_MOUNT
                                      for m in c.spec.get("volumeMounts") or []):
                ms.append((run.sa_dir, SA_MOUNT, True))
            for m in c.spec.get("volumeMounts") or []:
                if m["name"] not in vols:
                    log(f"warning: pod {run.key}: volumeMount {m['name']} has no volume; skipped")
                    continue
                ms.append((os.path.join(vols[m["name"]], m.get("subPath", "")).rstrip("/"), m["mountPath"],
                           m.get("readOnly", False) or m["name"] in read_only))
            run.mounts[c.name] = ms
        return True

    def write_api_volume(self, run, kind, src, d):
        """A configMap or secret volume, as the kubelet writes it into D: the object's keys (or only
        its `items`, key -> path), each file mode `mode`, else `defaultMode`, else 0644, owned by root,
        and with the pod's fsGroup as group plus group read (the kubelet's SetVolumeOwnership). The
        kubelet mounts them read-only (setup_volumes). Returns why it cannot be written yet, or None
        (also when it is optional and missing)."""
        ns, plural, name_field = run.pod["metadata"]["namespace"], *API_VOLUMES[kind]
        name = src.get(name_field, "")
        try:
            obj = self.api("GET", f"/api/v1/namespaces/{ns}/{plural}/{name}")
        except ApiError as e:
            if e.status == 404:  # the kubelet's words
                return None if src.get("optional") else f'{kind.lower()} "{name}" not found'
            return f"{plural} {ns}/{name}: {e}"
        if kind == "configMap":
            data = {k: val.encode() for k, val in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(val) for k, val in (obj.get("binaryData") or {}).items()})
        else:
            data = {k: base64.b64decode(val) for k, val in (obj.get("data") or {}).items()}
        items = src.get("items") or [{"key": k, "path": k} for k in sorted(data)]
        missing = [it["key"] for it in items if it["key"] not in data]
        if missing and not src.get("optional"):
            return f"{plural} {ns}/{name} has no key {missing[0]!r}"
        fs_group = (run.pod["spec"].get("securityContext") or {}).get("fsGroup")
        for it in items:
            if it["key"] not in data:
                continue
            p = os.path.join(d, it["path"])
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(data[it["key"]])
            mode = it.get("mode", src.get("defaultMode", 0o644))
            if fs_group is not None:
                os.chown(p, 0, fs_group)
                mode |= 0o440
            os.chmod(p, mode)
        return None

    @staticmethod
    def host_path(hp):
        """The kubelet's hostPath type checks; None when the path is usable."""
        path, typ = hp.get("path", ""), hp.get("type") or ""
        if not os.path.isabs(path):
            return f"hostPath {path!r} is not an absolute path"
        if typ == "DirectoryOrCreate":
            os.makedirs(path, mode=0o755, exist_ok=True)
        elif typ == "FileOrCreate" and not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        if typ in ("Directory", "DirectoryOrCreate") and not os.path.isdir(path):
            return f"hostPath type check failed: {path} is not a directory"
        if typ in ("File", "FileOrCreate") and not os.path.isfile(path):
            return f"hostPath type check failed: {path} is not a file"
        return None

    def write_sa_token(self, run):
        """TokenRequest for the pod's ServiceAccount (bound to the pod), written with ca.crt and
        namespace into the pod's serviceaccount dir. False (pod waits, status says why) on failure."""
        md = run.pod["metadata"]
        ns, sa = md["namespace"], run.pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": SA_TOKEN_SECONDS}}
        if run.pod["spec"].get("serviceAccountName") == sa:
            # Bound to the pod, as the kubelet's. (The API server refuses the binding when the pod
            # names no ServiceAccount: this cluster runs without the ServiceAccount admission plugin.)
            body["spec"]["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}
        try:
            tr = self.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body)
            token = tr["status"]["token"]
        except Exception as e:
            run.sa_retry_at = time.time() + SA_RETRY
            if isinstance(e, ApiError) and e.status == 404:
                why = ("CreateContainerConfigError", f'serviceaccount "{sa}" not found in namespace "{ns}"; '
                       "waiting for it (the service account token cannot be created)")
            else:
                why = ("CreateContainerConfigError", f"requesting a token for serviceaccount {ns}/{sa}: {e}")
            if run.waiting != why:
                log(f"pod {run.key}: {why[1]}; retrying every {SA_RETRY:g}s")
            run.waiting = why
            return False
        d = os.path.join(run.dir, "serviceaccount")
        os.makedirs(d, exist_ok=True)
        for name, data in (("token", token), ("ca.crt", self.api.ca_pem or ""), ("namespace", ns)):
            tmp = os.path.join(d, f".{name}.tmp")
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w") as f:
                f.write(data)
            os.replace(tmp, os.path.join(d, name))  # atomic: a running container may be reading it
        if run.sa_dir is None:
            log(f"pod {run.key}: token of serviceaccount {ns}/{sa} mounted at {SA_MOUNT}")
        run.sa_dir, run.waiting = d, None
        run.sa_refresh_at = time.time() + SA_TOKEN_SECONDS * 0.8  # the kubelet renews at 80% of the TTL
        return True

    def field(self, run, path):
        md = run.pod["metadata"]
        vals = {"status.podIP": run.ip, "status.podIPs": run.ip, "status.hostIP": self.net.host_ip,
                "metadata.name": md["name"], "metadata.namespace": md["namespace"], "metadata.uid": md["uid"],
                "spec.nodeName": self.node, "spec.serviceAccountName": run.pod["spec"].get("serviceAccountName", "")}
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        return (md.get(m[1]) or {}).get(m[2], "") if m else vals.get(path)

    def start(self, run, c):
        spec, md = c.spec, run.pod["metadata"]
        env = {}
        for e in spec.get("env") or []:
            if "valueFrom" in e:
                ref = e["valueFrom"].get("fieldRef")
                val = self.field(run, ref["fieldPath"]) if ref else None
                if val is None:
                    log(f"warning: pod {run.key} container {c.name}: env {e['name']}: unsupported valueFrom {e['valueFrom']}; skipped")
                    continue
                env[e["name"]] = val
            else:
                env[e["name"]] = expand(e.get("value", ""), env)
        if self.sa_tokens:  # what the kubelet sets for in-cluster clients (here: the real API server)
            host, port = self.net.api_endpoint(self.api.load().host, self.api.port)
            env.setdefault("KUBERNETES_SERVICE_HOST", host)
            env.setdefault("KUBERNETES_SERVICE_PORT", str(port))
        term_file = os.path.join(run.dir, f"{c.name}.termination-log")
        open(term_file, "w").close()
        os.chmod(term_file, 0o666)  # as the kubelet's: writable by a non-root container user
        c.log_path = os.path.join(self.state, "logs", f"{md['namespace']}_{md['name']}_{c.name}.log")
        c.started_at, c.term_file = now_rfc3339(), term_file
        term_path = spec.get("terminationMessagePath") or "/dev/termination-log"
        binds = list(run.mounts[c.name]) + [(self.hosts_path, "/etc/hosts", False), (term_file, term_path, False)]
        if self.net.resolv_conf:
            binds.append((self.net.resolv_conf, "/etc/resolv.conf", True))
        image = spec.get("image") or ""
        mode = "image" if not self.host_binaries and image and image_rootfs.image_exists(image) else "host"
        argv = []
        try:
            if mode == "image":
                err, argv, popen = self.from_image(run, c, image, env, binds)
            else:
                err, argv, popen = self.from_host(run, c, env, binds)
            if err is None:
                with open(c.log_path, "ab") as logf:
                    c.proc = subprocess.Popen(
                        self.net.enter_argv(run.uid) + popen["argv"], stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                        env=popen["env"], cwd=popen["cwd"], start_new_session=True, preexec_fn=set_pdeathsig)
        except (OSError, RuntimeError, ValueError) as e:
            err = f"starting container {c.name} ({mode}): {e}"
        if err:
            self.release_rootfs(c)
            log(f"pod {run.key} container {c.name} failed to start: {err}")
            with open(c.log_path, "a") as f:
                f.write(f"node-agent: {err}\n")
            c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": err,
                                      "startedAt": c.started_at, "finishedAt": now_rfc3339()}}
            self.after_exit(run, c, 128)
            return
        c.state = {"running": {"startedAt": c.started_at}}
        c.run_since, self.hosts_dirty = time.time(), True
        log(f"started {run.key} container {c.name} pid {c.proc.pid} ip {run.ip}"
            f"{' image ' + image if c.rootfs else ''}: {shlex.join(argv)}")

    def from_host(self, run, c, env, binds):
        """A plain process of this machine: command[0] from --bin-dir, then PATH; the binds on the
        host's own root inside the container's mount namespace. Returns (err, argv, popen)."""
        spec, md = c.spec, run.pod["metadata"]
        argv = [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        if not spec.get("command"):
            return "container has no command (no image in local storage to take one from; set command)", argv, None
        if "/" in argv[0]:
            exe = argv[0]
        else:
            cand = os.path.join(self.bin_dir, argv[0])
            exe = cand if os.access(cand, os.X_OK) and os.path.isfile(cand) else shutil.which(argv[0], path=self.path)
            if not exe:
                return f"executable {argv[0]!r} not found in {self.bin_dir} or PATH", argv, None
        script = []
        for src, dst, ro in binds:
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)  # mount points must exist on the host
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not os.path.exists(dst):
                    open(dst, "a").close()
            sq, dq = shlex.quote(src), shlex.quote(dst)
            script.append(f"mount --bind {sq} {dq}" + (f" && mount -o remount,bind,ro {dq}" if ro else "")
                          + f" || {{ echo 'node-agent: cannot bind-mount {sq} on {dq}' >&2; exit 128; }}")
        script.append('"$@"\nexit $?')  # sh stays pid 1: when it exits, the kernel kills the rest
        cwd = spec.get("workingDir") or run.dir
        os.makedirs(cwd, exist_ok=True)
        return None, argv, {
            "argv": ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--propagation",
                     "private", "--", "/bin/sh", "-c", "\n".join(script), "sh", exe] + argv[1:],
            "env": {"PATH": self.path, "HOSTNAME": md["name"], "HOME": "/root", **env}, "cwd": cwd}

    def from_image(self, run, c, image, env, binds):
        """The container's image, as a kubelet would run it: command/args over the image's
        ENTRYPOINT/CMD, the image's Env under the pod's, runAsUser/runAsGroup (else the image's
        USER), fsGroup/supplementalGroups, readOnlyRootFilesystem, runAsNonRoot. Returns
        (err, argv, popen); c.rootfs holds the mounted working container until reap."""
        spec, md = c.spec, run.pod["metadata"]
        rootfs = c.rootfs = image_rootfs.Rootfs(
            image, name=f"kubetrain-{self.node}-{run.uid[:8]}-{c.name}-{c.restarts}")
        cfg = rootfs.config
        img_env = dict(e.partition("=")[::2] for e in cfg.get("Env") or [])
        env = {**img_env, "HOSTNAME": md["name"], "HOME": "/", **env}
        command, args = spec.get("command"), spec.get("args")
        if command:
            argv = command + (args or [])
        else:  # the Kubernetes rules: args alone replace CMD, keeping ENTRYPOINT
            argv = (cfg.get("Entrypoint") or []) + (args if args is not None else (cfg.get("Cmd") or []))
        argv = [expand(a, env) for a in argv]
        if not argv:
            return f"image {image} has no ENTRYPOINT/CMD and the container no command", argv, None
        path = env.get("PATH") or image_rootfs.DEFAULT_PATH
        if not self.in_image(rootfs, argv[0], path):
            return f"executable {argv[0]!r} not found in image {image} (PATH {path})", argv, None
        sc = {**(run.pod["spec"].get("securityContext") or {}), **(spec.get("securityContext") or {})}
        img_uid, img_gid = rootfs.user()
        uid = sc.get("runAsUser", img_uid)
        gid = sc.get("runAsGroup", img_gid)
        if sc.get("runAsNonRoot") and uid == 0:
            return (f"container has runAsNonRoot and image {image} will run as root (uid 0)"
                    " (CreateContainerConfigError)"), argv, None
        groups = [g for g in [sc.get("fsGroup")] + list(sc.get("supplementalGroups") or []) if g is not None]
        read_only = bool((spec.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        workdir = spec.get("workingDir") or cfg.get("WorkingDir") or "/"
        target = os.path.join(run.dir, f"root-{c.name}")
        popen_argv = image_rootfs.run_argv(rootfs, target, binds, argv, read_only=read_only, uid=uid, gid=gid,
                                           groups=groups, workdir=workdir, env_path=path)
        host_env = {k: v for k, v in env.items() if k != "PATH"}
        host_env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # the host's sh, mount and chroot
        return None, argv, {"argv": popen_argv, "env": host_env, "cwd": run.dir}

    @staticmethod
    def in_image(rootfs, name, path):
        """Whether NAME resolves to an executable inside the image (absolute, or on PATH)."""
        cands = [name] if "/" in name else [os.path.join(d, name) for d in path.split(":") if d]
        for cand in cands:
            p = rootfs.resolve(cand)  # its symlinks inside the image, not on the host
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return True
        return False

    def release_rootfs(self, c):
        if c.rootfs is not None:
            c.rootfs.close()
            c.rootfs = None

    def reap(self, run, c):
        code = c.proc.returncode
        code = 128 - code if code < 0 else code
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)  # the container's other processes go with it
        except OSError:
            pass
        msg = b""
        try:
            with open(c.term_file, "rb") as f:
                f.seek(max(0, os.path.getsize(c.term_file) - 4096))
                msg = f.read()
        except OSError:
            pass
        if not msg and code and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with open(c.log_path, "rb") as f:
                msg = b"".join(f.readlines()[-80:])[-2048:]
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": c.started_at, "finishedAt": now_rfc3339(), "containerID": f"kubetrain-agent://{c.proc.pid}"}
        if msg:
            term["message"] = msg.decode(errors="replace")
        c.state = {"terminated": term}
        log(f"pod {run.key} container {c.name} pid {c.proc.pid} exited {code}")
        self.release_rootfs(c)
        c.proc, self.hosts_dirty = None, True
        if time.time() - c.run_since >= BACKOFF_CAP:
            c.backoff = BACKOFF_START
        self.after_exit(run, c, code)

    def after_exit(self, run, c, code):
        policy = run.pod["spec"].get("restartPolicy", "Always")
        if run.kill_deadline is None and (policy == "Always" or (policy == "OnFailure" and code != 0)):
            c.next_start = time.time() + c.backoff
            log(f"pod {run.key} container {c.name}: restarting in {c.backoff:g}s (restartPolicy {policy})")
            c.backoff = min(c.backoff * 2, BACKOFF_CAP)
        else:
            c.done = True

    def begin_termination(self, run, grace):
        run.kill_deadline = time.time() + grace
        for c in run.containers:
            c.done = True
            if c.proc:
                log(f"pod {run.key}: SIGTERM container {c.name} pid {c.proc.pid}")
                try:
                    os.killpg(c.proc.pid, signal.SIGTERM)
                except OSError:
                    pass

    def tick(self):
        now = time.time()
        self.netpol.sync(self.runs.values())  # before a new pod's containers start
        if self.hosts_dirty:
            self.write_hosts()  # before starting containers, so their names resolve at once
        for run in list(self.runs.values()):
            try:
                self.sync_pod(run, now)
            except Exception as e:  # e.g. API server unreachable: retried next tick
                log(f"syncing pod {run.key} failed: {e!r}")
        if self.hosts_dirty:
            self.write_hosts()

    def sync_pod(self, run, now):
        if run.mounts is None and run.kill_deadline is None and not self.setup_volumes(run):
            if run.waiting:
                self.report(run)
            return
        if run.sa_dir and run.kill_deadline is None and now >= run.sa_refresh_at \
                and not all(c.done for c in run.containers):
            self.write_sa_token(run)  # on failure the old token stays; retried after SA_RETRY
            run.sa_refresh_at = max(run.sa_refresh_at, run.sa_retry_at)
        for c in run.containers:
            if c.proc and c.proc.poll() is not None:
                self.reap(run, c)
            if not c.proc and not c.done and run.mounts is not None and now >= c.next_start:
                if c.state and "terminated" in c.state:
                    c.last_state, c.restarts = c.state, c.restarts + 1
                if run.sent is None:
                    self.report(run)  # ContainerCreating first: mounting an image takes a moment
                self.start(run, c)
        running = [c for c in run.containers if c.proc]
        if run.kill_deadline is not None:
            if running and now >= run.kill_deadline and not run.killed:
                run.killed = True
                for c in running:
                    log(f"pod {run.key}: grace period over; SIGKILL container {c.name} pid {c.proc.pid}")
                    try:
                        os.killpg(c.proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
            if not running:
                self.finish(run)
                return
        self.report(run)
        if run.phase in ("Succeeded", "Failed") and not running:
            self.net.remove(run.uid, run.ip)  # a finished pod's sandbox goes at once, as on a node

    def finish(self, run):
        """All processes of a terminating/vanished pod are gone: final status, delete, release."""
        self.net.remove(run.uid, run.ip)  # before the pod object goes, as the kubelet tears down the sandbox
        if not run.vanished:
            self.report(run)
            self.force_delete(run.pod["metadata"])
        self.runs.pop(run.uid, None)
        shutil.rmtree(run.dir, ignore_errors=True)
        self.hosts_dirty = True
        log(f"pod {run.key} removed; released ip {run.ip}")

    def status_of(self, run):
        cs, t = [], now_rfc3339()
        for c in run.containers:
            st = c.state or {"waiting": ({"reason": run.waiting[0], "message": run.waiting[1]} if run.waiting
                                         else {"reason": "ContainerCreating"})}
            last = c.last_state or {}
            if "terminated" in st and not c.done and not c.proc:
                # As the kubelet: while it backs off, the run that just ended is lastState.
                last = st
                st = {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": f"back-off restarting failed container {c.name}"}}
            s = {"name": c.name, "image": c.spec.get("image", ""), "imageID": "", "ready": bool(c.proc),
                 "started": bool(c.proc), "restartCount": c.restarts, "state": st, "lastState": last}
            if c.proc:
                s["containerID"] = f"kubetrain-agent://{c.proc.pid}"
            elif "terminated" in st:
                s["containerID"] = st["terminated"].get("containerID", "")
            cs.append(s)
        if all(c.done and not c.proc for c in run.containers) and (run.kill_deadline is None or run.mounts):
            codes = [(c.state or {}).get("terminated", {}).get("exitCode", 1) for c in run.containers]
            run.phase = "Succeeded" if all(x == 0 for x in codes) else "Failed"
        elif any(c.proc for c in run.containers) or any(c.state for c in run.containers):
            run.phase = "Running" if run.phase == "Pending" else run.phase
        ready = all(c.proc for c in run.containers)
        want = {"PodScheduled": True, "Initialized": True, "ContainersReady": ready, "Ready": ready}
        for typ, ok in want.items():
            st = "True" if ok else "False"
            if run.conds.get(typ, {}).get("status") != st:
                run.conds[typ] = {"type": typ, "status": st, "lastProbeTime": None, "lastTransitionTime": t}
                if not ok:
                    run.conds[typ]["reason"] = "PodCompleted" if run.phase in ("Succeeded", "Failed") else "ContainersNotReady"
        return {"phase": run.phase, "hostIP": self.net.host_ip, "hostIPs": [{"ip": self.net.host_ip}], "podIP": run.ip,
                "podIPs": [{"ip": run.ip}], "startTime": run.start_time, "conditions": list(run.conds.values()),
                "containerStatuses": cs}

    def report(self, run):
        if run.vanished:
            return
        status = self.status_of(run)
        if status == run.sent:
            return
        md = run.pod["metadata"]
        try:
            self.api("PATCH", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status",
                     {"metadata": {"uid": run.uid}, "status": status}, "application/merge-patch+json")
            if (run.sent or {}).get("phase") != status["phase"]:
                log(f"pod {run.key} phase {status['phase']}")
                if status["phase"] in ("Succeeded", "Failed"):
                    self.hosts_dirty = True
            run.sent = status
        except ApiError as e:
            if e.status in (404, 409):
                run.sent = status  # pod gone or replaced; its DELETED event will follow
            else:
                log(f"status update of {run.key} failed: {e}")
        except Exception as e:
            log(f"status update of {run.key} failed: {e}")

    # --- hosts file (headless Service DNS) -------------------------------------------------
    def write_hosts(self):
        lines = []
        for (ns, name), svc in sorted(self.services.items()):
            spec = svc.get("spec", {})
            sel = spec.get("selector") or {}
            if spec.get("clusterIP") != "None" or not sel:
                continue
            for run in self.runs.values():
                md = run.pod["metadata"]
                labels = md.get("labels") or {}
                if md["namespace"] != ns or run.phase in ("Succeeded", "Failed") or run.kill_deadline is not None \
                        or any(labels.get(k) != v for k, v in sel.items()):
                    continue
                if not spec.get("publishNotReadyAddresses") and not all(c.proc for c in run.containers):
                    continue
                names = [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
                if run.pod["spec"].get("subdomain") == name:
                    h = run.pod["spec"].get("hostname") or md["name"]
                    names.insert(0, f"{h}.{name}.{ns}.svc.cluster.local")
                lines.append(f"{run.ip}\t{' '.join(names)}")
        text = self.hosts_base + "# kubetrain node agent: headless Services\n" + "".join(l + "\n" for l in lines)
        self.hosts_dirty = False
        if text != self.hosts_text:
            with open(self.hosts_path, "r+") as f:  # in place: pods bind-mount this inode
                f.write(text)
                f.truncate()
            self.hosts_text = text
            log(f"hosts file updated ({len(lines)} entries)")

    # --- main -------------------------------------------------------------------------------
    def run(self):
        self.register_node()
        self.write_hosts()
        for target, args in ((self.heartbeat_loop, ()), (self.watch_loop, ("services", "/api/v1/services")),
                             (self.watch_loop, ("pods", "/api/v1/pods")),
                             (self.watch_loop, ("networkpolicies", "/apis/networking.k8s.io/v1/networkpolicies")),
                             (self.watch_loop, ("namespaces", "/api/v1/namespaces"))):
            threading.Thread(target=target, args=args, daemon=True).start()
        log(f"node {self.node} ready; state {self.state}")
        while not self.stop.is_set():
            try:
                deadline = time.time() + 0.2
                while True:
                    kind, typ, obj = self.q.get(timeout=max(0.0, deadline - time.time()))
                    if kind == "pods":
                        self.on_pods(typ, obj)
                    elif kind == "services":
                        self.on_services(typ, obj)
                    else:
                        self.netpol.on_event(kind, typ, obj)
            except queue.Empty:
                pass
            except Exception as e:
                log(f"error handling event: {e!r}")
            try:
                self.tick()
            except Exception as e:
                log(f"error in sync loop: {e!r}")
        self.shutdown()

    def shutdown(self):
        procs = [(r, c) for r in self.runs.values() for c in r.containers if c.proc]
        log(f"stopping: killing {len(procs)} container processes")
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            for _, c in procs:
                try:
                    os.killpg(c.proc.pid, sig)
                except OSError:
                    pass
            end = time.time() + wait
            while time.time() < end and any(c.proc.poll() is None for _, c in procs):
                time.sleep(0.05)
        for r in self.runs.values():
            for c in r.containers:
                self.release_rootfs(c)
        self.net.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--node-name", default="kubetrain-node-0")
    ap.add_argument("--service-account-tokens", action="store_true",
                    help="mount a TokenRequest token of the pod's ServiceAccount (+ ca.crt, namespace) at "
                         f"{SA_MOUNT} and set KUBERNETES_SERVICE_HOST/PORT, as the kubelet does")
    ap.add_argument("--host-binaries", action="store_true",
                    help="always run containers as processes of this machine (command[0] from --bin-dir), "
                         "even when their image is in local storage (a fast mode for development)")
    ap.add_argument("--pod-network", choices=("netns", "loopback"), default="netns",
                    help="netns: each pod in its own network namespace on a bridge (any port, localhost is the "
                         "pod's own); loopback: the host network, a 127.10.x.y address per pod")
    args = ap.parse_args()
    os.makedirs(args.state_dir, exist_ok=True)
    args.state_dir = os.path.abspath(args.state_dir)
    agent = Agent(args)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: agent.stop.set())
    agent.run()


if __name__ == "__main__":
    main()
