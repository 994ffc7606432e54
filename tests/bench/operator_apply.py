#!/usr/bin/env python3
"""One TrainingJob applied → all its pods and Services exist, against a real
kube-apiserver + etcd (tests/cluster/up.sh, no kubelet: pods stay Pending, so
only the controller is measured), compared with a plain client creating the
same objects (a pod and a headless Service per task, one ConfigMap) all in
parallel on warm keep-alive connections, in the same run.

Both sides are timed the same way: from the first POST (the job's, for the
operator; on a warm keep-alive connection for both) until a watch on pods
and one on Services (opened by this benchmark before the round) have seen
every object ADDED. Each round uses new names and is cleaned up before the
next. Prints the median, min and max per shape; last line:

  ps1_w4_ms=… ps1_w4_ref_ms=… ps1_w4_ratio=… ps2_w8_ms=… ps2_w8_ref_ms=… ps2_w8_ratio=… rounds=15

ratio = median operator time / median plain-client time.

With --timeline the API server writes an audit log (level Metadata), and for
each shape the benchmark prints every request of its median operator round
and of its median plain-client round: when the API server received it and
when it answered, in ms from the round's first request, with the client
(user agent; this benchmark's own requests send none), verb and object. That
shows where a round's time goes (which requests wait for which) without
instrumenting the operator. The audit log costs the API server some CPU, so
compare ratios from runs without it.

  tests/bench/operator_apply [--rounds 15] [--shapes 1x4,2x8] [--timeline] [-- operator flags]
"""
import argparse
import datetime
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "scale"))
sys.path.insert(0, os.path.join(ROOT, "tests", "operator"))
from kube_api import KubeApi  # noqa: E402
from run_scale import NS, Operator, start_cluster, stop_cluster  # noqa: E402


class Watcher:
    """Watches one resource in NS from a resourceVersion and records when
    each name was first ADDED."""

    def __init__(self, api, resource):
        self.api, self.resource = api, resource
        self.seen = {}
        self.cond = threading.Condition()
        rv = api.get(f"/api/v1/namespaces/{NS}/{resource}")["metadata"]["resourceVersion"]
        host = api.server.split("//", 1)[1]
        self.conn = http.client.HTTPSConnection(host, context=api.ctx, timeout=3600)
        self.conn.request("GET", f"/api/v1/namespaces/{NS}/{resource}?watch=1&resourceVersion={rv}",
                          headers={"Authorization": f"Bearer {api.token}"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.status
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            line = self.resp.readline()
            if not line:
                return
            ev = json.loads(line)
            if ev["type"] == "ADDED":
                with self.cond:
                    self.seen.setdefault(ev["object"]["metadata"]["name"], time.time())
                    self.cond.notify_all()

    def wait_all(self, names, timeout=120):
        """When the last of `names` was ADDED."""
        deadline = time.time() + timeout
        with self.cond:
            while not all(n in self.seen for n in names):
                left = deadline - time.time()
                if left <= 0:
                    missing = [n for n in names if n not in self.seen]
                    raise RuntimeError(f"{self.resource} never ADDED: {missing[:5]}")
                self.cond.wait(left)
            return max(self.seen[n] for n in names)


def tasks(prefix, ps, workers):
    return [f"{prefix}-ps-{i}" for i in range(ps)] + [f"{prefix}-worker-{i}" for i in range(workers)]


def job(name, ps, workers):
    return {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicaSpecs": {"PS": {"replicas": ps, "restartPolicy": "OnFailure"},
                                      "Worker": {"replicas": workers, "restartPolicy": "Never"}},
                     "training": {"model": {"type": "softmax"}, "steps": 10}}}


