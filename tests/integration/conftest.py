"""Helpers for the multi-process integration tests: real kubetrain binaries
(bin/, built by `make build`), real Fashion-MNIST, loopback only."""
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
from testlib import free_ports  # noqa: E402,F401  (the tests import it from here)
BIN = os.path.join(ROOT, "bin")


def binary(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} missing: run `make build` first")
    return path


def job_yaml(name, *, ps=1, workers=2, mode="sync", extra_training="", model="mlp", hidden="[32]",
             steps=200, batch=32, optimizer="adam", lr=0.002, eval_every=0, aggregate=None,
             max_staleness=None, dataset_path=None, chief=False, evaluator=False):
    lines = [
        "apiVersion: kubetrain.io/v1",
        "kind: TrainingJob",
        "metadata:",
        f"  name: {name}",
        "spec:",
        "  replicaSpecs:",
        "    PS:",
        f"      replicas: {ps}",
        "    Worker:",
        f"      replicas: {workers}",
    ]
    if chief:
        lines += ["    Chief:", "      replicas: 1"]
    if evaluator:
        lines += ["    Evaluator:", "      replicas: 1"]
    lines += [
        "  training:",
        f"    mode: {mode}",
        "    model:",
        f"      type: {model}",
    ]
    if model == "mlp":
        lines.append(f"      hiddenUnits: {hidden}")
    lines += [
        "    optimizer:",
        f"      type: {optimizer}",
        f"      learningRate: {lr}",
        f"    batchSize: {batch}",
        f"    steps: {steps}",
        "    seed: 3",
        "    startupTimeoutSeconds: 60",
    ]
    if eval_every:
        lines += ["    evaluation:", f"      everySteps: {eval_every}"]
    if aggregate is not None:
        lines.append(f"    replicasToAggregate: {aggregate}")
    if max_staleness is not None:
        lines.append(f"    maxStaleness: {max_staleness}")
    if dataset_path is not None:
        lines += ["    dataset:", "      name: fashion-mnist", f"      path: {dataset_path}"]
    return "\n".join(lines) + "\n" + extra_training


CENSUS_DATA = os.path.join(ROOT, "data", "census-income")


def census_example(name, **replace):
    """examples/<name> with its data paths made absolute and each `old` text
    (which must be there) replaced by `new`."""
    text = open(os.path.join(ROOT, "examples", name)).read()
    text = text.replace("data/census-income/", CENSUS_DATA + "/")
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def census_bad_copy(tmp_path, name, bad_lines, crlf=False):
    """data/census-income/<name>.gz uncompressed into tmp_path with some lines
    replaced ({line number: text}); returns its path."""
    lines = gzip.open(os.path.join(CENSUS_DATA, name + ".gz"), "rt").read().split("\n")
    for number, text in bad_lines.items():
        lines[number - 1] = text
    path = tmp_path / name
    path.write_bytes(("\r\n" if crlf else "\n").join(lines).encode())
    return str(path)


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_cli(*args, timeout=300):
    return subprocess.run([binary("kubetrain"), *args], capture_output=True, text=True, timeout=timeout)


def assert_eval_reproduces(model, summary, examples):
    """`kubetrain eval` of the job's exported model reports the job's own
    figures (the chief's final evaluation) on the same test set."""
    ev = run_cli("eval", model, "--json")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout)
    assert result["examples"] == examples
    assert result["global_step"] == summary["global_step"]
    for key in ("test_accuracy", "test_auc", "test_log_loss"):
        assert abs(result[key] - summary[key]) < 1e-9, (key, result, summary)


def assert_validate_refuses(tmp_path, text, message):
    """`kubetrain validate` of the job `text` fails, its output holding `message`."""
    proc = run_cli("validate", write(tmp_path, text))
    assert proc.returncode != 0, text
    assert message in proc.stdout + proc.stderr, (message, proc.stdout + proc.stderr)


def run_job(tmp_path, text, *args, timeout=300):
    """Runs `kubetrain run` to the end; returns (CompletedProcess, summary dict or None)."""
    job = write(tmp_path, text)
    summary_path = tmp_path / "summary.json"
    proc = run_cli("run", job, "--summary-json", str(summary_path), *args, timeout=timeout)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return proc, summary


