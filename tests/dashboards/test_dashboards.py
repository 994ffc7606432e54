"""The Grafana dashboards in dashboards/ against a REAL Prometheus.

Prometheus (/usr/bin/prometheus, 1 s scrapes) scrapes:
  * two local `kubetrain run` jobs: a sync one (2 PS, 2 workers, checkpoints,
    barrierTimeoutSeconds; its ps-1 is SIGKILLed mid-run so it restarts and
    restores its checkpoint) and an async one with maxStaleness (staleness);
  * two small CSV jobs (1 PS, 1 worker) for the metrics of other heads: a
    binary sigmoid one whose training file has bad records under
    onBadRecord: skip (AUC, log loss, records skipped) and whose column c is
    a dynamic embedding with a maxRows below its ~300 ids (table rows and
    bytes, unique ids per batch, sparse bytes, rows created and evicted), and
    a regression one (RMSE);
  * the operator of a real test cluster (tests/cluster/cluster-up.sh) that
    reconciles a small TrainingJob.
Targets go into file_sd files written once the launcher/operator print their
ports; relabelling turns static labels into `job` (the TrainingJob name) and
`namespace`, as a PodMonitor does from the pod's labels.

Then every panel target of both dashboards (template variables substituted) is
sent to /api/v1/query; each kubetrain_* target must return at least one
finite sample while the jobs run. Also checks the JSON model (uid, id null,
datasource variable on every panel and target, variables).
Needs: bin/ built (make build), prometheus, and the control-plane binaries
(tests/cluster/build.sh). Takes about 1-2 minutes."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "bin")
CLUSTER = os.path.join(ROOT, "tests", "cluster")
sys.path.insert(0, CLUSTER)
import testlib  # noqa: E402
from testlib import free_port  # noqa: E402
DASHBOARDS = os.path.join(ROOT, "dashboards")
FILES = {"training": "kubetrain-training.json", "operator": "kubetrain-operator.json"}
LOCAL_NS = "local"
OPERATOR_NS = "kubetrain-system"
# Targets on metrics outside kubetrain (kube-state-metrics) are optional: their
# panel must still show data through its kubetrain_* targets.
OPTIONAL_METRICS = ("kube_pod_container_status_restarts_total",)
DATA_TIMEOUT = 90
# Targets that must show a positive value, not just a zero: training moved, the
# chief evaluated, the barrier was waited at, PS traffic flowed, async staleness
# was measured, and the operator reconciled and counted the job.
POSITIVE = {
    ("training", "Steps/s per job", "A"), ("training", "Examples/s per job", "A"),
    ("training", "Training loss", "A"), ("training", "Test accuracy", "A"),
    ("training", "Sync barrier wait p50 / p99", "B"), ("training", "Bytes/s per PS task", "A"),
    ("training", "Bytes/s per PS task", "B"), ("training", "Gradients applied/s per PS task", "A"),
    ("training", "Gradient staleness p50 / p99 / mean", "C"),
    ("training", "Gradient staleness distribution", "A"),
    ("training", "Task restarts", "A"),
    ("training", "Test AUC / log loss", "A"), ("training", "Test AUC / log loss", "B"),
    ("training", "Test RMSE", "A"), ("training", "Data records skipped", "A"),
    ("training", "Table rows per PS task", "A"), ("training", "Table bytes per PS task", "A"),
    ("training", "Unique ids per batch", "A"), ("training", "Unique ids per batch", "B"),
    ("training", "Sparse bytes/s per PS task", "A"), ("training", "Sparse bytes/s per PS task", "B"),
    ("training", "Dynamic table rows created / evicted /s", "A"),
    ("training", "Dynamic table rows created / evicted /s", "B"),
    ("operator", "Reconciles/s by result", "A"), ("operator", "Reconcile latency p50 / p90 / p99", "C"),
    ("operator", "TrainingJobs by state", "A"),
    ("operator", "API requests/s by verb", "A"), ("operator", "Informer cache objects", "A"),
}  # seconds to wait for every target to have data


def load(kind):
    with open(os.path.join(DASHBOARDS, FILES[kind])) as f:
        return json.load(f)


def all_panels(dash):
    for p in dash["panels"]:
        yield p
        for sub in p.get("panels", []):
            yield sub


def targets(dash):
    """(panel title, refId, expr) of every query in the dashboard."""
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]


def substitute(expr, values):
    """Grafana's substitution of the variables this test knows."""
    out = expr
    for name, value in values.items():
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    left = re.findall(r"\$\{?\w+", out)
    assert not left, f"unsubstituted variables {left} in {expr}"
    return out


