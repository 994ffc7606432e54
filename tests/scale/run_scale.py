#!/usr/bin/env python3
"""The operator at scale, without kubelets: a real kube-apiserver + etcd
(tests/cluster/up.sh), kwok (tests/scale/build_kwok.sh) simulating fake
nodes and pod lifecycles (tests/scale/kwok.yaml: Pending -> Running after
0.5-2 s -> Succeeded after 3-7 s more), and the real kubetrain-operator.

N TrainingJobs of 1 PS + 4 workers are created at once and go through
creation, running, success and deletion (the operator removes their
objects). With --kill-operator the operator is SIGKILLed once half the pods
exist and started again. Checks: every job Succeeded, every object of every
job (pod, Service, ConfigMap, Secret, NetworkPolicy) created exactly once (the
API server's own count of POSTs that succeeded), everything cleaned up. Prints the figures, last line:

  jobs=… pods=… create_s=… finish_s=… cleanup_s=… op_rss_mib=… op_cpu_s=… operator_restarts=…
  ref_create_s=… create_ratio=… api_requests_per_object=…

create_s: from the first job POST until the operator's cache holds every
object of every job; finish_s: until every job is Succeeded; op_rss_mib: the
operator's peak RSS (VmHWM); op_cpu_s: its user+system CPU; api_requests_per_object:
the operator's requests (testlib.operator_requests, the filter
tests/operator/test_api_budget.py uses too: its requests on pods, Services,
ConfigMaps, Secrets, NetworkPolicies, Events and trainingjobs/status, plus
its watches; less kwok's DELETEs that end graceful deletions, the kubelet's
part, counted in kwok's log) per object it created (testlib.operator_objects: a pod
and a Service per task, a ConfigMap, a Secret and a NetworkPolicy per job).
ref_create_s: a plain client (16 keep-alive connections, the same token
bucket) creating the same objects in the same run, after the operator's run; create_ratio = create_s / ref_create_s.

  tests/scale/run_scale.py [--jobs 1000] [--nodes 20] [--kill-operator] [-- operator flags]
"""
import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import http.client
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "operator"))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
from kube_api import KubeApi, delta, request_counts  # noqa: E402
import testlib  # noqa: E402
from testlib import (OPERATOR_KINDS, expected_creates, free_port,  # noqa: E402
                     operator_objects, operator_requests)