class PlainClient:
    """Creates objects all at once, one request per keep-alive connection
    (opened and warmed before the clock starts, as an informer-based
    controller's client would be)."""

    def __init__(self, api, connections):
        self.api = api
        host = api.server.split("//", 1)[1]
        self.conns = [http.client.HTTPSConnection(host, context=api.ctx, timeout=60)
                      for _ in range(connections)]
        for c in self.conns:
            self._send(c, "GET", f"/api/v1/namespaces/{NS}/configmaps?limit=1", None)

    def _send(self, conn, method, path, body):
        conn.request(method, path, None if body is None else json.dumps(body),
                     {"Authorization": f"Bearer {self.api.token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status

    def post_job(self, body):
        """POSTs a TrainingJob on the first connection (warm, as the plain
        client's are: a new TLS handshake per job would be the benchmark's
        cost, not the operator's)."""
        conn = self.conns[0]
        conn.request("POST", f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs", json.dumps(body),
                     {"Authorization": f"Bearer {self.api.token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 201:
            raise RuntimeError(f"POST trainingjob: {resp.status}")

    def post_all(self, items):
        assert len(items) <= len(self.conns), (len(items), len(self.conns))
        errors = []

        def one(conn, resource, body):
            status = self._send(conn, "POST", f"/api/v1/namespaces/{NS}/{resource}", body)
            if status != 201:
                errors.append((resource, status))

        threads = [threading.Thread(target=one, args=(c, *it)) for c, it in zip(self.conns, items)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"plain client POSTs failed: {errors[:5]}")


def wait_gone(api, names):
    deadline = time.time() + 120
    while time.time() < deadline:
        left = {o["metadata"]["name"] for r in ("pods", "services")
                for o in api.get(f"/api/v1/namespaces/{NS}/{r}")["items"]}
        if not left & set(names):
            return
        time.sleep(0.2)
    raise RuntimeError(f"objects not cleaned up: {sorted(left & set(names))[:5]}")


def operator_round(api, client, pods, services, name, ps, workers):
    names = tasks(name, ps, workers)
    t0 = time.time()
    client.post_job(job(name, ps, workers))
    done = max(pods.wait_all(names), services.wait_all(names))
    api.request("DELETE", f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs/{name}")
    wait_gone(api, names)
    return (done - t0) * 1000


def reference_round(api, client, pods, services, name, ps, workers):
    names = tasks(name, ps, workers)
    items = [("configmaps", {"metadata": {"name": f"{name}-config"}, "data": {"a": "b"}})]
    for t in names:
        items.append(("services", {"metadata": {"name": t}, "spec": {
            "clusterIP": "None", "selector": {"r": t}, "ports": [{"port": 2222}]}}))
        items.append(("pods", {"metadata": {"name": t}, "spec": {
            "containers": [{"name": "kubetrain", "image": "kubetrain-runtime:latest"}]}}))
    t0 = time.time()
    client.post_all(items)
    done = max(pods.wait_all(names), services.wait_all(names))
    for r, body in items:
        api.request("DELETE", f"/api/v1/namespaces/{NS}/{r}/{body['metadata']['name']}?gracePeriodSeconds=0")
    wait_gone(api, names)
    return (done - t0) * 1000


AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


def enable_audit_log():
    """Makes the API server that start_cluster() starts write an audit log of
    every request (tests/cluster/up.sh passes KUBETRAIN_APISERVER_EXTRA_ARGS
    on). Returns the log's path."""
    d = tempfile.mkdtemp(prefix="kubetrain-bench-audit.")
    with open(os.path.join(d, "policy.yaml"), "w") as f:
        f.write(AUDIT_POLICY)
    log = os.path.join(d, "audit.log")
    os.environ["KUBETRAIN_APISERVER_EXTRA_ARGS"] = " ".join([
        os.environ.get("KUBETRAIN_APISERVER_EXTRA_ARGS", ""),
        f"--audit-policy-file={d}/policy.yaml", f"--audit-log-path={log}",
        "--audit-log-mode=blocking"]).strip()
    return log


def _audit_time(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def round_timeline(audit_events, prefix):
    """The requests of the round whose objects are named `prefix…` (the job,
    its pods, Services, ConfigMap, Secret, NetworkPolicy), with those any
    client made in between (Events, status writes, other watches' lists), up
    to the last create of the round: [(received_ms, answered_ms, agent, verb,
    object, code)], ms from the round's first request."""
    mine = [e for e in audit_events if e.get("verb") == "create"
            and e.get("objectRef", {}).get("name", "").startswith(prefix)]
    if not mine:
        return []
    start = min(_audit_time(e["requestReceivedTimestamp"]) for e in mine)
    end = max(_audit_time(e["stageTimestamp"]) for e in mine)
    rows = []
    for e in audit_events:
        got = _audit_time(e["requestReceivedTimestamp"])
        if not start <= got <= end or e.get("verb") == "watch":
            continue
        o = e.get("objectRef", {})
        what = o.get("resource", "") + "/" + o.get("name", "") + (
            "/" + o["subresource"] if o.get("subresource") else "")
        rows.append(((got - start) * 1000, (_audit_time(e["stageTimestamp"]) - start) * 1000,
                     e.get("userAgent", "").split("/")[0][:20] or "(no user agent)", e.get("verb", ""), what,
                     e.get("responseStatus", {}).get("code")))
    return sorted(rows)


def print_timelines(audit_log, rounds):
    """rounds: [(label, name prefix)]."""
    with open(audit_log) as f:
        events = [json.loads(line) for line in f if line.strip()]
    for label, prefix in rounds:
        print(f"timeline of {label} ({prefix}): received ms, answered ms, client, verb, object, code")
        for got, done, agent, verb, what, code in round_timeline(events, prefix):
            print(f"  {got:7.1f} {done:7.1f}  {agent:20} {verb:7} {what} {code}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shapes", default="1x4,2x8", help="PSxWorkers, comma-separated")
    ap.add_argument("--qps", type=float, default=100, help="the operator's --kube-api-qps")
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--timeline", action="store_true",
                    help="audit-log the API server and print the median rounds' requests")
    ap.add_argument("operator_flags", nargs="*")
    args = ap.parse_args()
    audit_log = enable_audit_log() if args.timeline else None
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]

    state, env = start_cluster("kubetrain-bench-operator.")
    op = Operator(env["KUBECONFIG"], state, args.operator_flags)
    op.qps, op.burst = args.qps, args.burst
    try:
        api = KubeApi(env["KUBECONFIG"])
        op.start()
        pods, services = Watcher(api, "pods"), Watcher(api, "services")
        client = PlainClient(api, max(2 * (ps + w) + 1 for ps, w in shapes))
        fields = []
        timelines = []
        for ps, workers in shapes:
            key = f"ps{ps}_w{workers}"
            tag = key.replace("_", "-")
            # One untimed round each to warm connections and caches.
            operator_round(api, client, pods, services, f"warm-{tag}", ps, workers)
            reference_round(api, client, pods, services, f"refwarm-{tag}", ps, workers)
            op_ms, ref_ms = [], []
            for r in range(args.rounds):  # interleaved, so both see the same machine
                op_ms.append(operator_round(api, client, pods, services, f"b{r}-{tag}", ps, workers))
                ref_ms.append(reference_round(api, client, pods, services, f"r{r}-{tag}", ps, workers))
            op_med, ref_med = statistics.median(op_ms), statistics.median(ref_ms)
            # The round nearest each median (median_low: an actual round).
            op_r = op_ms.index(statistics.median_low(op_ms))
            ref_r = ref_ms.index(statistics.median_low(ref_ms))
            timelines += [(f"the median operator round, {key}", f"b{op_r}-{tag}"),
                          (f"the median plain-client round, {key}", f"r{ref_r}-{tag}")]
            print(f"{ps} PS + {workers} workers ({2 * (ps + workers)} pods+Services): operator "
                  f"median {op_med:.0f} ms (min {min(op_ms):.0f}, max {max(op_ms):.0f}); plain client "
                  f"median {ref_med:.0f} ms (min {min(ref_ms):.0f}, max {max(ref_ms):.0f})", flush=True)
            fields += [f"{key}_ms={op_med:.0f}", f"{key}_ref_ms={ref_med:.0f}", f"{key}_ratio={op_med / ref_med:.2f}"]
        if audit_log:
            print_timelines(audit_log, timelines)
        print(" ".join(fields + [f"rounds={args.rounds}"]), flush=True)
    finally:
        if op.proc and op.proc.poll() is None:
            op.proc.kill()
        stop_cluster(env)


if __name__ == "__main__":
    main()