VARS = {"__rate_interval": "10s", "__interval": "2s", "__range": "1m", "namespace": ".*", "job": ".*"}


# ----------------------------------------------------------------- JSON model
@pytest.mark.parametrize("kind", sorted(FILES))
def test_dashboard_json_model(kind):
    d = load(kind)
    assert d["uid"] == f"kubetrain-{kind}"
    assert d["id"] is None
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}", v
        assert v["includeAll"] and v["allValue"] == ".*", f"${name} must tolerate a missing label"
        assert "label_values(" in v["definition"], v
    titles = [p["title"] for p in all_panels(d) if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles must be unique"
    ids = [p["id"] for p in all_panels(d)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in all_panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        assert p.get("description"), f"panel {p['title']!r} has no description"
        assert "gridPos" in p, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", (p["title"], t["refId"])
            assert "$namespace" in t["expr"] and "$job" in t["expr"], \
                f"{p['title']} {t['refId']} ignores the namespace/job variables: {t['expr']}"
    # Nothing hard-codes a data source uid anywhere.
    text = json.dumps(d)
    for m in re.finditer(r'"uid": "([^"]*)"', text):
        assert m.group(1) in ("${datasource}", "-- Grafana --", d["uid"]), m.group(0)


def test_required_panels_exist():
    def exprs(kind):
        return " ".join(e for _, _, e in targets(load(kind)))
    t = exprs("training")
    for needle in ("rate(kubetrain_worker_steps_total", "rate(kubetrain_worker_examples_total",
                   "kubetrain_training_loss", "kubetrain_eval_accuracy",
                   "histogram_quantile(0.5, sum by (namespace, job, le) (rate(kubetrain_sync_barrier_wait_seconds_bucket",
                   "histogram_quantile(0.99, sum by (namespace, job, le) (rate(kubetrain_sync_barrier_wait_seconds_bucket",
                   "kubetrain_gradient_staleness_steps_bucket", "rate(kubetrain_stale_gradients_dropped_total",
                   "kubetrain_barrier_timeouts_total", "rate(kubetrain_push_bytes_total",
                   "rate(kubetrain_pull_bytes_total", "kubetrain_checkpoint_restores_total",
                   "kubetrain_steps_lost_total", "kubetrain_eval_auc", "kubetrain_eval_log_loss",
                   "kubetrain_eval_rmse", "kubetrain_data_records_skipped_total",
                   "kubetrain_table_rows{", "kubetrain_table_bytes", "kubetrain_sparse_unique_ids_bucket",
                   "rate(kubetrain_sparse_pull_bytes_total", "rate(kubetrain_sparse_push_bytes_total",
                   "rate(kubetrain_table_rows_created_total", "rate(kubetrain_table_rows_evicted_total"):
        assert needle in t, needle
    o = exprs("operator")
    for needle in ("rate(kubetrain_operator_reconciles_total", "kubetrain_operator_reconcile_duration_seconds_bucket",
                   "kubetrain_operator_jobs", "kubetrain_operator_queue_depth",
                   "kubetrain_operator_watch_restarts_total", "rate(kubetrain_operator_api_requests_total",
                   "kubetrain_operator_api_throttle_seconds_total", "kubetrain_operator_cache_objects",
                   "kubetrain_operator_expectations_pending", "kubetrain_operator_busy_workers"):
        assert needle in o, needle


# ----------------------------------------------------------- live environment
def http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def write_targets(path, groups):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(groups, f)
    os.replace(tmp, path)  # atomic: Prometheus never reads half a file


PROM_CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kubetrain-tasks
    file_sd_configs: [{{files: ["{tasks}"], refresh_interval: 1s}}]
    relabel_configs:  # what a PodMonitor does with the pod's kubetrain.io/job-name label
      - {{source_labels: [__tj_name], target_label: job}}
      - {{source_labels: [__tj_namespace], target_label: namespace}}
      - {{source_labels: [__tj_task], target_label: pod}}
  - job_name: kubetrain-operator
    file_sd_configs: [{{files: ["{operator}"], refresh_interval: 1s}}]
    relabel_configs:
      - {{source_labels: [__op_namespace], target_label: namespace}}
"""


def job_yaml(name, mode, steps, extra):
    return f"""apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  replicaSpecs:
    PS: {{replicas: 2, restartPolicy: OnFailure}}
    Worker: {{replicas: 2, restartPolicy: OnFailure}}
  training:
    mode: {mode}
    model: {{type: mlp, hiddenUnits: [64]}}
    optimizer: {{type: adam, learningRate: 0.002}}
    batchSize: 32
    steps: {steps}
    seed: 3
    startupTimeoutSeconds: 60
    evaluation: {{everySteps: 300}}
{extra}"""


# Bad records in the binary job's training file (onBadRecord: skip).
BAD_RECORDS = 3


# Distinct values of the binary job's dynamic column c, and its maxRows
# (batch 32, 1 PS task: at least 32): rows are evicted all the time.
DYNAMIC_IDS = 300
DYNAMIC_MAX_ROWS = 40


def csv_jobs(tmp):
    """The binary and the regression CSV job: y = [x1 + x2 > 0] (with c, an
    id in DYNAMIC_IDS values) and t = 2 x1 - x2 + noise, 2000 training rows,
    500 test rows each."""
    import random
    rng = random.Random(5)

    def rows(n, label):
        out = []
        for _ in range(n):
            x1, x2 = rng.uniform(-1, 1), rng.uniform(-1, 1)
            c = f",v{rng.randrange(DYNAMIC_IDS)}" if label is binary else ""
            out.append(f"{x1:.4f},{x2:.4f}{c},{label(x1, x2)}")
        return out
    binary = lambda x1, x2: int(x1 + x2 + rng.gauss(0, 0.3) > 0)
    regress = lambda x1, x2: f"{2 * x1 - x2 + rng.gauss(0, 0.1):.4f}"
    files = {}
    for name, label in (("binary", binary), ("regress", regress)):
        train = rows(2000, label)
        if name == "binary":
            for i in range(BAD_RECORDS):
                train.insert(100 * (i + 1), f"x{i},0.5,v1,1")  # not a number: skipped
        for part, lines in (("train", train), ("test", rows(500, label))):
            path = os.path.join(tmp, f"{name}-{part}.csv")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            files[name, part] = path
    jobs = {}
    for name, head, label in (("dash-binary", "sigmoid", "{name: y, type: label, numClasses: 2}"),
                              ("dash-regress", "meanSquaredError", "{name: t, type: label}")):
        kind = "binary" if head == "sigmoid" else "regress"
        sparse = (f"      embeddings: [{{column: c, dim: 4, maxRows: {DYNAMIC_MAX_ROWS}}}]\n"
                  if kind == "binary" else "")
        column = "{name: c, type: categorical, dynamic: true}, " if kind == "binary" else ""
        jobs[name] = f"""apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  replicaSpecs:
    PS: {{replicas: 1, restartPolicy: OnFailure}}
    Worker: {{replicas: 1, restartPolicy: OnFailure}}
  training:
    mode: sync
    model:
      layers: [{{type: dense, units: 8, activation: relu}}, {{type: dense, units: 1}}]
      head: {head}
{sparse}    dataset:
      format: csv
      trainFiles: [{files[kind, "train"]}]
      testFiles: [{files[kind, "test"]}]
      onBadRecord: skip
      columns: [{{name: x1, type: numeric}}, {{name: x2, type: numeric}}, {column}{label}]
    optimizer: {{type: adam, learningRate: 0.01}}
    batchSize: 32
    steps: 1000000
    seed: 3
    startupTimeoutSeconds: 60
    evaluation: {{everySteps: 200}}
"""
    return jobs


class Launcher:
    """One `kubetrain run` in the background; collects the task metrics URLs
    from its stderr (`  ps-0: grpc ...  metrics http://127.0.0.1:PORT/metrics`)."""

    URL = re.compile(r"^\s+(\S+): grpc \S+\s+metrics (http://127\.0\.0\.1:(\d+)/metrics)")

    def __init__(self, tmp, name, text, nice=0):
        self.name = name
        self.log_path = os.path.join(tmp, f"{name}.log")
        job = os.path.join(tmp, f"{name}.yaml")
        with open(job, "w") as f:
            f.write(text)
        self.log = open(self.log_path, "w")
        # nice: the small CSV jobs spin through tiny steps; they must not take
        # the CPU the sync job's restart needs on a loaded 2-core machine.
        self.proc = subprocess.Popen(["nice", "-n", str(nice), os.path.join(BIN, "kubetrain"), "run", job, "--quiet"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def ports(self):
        found = {}
        with open(self.log_path) as f:
            for line in f:
                m = self.URL.match(line)
                if m:
                    found[m.group(1)] = int(m.group(3))
        return found

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # the launcher stops every task
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def wait_for(cond, timeout, what, interval=0.2):
    return testlib.wait_for(cond, timeout, what, interval)


@pytest.fixture(scope="module")
def env():
    for b in ("kubetrain", "kubetrain-ps", "kubetrain-worker", "kubetrain-operator"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            pytest.fail(f"{BIN}/{b} missing: run make build")
    # Image mode (make test's default): the jobs' pods run from the images, never silently from bin/.
    if testlib.e2e_images():
        testlib.require_images(pytest.fail)
    prom_bin = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(prom_bin, os.X_OK):
        pytest.fail("prometheus missing: apt-get install prometheus")
    tmp = tempfile.mkdtemp(prefix="kubetrain-dash.")
    state = os.path.join(tmp, "cluster")
    os.mkdir(state)
    cenv = testlib.cluster_env(state)
    tasks_sd, op_sd = os.path.join(tmp, "tasks.json"), os.path.join(tmp, "operator.json")
    write_targets(tasks_sd, [])
    write_targets(op_sd, [])
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(PROM_CONFIG.format(tasks=tasks_sd, operator=op_sd))
    port = free_port()
    prom_url = f"http://127.0.0.1:{port}"
    prom_log = open(os.path.join(tmp, "prometheus.log"), "w")
    prom = subprocess.Popen([prom_bin, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
                            stdout=prom_log, stderr=subprocess.STDOUT)
    cluster_up = subprocess.Popen([os.path.join(CLUSTER, "cluster-up.sh")], stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(tmp, "cluster-up.log"), "w"), text=True, env=cenv)
    launchers = []
    try:
        def ready():
            try:
                return urllib.request.urlopen(prom_url + "/-/ready", timeout=1).status == 200
            except OSError:
                return False
        wait_for(ready, 30, "prometheus /-/ready")

        # The operator: cluster-up.sh prints its exports when everything is started.
        out, _ = cluster_up.communicate(timeout=600)
        if cluster_up.returncode != 0:  # one retry: a free port picked by up.sh can be taken meanwhile
            subprocess.run([os.path.join(CLUSTER, "cluster-down.sh")], env=cenv, timeout=120, capture_output=True)
            cluster_up = subprocess.Popen([os.path.join(CLUSTER, "cluster-up.sh")], stdout=subprocess.PIPE,
                                          stderr=open(os.path.join(tmp, "cluster-up.log"), "a"), text=True,
                                          env=cenv)
            out, _ = cluster_up.communicate(timeout=600)
        if cluster_up.returncode != 0:
            pytest.fail("cluster-up.sh failed:\n" + open(os.path.join(tmp, "cluster-up.log")).read()[-4000:])
        cenv["KUBECONFIG"] = testlib.exports(out)["KUBECONFIG"]
        op_log = os.path.join(state, "logs", "operator.log")

        def op_port():
            try:
                m = re.search(r"kubetrain-operator: .*metrics (\d+)", open(op_log).read())
            except OSError:
                return None
            return m and int(m.group(1))
        op = wait_for(op_port, 30, f"the operator's metrics port in {op_log}")
        write_targets(op_sd, [{"targets": [f"127.0.0.1:{op}"], "labels": {"__op_namespace": OPERATOR_NS}}])
        kubectl = os.path.join(os.environ.get("KUBETRAIN_CACHE", os.path.expanduser("~/.cache/kubetrain")),
                               "bin", "kubectl")
        tj = {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "metadata": {"name": "dash-op"},
              "spec": {"replicaSpecs": {"PS": {"replicas": 1}, "Worker": {"replicas": 1}},
                       "training": {"mode": "sync", "model": {"type": "softmax"},
                                    "optimizer": {"type": "sgd", "learningRate": 0.1}, "batchSize": 64,
                                    "steps": 2000, "seed": 3, "startupTimeoutSeconds": 60}}}
        for attempt in range(20):  # kubectl's discovery can lag the just-Established CRD
            p = subprocess.run([kubectl, "apply", "-n", "default", "-f", "-"], input=json.dumps(tj), text=True,
                               capture_output=True, env=cenv, timeout=60)
            if p.returncode == 0:
                break
            time.sleep(1)
        assert p.returncode == 0, p.stderr

        ckpt = os.path.join(tmp, "ckpt")
        sync = Launcher(tmp, "dash-sync", job_yaml(
            "dash-sync", "sync", 6000,
            f"    checkpoint: {{directory: {ckpt}, everySteps: 100}}\n    barrierTimeoutSeconds: 0.02\n"))
        launchers.append(sync)
        async_ = Launcher(tmp, "dash-async", job_yaml("dash-async", "async", 6000, "    maxStaleness: 4\n"))
        launchers.append(async_)
        for name, text in csv_jobs(tmp).items():
            launchers.append(Launcher(tmp, name, text, nice=10))
        groups = {}
        for la in launchers:
            tasks = 2 if la.name in ("dash-binary", "dash-regress") else 4
            ps = wait_for(lambda: len(la.ports()) == tasks and la.ports(), 30, f"{la.name} task ports")
            for task, p in ps.items():
                groups[f"{la.name}/{task}"] = {"targets": [f"127.0.0.1:{p}"], "labels": {
                    "__tj_name": la.name, "__tj_namespace": LOCAL_NS, "__tj_task": f"{la.name}-{task}"}}
        write_targets(tasks_sd, list(groups.values()))

        # A PS task dies mid-run: the launcher restarts it and it restores its checkpoint.
        # A finished checkpoint, not the directory's README or a file still being written
        # (ckpt-N.ktc.tmp.*): killed before one exists, ps-1 would start fresh and never restore.
        wait_for(lambda: any(re.fullmatch(r"ckpt-\d+\.ktc", n)
                             for n in (os.listdir(os.path.join(ckpt, "ps-1"))
                                       if os.path.isdir(os.path.join(ckpt, "ps-1")) else [])),
                 60, "a finished checkpoint of dash-sync ps-1")
        pid = subprocess.run(["pgrep", "-f", "--", f"--metrics_address=127.0.0.1:{sync.ports()['ps-1']}"],
                             capture_output=True, text=True).stdout.split()
        assert len(pid) == 1, pid
        os.kill(int(pid[0]), signal.SIGKILL)
        yield {"url": prom_url, "launchers": launchers, "tmp": tmp}
    finally:
        for la in launchers:
            la.stop()
        if cluster_up.poll() is None:
            cluster_up.kill()
            cluster_up.wait()
        subprocess.run([os.path.join(CLUSTER, "cluster-down.sh"), "--purge"], env=cenv, timeout=120,
                       capture_output=True)
        prom.terminate()
        try:
            prom.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        prom_log.close()
        if os.environ.get("KUBETRAIN_KEEP_STATE"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def query(url, expr):
    r = http_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert r["status"] == "success", (expr, r)
    return r["data"]["result"]


def finite(result):
    out = []
    for s in result:
        v = float(s["value"][1])
        if not math.isnan(v):
            out.append(v)
    return out


def test_every_panel_has_data(env):
    """Polls all panel queries while the jobs run; every kubetrain_* target must
    return a finite sample at some instant (a positive one for POSITIVE), and so
    every panel shows data. The killed ps-1 shows up in "Task restarts"."""
    url = env["url"]
    pending = {}
    for kind in FILES:
        for title, ref, expr in targets(load(kind)):
            pending[(kind, title, ref)] = substitute(expr, VARS)
    seen = {}
    deadline = time.time() + DATA_TIMEOUT
    while time.time() < deadline:
        for key, expr in list(pending.items()):
            vals = finite(query(url, expr))
            if vals and (key not in POSITIVE or max(vals) > 0):
                seen[key] = vals
                del pending[key]
        required = [k for k, e in pending.items() if not any(m in e for m in OPTIONAL_METRICS)]
        if not required:
            break
        time.sleep(1)
    for la in env["launchers"]:
        assert la.proc.poll() in (None, 0), f"{la.name} failed:\n{la.output()[-3000:]}"
    missing = sorted(f"{kind}: panel {title!r} target {ref}"
                     f"{' (needs a value > 0)' if (kind, title, ref) in POSITIVE else ''}: {pending[(kind, title, ref)]}"
                     for kind, title, ref in pending
                     if not any(m in pending[(kind, title, ref)] for m in OPTIONAL_METRICS))
    assert not missing, "panels without data:\n" + "\n".join(missing)
    panels_without = sorted({(k, t) for k, t, _ in pending} - {(k, t) for k, t, _ in seen})
    assert not panels_without, f"panels without any data: {panels_without}"



def test_variables_resolve(env):
    """label_values() of each dashboard variable finds the labels we scrape with."""
    url = env["url"]
    expect = {"training": ({LOCAL_NS}, {"dash-sync", "dash-async"}),
              "operator": ({OPERATOR_NS}, {"kubetrain-operator"})}
    for kind, (namespaces, jobs) in expect.items():
        variables = {v["name"]: v for v in load(kind)["templating"]["list"]}
        for name, want in (("namespace", namespaces), ("job", jobs)):
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name]["definition"])
            assert m and m.group(2) == name, variables[name]["definition"]
            selector = substitute(m.group(1), VARS)
            r = http_json(f"{url}/api/v1/label/{name}/values?" + urllib.parse.urlencode({"match[]": selector}))
            assert want <= set(r["data"]), (kind, name, r["data"])
        # A selected value (not All) narrows the queries to that job.
        one = dict(VARS, namespace=sorted(namespaces)[0], job=sorted(jobs)[0])
        expr = substitute(next(e for _, _, e in targets(load(kind)) if "up{" in e), one)
        assert query(url, expr), expr


def test_other_heads_metrics(env):
    """The values behind the AUC / log loss, RMSE and records-skipped panels are
    the jobs' real figures: the binary job skipped exactly its bad records and
    learned (AUC well above chance), the regression job's RMSE is finite and
    below the spread of its targets (stddev ~1.1)."""
    url = env["url"]
    sel = '{namespace=~".*", job="%s"}'

    def value(expr):
        vals = finite(query(url, expr))
        return max(vals) if vals else None
    wait_for(lambda: value("max(kubetrain_eval_auc%s)" % (sel % "dash-binary")), DATA_TIMEOUT,
             "an AUC from dash-binary")
    assert value("max(kubetrain_data_records_skipped_total%s)" % (sel % "dash-binary")) == BAD_RECORDS
    assert value("max(kubetrain_data_records_skipped_total%s)" % (sel % "dash-regress")) == 0
    wait_for(lambda: (value("max(kubetrain_eval_auc%s)" % (sel % "dash-binary")) or 0) > 0.8, DATA_TIMEOUT,
             "dash-binary's AUC > 0.8")
    log_loss = value("max(kubetrain_eval_log_loss%s)" % (sel % "dash-binary"))
    assert 0 < log_loss < 0.6, log_loss
    wait_for(lambda: 0 < (value("max(kubetrain_eval_rmse%s)" % (sel % "dash-regress")) or 0) < 0.6,
             DATA_TIMEOUT, "dash-regress's RMSE < 0.6")
    # Jobs without those heads are left out of the panels (> 0), not drawn at 0.
    assert not query(url, 'kubetrain_eval_auc{job="dash-sync"} > 0')
    assert not query(url, 'kubetrain_eval_rmse{job="dash-binary"} > 0')
