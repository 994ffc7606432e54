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
Python 3.11 stdlib only. See tests/cluster/README.md ("Node agent"). The agent's parts: this file
(the node, the watches, each pod's lifecycle and status), pod_process.py (starting and reaping
containers), pod_volumes.py (volumes and ServiceAccount tokens), agent_base.py (log, constants,
API client), pod_network.py, netpolicy.py, image_rootfs.py.

Usage: node_agent.py --kubeconfig PATH --bin-dir DIR --state-dir DIR [--node-name NAME]
                     [--service-account-tokens] [--host-binaries] [--pod-network netns|loopback]
"""
import argparse, json, os, queue, shutil, signal, sys, threading, time, urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netpolicy  # noqa: E402
import pod_network  # noqa: E402
from agent_base import (Api, ApiError, BACKOFF_CAP, DEFAULT_GRACE, GRACE_CAP, HEARTBEAT,  # noqa: E402
                        SA_MOUNT, WATCH_TIMEOUT, log, now_rfc3339)
from pod_process import ContainerRunner, PodRun  # noqa: E402
from pod_volumes import PodVolumes  # noqa: E402


class Agent(PodVolumes, ContainerRunner):
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