CACHE = os.environ.get("KUBETRAIN_CACHE", os.path.expanduser("~/.cache/kubetrain"))
NS = "scale"
WORKERS = 4


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def metric(text, name, labels=""):
    m = re.search(rf"^{name}{{?{re.escape(labels)}}}? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


class Operator:
    def __init__(self, kubeconfig, state, extra):
        self.kubeconfig, self.state, self.extra = kubeconfig, state, extra
        self.proc = None
        self.port = None
        self.rss_peak_kib = 0
        self.cpu_s = 0.0
        self.starts = 0

    def start(self):
        self.port = free_port()
        self.starts += 1
        out = open(os.path.join(self.state, f"operator.{self.starts}.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(ROOT, "bin", "kubetrain-operator"), "--kubeconfig", self.kubeconfig,
             f"--metrics_address=127.0.0.1:{self.port}", "--health_address=", f"--namespace={NS}",
             f"--kube-api-qps={self.qps}", f"--kube-api-burst={self.burst}", *self.extra], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the operator's /metrics never came up")

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def sample(self):
        """Peak RSS and CPU so far (of the running process)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                hwm = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, AttributeError):
            return None
        self.rss_peak_kib = max(self.rss_peak_kib, hwm)
        return cpu

    def stop(self, sig=signal.SIGTERM):
        cpu = self.sample()
        if cpu is not None:
            self.cpu_s += cpu
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)


def cache_counts(op):
    text = op.metrics()
    return {r: metric(text, "kubetrain_operator_cache_objects", f'resource="{r}"') or 0
            for r in OPERATOR_KINDS}


# A pod labelled so ends Failed with this exit code (the pod-fail stage, fail_stage());
# one labelled HOLD_LABEL keeps running (kwok.yaml's pod-complete skips both).
EXIT_LABEL = "scale.kubetrain.io/exit-code"
HOLD_LABEL = "scale.kubetrain.io/hold"
# What a job of each kind ends as: (state, condition reason).
OUTCOMES = {"plain": ("Succeeded", None), "failing": ("Failed", "TrainingJobFailed"),
            "retrying": ("Failed", "BackoffLimitExceeded")}


def job(name, node, kind="plain", backoff_limit=2):
    """plain: succeeds. failing: its workers exit 1 under restartPolicy Never (the job
    fails). retrying: its PS exits 137 under restartPolicy ExitCode (retried: the
    operator recreates it, backoffLimit times, then the job fails) while its workers
    keep running (so the job cannot succeed meanwhile: the count is exact)."""
    def template(**labels):
        return {"metadata": {"labels": labels}, "spec": {"nodeName": node}} if labels else \
            {"spec": {"nodeName": node}}
    ps, ps_policy, worker, worker_policy = template(), "OnFailure", template(), "Never"
    if kind == "failing":
        worker = template(**{EXIT_LABEL: "1"})
    elif kind == "retrying":
        ps, ps_policy, worker = template(**{EXIT_LABEL: "137"}), "ExitCode", template(**{HOLD_LABEL: "true"})
    spec = {"replicaSpecs": {
        "PS": {"replicas": 1, "restartPolicy": ps_policy, "template": ps},
        "Worker": {"replicas": WORKERS, "restartPolicy": worker_policy, "template": worker}},
        "training": {"model": {"type": "softmax"}, "steps": 10}}
    if kind == "retrying":
        spec["runPolicy"] = {"backoffLimit": backoff_limit}
    return {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def outcome(job):
    """(state, reason of its Failed condition or None) of a finished job."""
    status = job.get("status", {})
    reason = next((c.get("reason") for c in status.get("conditions", [])
                   if c.get("type") == "Failed" and c.get("status") == "True"), None)
    return status.get("state"), reason


def created_twice(state):
    """{pod: times} for the pods the operator's logs (every start) say it created more than once."""
    times = {}
    for f in sorted(os.listdir(state)):
        if f.startswith("operator.") and f.endswith(".log"):
            for m in re.finditer(r"created pods \S+?/\{([^}]*)\}", open(os.path.join(state, f)).read()):
                for name in m.group(1).split(","):
                    times[name] = times.get(name, 0) + 1
    return {n: k for n, k in times.items() if k > 1}


def describe_leftovers(pods, state):
    """What a run that leaves pods behind needs to be understood: each pod's state as the API
    server holds it, then every line of the operator's logs (every start) naming its job."""
    for pod in pods[:20]:
        md = pod["metadata"]
        print(f"left: pod {md['name']} phase={pod.get('status', {}).get('phase')} "
              f"created={md.get('creationTimestamp')} deleting={md.get('deletionTimestamp')} "
              f"rv={md.get('resourceVersion')} finalizers={md.get('finalizers')} "
              f"owner={[o.get('name') for o in md.get('ownerReferences', [])]}", flush=True)
    jobs = sorted({pod["metadata"]["name"].split("-")[0] for pod in pods[:20]})
    named = re.compile(r"\b(" + "|".join(map(re.escape, jobs)) + r")\b")
    for f in sorted(os.listdir(state)):
        if f.startswith("operator.") and f.endswith(".log"):
            for line in open(os.path.join(state, f)):
                if named.search(line):
                    print(f"  {f}: {line.rstrip()[:300]}", flush=True)


def pods_created(api):
    """Pod creates the API server answered 201 so far (since it started)."""
    return request_counts(api.metrics(), with_code=True).get(("POST", "pods", "", "201"), 0)


def job_kinds(jobs, failing, retrying):
    """{job name: kind}: the first `failing` jobs fail, the next `retrying` retry."""
    return {f"s{i}": "failing" if i < failing else "retrying" if i < failing + retrying else "plain"
            for i in range(jobs)}


def fail_stage(delay_ms, jitter_ms):
    """A kwok Stage: a Running pod labelled EXIT_LABEL ends Failed, its container
    terminated with that exit code, after delay_ms (+ up to jitter_ms)."""
    return f"""---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-fail
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.labels["{EXIT_LABEL}"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: {int(delay_ms)}
    jitterDurationMilliseconds: {int(jitter_ms)}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $code := index .metadata.labels "{EXIT_LABEL}" }}}}
      conditions:
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "False", type: Ready}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        state:
          terminated:
            exitCode: {{{{ $code }}}}
            reason: Error
            message: "kwok: exit {{{{ $code }}}}"
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: Failed
"""


class Bucket:
    """The operator's token bucket (--kube-api-qps/--kube-api-burst), for the reference client."""

    def __init__(self, qps, burst):
        self.qps, self.burst, self.tokens, self.at = qps, burst, float(burst), time.time()
        self.lock = threading.Lock()

    def wait(self):
        with self.lock:
            now = time.time()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.qps)
            self.at = now
            self.tokens -= 1
            delay = -self.tokens / self.qps if self.tokens < 0 else 0
        if delay:
            time.sleep(delay)


def reference_create_s(api, jobs, qps, burst, parallelism):
    """How long a plain client takes to create the same objects (a pod and a
    Service per task, a ConfigMap, a Secret and a NetworkPolicy per job) with the same QPS budget, on
    `parallelism` keep-alive connections. Nothing watches these objects."""
    bucket = Bucket(qps, burst)
    host = api.server.split("//", 1)[1]
    work = []
    for j in range(jobs):
        work.append(("configmaps", {"metadata": {"name": f"r{j}-config"}, "data": {"a": "b"}}))
        work.append(("secrets", {"metadata": {"name": f"r{j}-auth"}, "data": {"job.key": "YQ=="}}))
        work.append(("networkpolicies", {"metadata": {"name": f"r{j}"}, "spec": {
            "podSelector": {"matchLabels": {"r": f"r{j}"}}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"r": f"r{j}"}}}]}]}}))
        for t in ["ps-0"] + [f"worker-{w}" for w in range(WORKERS)]:
            work.append(("services", {"metadata": {"name": f"r{j}-{t}"}, "spec": {
                "clusterIP": "None", "selector": {"r": f"r{j}-{t}"}, "ports": [{"port": 2222}]}}))
            work.append(("pods", {"metadata": {"name": f"r{j}-{t}"}, "spec": {
                "containers": [{"name": "kubetrain", "image": "kubetrain-runtime:latest"}]}}))
    it = iter(work)
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPSConnection(host, context=api.ctx, timeout=60)
        while True:
            with lock:
                item = next(it, None)
            if item is None:
                return
            bucket.wait()
            api_path = "/apis/networking.k8s.io/v1" if item[0] == "networkpolicies" else "/api/v1"
            conn.request("POST", f"{api_path}/namespaces/{NS}/{item[0]}", json.dumps(item[1]),
                         {"Authorization": f"Bearer {api.token}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 201, (resp.status, item)

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(parallelism)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - t0


def start_cluster(prefix):
    """A fresh kube-apiserver + etcd (tests/cluster/up.sh) with the
    TrainingJob CRD and the namespace NS: (state dir, env with KUBECONFIG)."""
    try:
        state, env, ex = testlib.cluster_up(prefix, "up.sh", down_args=("--purge", "--quiet"))
    except testlib.ClusterUpFailed as e:
        sys.exit(str(e))
    env["KUBECONFIG"] = ex["KUBECONFIG"]
    kubectl = os.path.join(CACHE, "bin", "kubectl")
    def run(*a, attempts=1):
        for attempt in range(attempts):
            r = subprocess.run([kubectl, *a], env=env, capture_output=True, text=True)
            if r.returncode == 0:
                return
            time.sleep(1)
        raise RuntimeError(f"kubectl {' '.join(a)}: {r.stderr.strip()}")
    try:
        run("apply", "--server-side", "-f", os.path.join(ROOT, "deploy", "crd", "kubetrain.io_trainingjobs.yaml"))
        # Right after the apply, kubectl may not find the CRD yet ("not found").
        run("wait", "--for=condition=Established", "crd/trainingjobs.kubetrain.io", "--timeout=60s",
            attempts=5)
        run("create", "namespace", NS)
    except BaseException:
        stop_cluster(env)
        raise
    return state, env


def stop_cluster(env):
    testlib.cluster_down(env, "up.sh", "--purge", "--quiet", timeout=None)


def idle_cost(api, op, jobs, seconds):
    """What `jobs` finished jobs cost while nothing changes: the operator's
    requests (as the API server counts them, watches included) per job per
    minute, and its CPU, over `seconds`."""
    # The Events of the burst drain first: the operator sends them from a
    # queue at a tenth of its request budget, so they trail the jobs.
    t0, last, quiet_since = time.time(), None, time.time()
    while time.time() - t0 < 900:
        n = request_counts(api.metrics()).get(("POST", "events", ""), 0)
        if n != last:
            last, quiet_since = n, time.time()
        elif time.time() - quiet_since >= 5:
            break
        time.sleep(1)
    log(f"Events sent {time.time() - t0:.0f} s after the last job finished")
    before, cpu0 = request_counts(api.metrics()), op.sample()
    log(f"idle for {seconds:.0f} s")
    time.sleep(seconds)
    used = operator_requests(delta(request_counts(api.metrics()), before))
    cpu = op.sample() - cpu0
    per_job_min = sum(used.values()) / jobs / (seconds / 60)
    log(f"idle requests: {dict((' '.join(filter(None, k)), int(n)) for k, n in used.items())}")
    return f"idle_s={seconds:.0f} idle_requests_per_job_min={per_job_min:.3f} idle_op_cpu_s={cpu:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--kill-operator", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the plain client creating the same objects (ref_create_s)")
    ap.add_argument("--qps", type=float, default=100, help="the operator's --kube-api-qps (and the reference's)")
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--idle-seconds", type=float, default=0,
                    help="after every job Succeeded, measure what the idle operator costs over this window")
    ap.add_argument("--failing-jobs", type=int, default=0,
                    help="this many jobs' workers exit 1 under restartPolicy Never: the jobs fail")
    ap.add_argument("--retrying-jobs", type=int, default=0,
                    help="this many jobs' PS exits 137 under restartPolicy ExitCode: recreated "
                         "--backoff-limit times, then the jobs fail")
    ap.add_argument("--backoff-limit", type=int, default=2, help="runPolicy.backoffLimit of the retrying jobs")
    ap.add_argument("--fail-delay-ms", type=float, default=1000,
                    help="how long a failing pod runs before it ends Failed (kwok stage delay)")
    ap.add_argument("--fail-jitter-ms", type=float, default=1000, help="plus up to this much (kwok jitter)")
    ap.add_argument("operator_flags", nargs="*")
    args = ap.parse_args()
    kinds = job_kinds(args.jobs, args.failing_jobs, args.retrying_jobs)
    failures = args.failing_jobs + args.retrying_jobs > 0

    subprocess.run([os.path.join(HERE, "build_kwok.sh"), "--quiet"], check=True)
    state, env = start_cluster("kubetrain-scale.")
    kubeconfig = env["KUBECONFIG"]
    procs = []
    op = Operator(kubeconfig, state, args.operator_flags)
    op.qps, op.burst = args.qps, args.burst
    try:
        api = KubeApi(kubeconfig)
        for i in range(args.nodes):
            api.request("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"kwok-node-{i}", "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"type": "kwok"}},
                "spec": {"taints": []}})
        kwok_log = open(os.path.join(state, "kwok.log"), "w")
        kwok_config = os.path.join(state, "kwok.yaml")
        with open(os.path.join(HERE, "kwok.yaml")) as src, open(kwok_config, "w") as dst:
            dst.write(src.read() + (fail_stage(args.fail_delay_ms, args.fail_jitter_ms) if failures else ""))
        procs.append(subprocess.Popen(
            [os.path.join(CACHE, "bin", "kwok"), "--kubeconfig", kubeconfig,
             "--config", kwok_config,
             "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
             "--cidr=127.20.0.1/16", "--node-ip=127.0.0.1",
             f"--server-address=127.0.0.1:{free_port()}"],
            stdout=kwok_log, stderr=subprocess.STDOUT))
        op.start()
        time.sleep(1)
        tasks = args.jobs * (1 + WORKERS)
        objects = operator_objects(args.jobs, 1 + WORKERS)
        want_created = expected_creates(args.jobs, 1 + WORKERS)
        text = api.metrics()
        before, before_codes = request_counts(text), request_counts(text, with_code=True)
        log(f"creating {args.jobs} jobs ({tasks} pods) on {args.nodes} kwok nodes"
            + (f"; {args.failing_jobs} failing, {args.retrying_jobs} retrying" if failures else ""))
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: api.request(
                "POST", f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs",
                job(f"s{i}", f"kwok-node-{i % args.nodes}", kinds[f"s{i}"], args.backoff_limit)),
                range(args.jobs)))
        posted_s = time.time() - t0
        killed = False
        create_s = finish_s = None
        deadline = t0 + args.timeout
        while time.time() < deadline:
            op.sample()
            c = cache_counts(op)
            if args.kill_operator and not killed and c["pods"] >= tasks // 2:
                log(f"SIGKILL the operator at {c['pods']:.0f} pods")
                op.stop(signal.SIGKILL)
                op.start()
                killed = True
                continue
            if create_s is None and all(c[r] >= n for r, n in want_created.items() if r != "pods") and (
                    c["pods"] >= tasks or (failures and pods_created(api) >= tasks)):
                # (With failing jobs, some pods are gone or recreated before the last exists:
                # every pod created once, as the API server counts its 201s, is the mark.)
                create_s = time.time() - t0
                log(f"all pods, Services, ConfigMaps, Secrets and NetworkPolicies exist after {create_s:.1f} s")
            if create_s is not None:
                items = api.get(f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs")["items"]
                ended = {j["metadata"]["name"]: j for j in items
                         if j.get("status", {}).get("state") in ("Succeeded", "Failed")}
                bad = [f"{n}: {outcome(j)} (want {OUTCOMES[kinds[n]]})" for n, j in ended.items()
                       if outcome(j) != OUTCOMES[kinds[n]]]
                if bad:
                    sys.exit(f"FAILED: jobs ended otherwise than their kind: {bad[:10]}")
                if len(ended) == args.jobs:
                    finish_s = time.time() - t0
                    final_jobs = ended
                    break
            time.sleep(1)
        if finish_s is None:
            sys.exit(f"timed out: create_s={create_s}")
        log(f"all {args.jobs} jobs ended as their kind says after {finish_s:.1f} s")
        # Recreated pods, as each retrying job's status counts them (and no other job has any).
        recreated = {n: sum(r.get("recreated", 0) for r in j["status"].get("replicaStatuses", {}).values())
                     for n, j in final_jobs.items()}
        wrong = {n: k for n, k in recreated.items()
                 if k != (args.backoff_limit if kinds[n] == "retrying" else 0)}
        if wrong:
            sys.exit(f"FAILED: recreated pods per job not backoffLimit (retrying) or not 0: {wrong}")
        want_created["pods"] += sum(recreated.values())
        idle = ""
        if args.idle_seconds:
            idle = " " + idle_cost(api, op, args.jobs, args.idle_seconds)
        log("deleting the jobs")
        # Exactly the objects the jobs need, none twice under another name, none missing.
        # (A failed job's pods may be gone: cleanPodPolicy Running.)
        want = {f"s{j}-{t}" for j in range(args.jobs) for t in ["ps-0"] + [f"worker-{w}" for w in range(WORKERS)]}
        names = {r: sorted(o["metadata"]["name"] for o in api.get(f"/api/v1/namespaces/{NS}/{r}")["items"])
                 for r in ("pods", "services")}
        for r, got in names.items():
            may_miss = {n for n in want if r == "pods" and kinds[n.split("-")[0]] != "plain"}
            if not (want - may_miss <= set(got) <= want) or len(got) != len(set(got)):
                sys.exit(f"FAILED: {r} are not exactly the jobs' tasks: {len(got)} vs {len(want)}, "
                         f"extra {sorted(set(got) - want)[:5]}, missing {sorted(want - set(got))[:5]}")
        t1 = time.time()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: api.request(
                "DELETE", f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs/s{i}"), range(args.jobs)))
        held = None
        while time.time() < deadline:
            op.sample()
            held = cache_counts(op)
            if all(v == 0 for v in held.values()):
                held = None
                break
            time.sleep(1)
        cleanup_s = time.time() - t1
        if held:  # the run's --timeout ended the wait, not the operator
            log(f"cleanup cut short by --timeout {args.timeout:.0f} s: the operator's cache still "
                f"held {held}")
        time.sleep(2)
        text = api.metrics()
        op.stop()
        used = operator_requests(delta(request_counts(text), before))
        # kwok finishes each graceful pod deletion (of a pod still running) with a
        # DELETE of its own (the kubelet's part), each in its log: not the operator's.
        with open(os.path.join(state, "kwok.log")) as f:
            kwok_deletes = f.read().count('"msg":"Delete pod"')
        used[("DELETE", "pods", "")] = used.get(("DELETE", "pods", ""), 0) - kwok_deletes
        for r in ("pods", "services"):  # the harness's own check above
            used[("LIST", r, "")] = used.get(("LIST", r, ""), 0) - 1
        codes = delta(request_counts(text, with_code=True), before_codes)
        # No object was created twice (POSTs answered 201; a POST cut off by
        # the SIGKILL may be recorded with another code).
        created = {r: int(codes.get(("POST", r, "", "201"), 0)) for r in OPERATOR_KINDS}
        total = sum(used.values())
        by = {f"{v} {r}{'/' + s if s else ''}": int(n) for (v, r, s), n in sorted(used.items())}
        leftovers = api.get(f"/api/v1/namespaces/{NS}/pods")["items"]
        ref = ""
        if not args.no_reference:
            ref_s = reference_create_s(api, args.jobs, args.qps, args.burst, 16)
            ref = f" ref_create_s={ref_s:.1f} create_ratio={create_s / ref_s:.2f}"
        print(json.dumps({"requests": by, "posted_jobs_s": round(posted_s, 2)}), flush=True)
        ok = not leftovers and all(created[r] <= want_created[r] for r in created) and (
            args.kill_operator or created == want_created)
        fails = (f" failing_jobs={args.failing_jobs} retrying_jobs={args.retrying_jobs} "
                 f"recreated_pods={sum(recreated.values())}" if failures else "")
        print(f"jobs={args.jobs} pods={tasks}{fails} create_s={create_s:.1f} finish_s={finish_s:.1f} "
              f"cleanup_s={cleanup_s:.1f} op_rss_mib={op.rss_peak_kib / 1024:.1f} op_cpu_s={op.cpu_s:.1f} "
              f"operator_restarts={op.starts - 1}{ref} api_requests_per_object={total / objects:.2f}{idle}",
              flush=True)
        if leftovers:
            describe_leftovers(leftovers, state)
        if not ok:
            sys.exit(f"FAILED: creates {created} (want {want_created}), {len(leftovers)} pods left; "
                     f"pods the operator logged creating more than once: {created_twice(state)}")
    finally:
        if op.proc and op.proc.poll() is None:
            op.proc.kill()
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        stop_cluster(env)


if __name__ == "__main__":
    main()