def scrape(port, timeout=2):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric_value(text, name, labels=None):
    """Value of the first sample `name{labels...}` in Prometheus text, or None."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        if labels and not all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            continue
        return float(m.group(3))
    return None


class Cluster:
    """PS, worker, chief and evaluator processes started directly with
    TF_CONFIG (no launcher); chief and evaluator run kubetrain-worker."""

    def __init__(self, tmp_path, job_text, ps, workers, chief=0, evaluator=0):
        self.tmp = tmp_path
        self.job = write(tmp_path, job_text)
        counts = {"ps": ps, "worker": workers, "chief": chief, "evaluator": evaluator}
        counts = {kind: n for kind, n in counts.items() if n}
        ports = iter(free_ports(2 * sum(counts.values())))
        self.addr = {kind: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for kind, n in counts.items()}
        self.metrics = {(kind, i): next(ports) for kind, n in counts.items() for i in range(n)}
        self.procs = {}

    def start(self, kind, index, *flags, insecure=None):
        """A PS without --auth_dir gets --insecure (it refuses to start open
        without it) unless insecure=False says otherwise."""
        tf = {"cluster": self.addr, "task": {"type": kind, "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf))
        program = "kubetrain-ps" if kind == "ps" else "kubetrain-worker"
        cmd = [binary(program), f"--config={self.job}",
               f"--metrics_address=127.0.0.1:{self.metrics[(kind, index)]}", *flags]
        if kind == "ps":
            cmd.append("--bind_host=127.0.0.1")
            if insecure is None:
                insecure = not any(f.startswith("--auth_dir") for f in flags)
            if insecure:
                cmd.append("--insecure")
        log = open(self.tmp / f"{kind}-{index}.log", "w")
        self.procs[(kind, index)] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self.procs[(kind, index)]

    def wait_all(self, timeout=240):
        deadline = time.time() + timeout
        codes = {}
        for key, p in self.procs.items():
            try:
                codes[key] = p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                codes[key] = "hung"
        return codes

    def log(self, kind, index):
        return (self.tmp / f"{kind}-{index}.log").read_text()

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(job_text, ps, workers, chief=0, evaluator=0):
        c = Cluster(tmp_path, job_text, ps, workers, chief, evaluator)
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill_all()


class LiveRun:
    """`kubetrain run` in the background, its output drained by a thread, so a
    test can watch metrics and kill tasks while the job trains."""

    def __init__(self, tmp_path, text, *args):
        import threading
        self.job = write(tmp_path, text)
        self.summary_path = tmp_path / "summary.json"
        self.proc = subprocess.Popen([binary("kubetrain"), "run", self.job, "--summary-json",
                                      str(self.summary_path), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.ports = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._drain, args=(s,), daemon=True)
                         for s in (self.proc.stdout, self.proc.stderr)]
        for t in self._threads:
            t.start()

    def _drain(self, stream):
        for line in stream:
            m = re.search(r"^\s+(\S+): grpc \S+\s+metrics http://127.0.0.1:(\d+)/metrics", line)
            with self._lock:
                self.lines.append(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(2))

    def output(self):
        with self._lock:
            return "".join(self.lines)

    def wait_for_ports(self, n, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                if len(self.ports) >= n:
                    return dict(self.ports)
            time.sleep(0.05)
        raise AssertionError("launcher did not print the task endpoints: " + self.output()[-2000:])

    def metric(self, task, name, labels=None):
        try:
            return metric_value(scrape(self.ports[task]), name, labels)
        except OSError:
            return None

    def wait_for_step(self, task, step, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.metric(task, "kubetrain_global_step")
            if v is not None and v >= step:
                return v
            time.sleep(0.05)
        raise AssertionError(f"{task} never reached step {step}: " + self.output()[-3000:])

    def pid_of(self, task):
        out = subprocess.run(["pgrep", "-f", "--", f"--metrics_address=127.0.0.1:{self.ports[task]}"],
                             capture_output=True, text=True).stdout.split()
        assert len(out) == 1, (task, out)
        return int(out[0])

    def finish(self, timeout=300):
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(timeout=10)
        summary = json.loads(self.summary_path.read_text()) if self.summary_path.exists() else None
        return self.proc.returncode, summary

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def live_runs():
    runs = []

    def start(tmp_path, text, *args):
        r = LiveRun(tmp_path, text, *args)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.kill()


def report_lines(log, tag):
    """The JSON reports a task printed with `tag` (kubetrain-result, kubetrain-progress)."""
    out = []
    for line in log.splitlines():
        if line.startswith(tag + " "):
            out.append(json.loads(line[len(tag) + 1:]))
    return out
