"""One `kubetrain run` of a job, measured as the benchmarks that compare it measure it
(tests/bench/tf_peer, tests/bench/scaling, tests/bench/example): the chief's own figures from
`--summary_json`, and the wall and CPU time of the launcher and all its tasks."""
import json
import os
import resource
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_kubetrain(job_path, work_dir, bin_dir=None):
    """Trains `job_path` with `bin_dir`/kubetrain (default: this tree's bin/; a bin_dir also runs
    its own kubetrain-ps and kubetrain-worker). Returns the job's summary (a dict: the chief's
    examples_per_second, test_accuracy, training_seconds, global_step, ...) with `wall_s` and
    `cpu_s` (user + sys of the launcher and its tasks over the whole run) added. Raises
    RuntimeError with the end of its output if it fails."""
    summary = os.path.join(work_dir, "kubetrain-summary.json")
    log = os.path.join(work_dir, "kubetrain.log")
    argv = [os.path.join(bin_dir or os.path.join(ROOT, "bin"), "kubetrain"), "run", "--quiet",
            "--summary_json", summary, job_path]
    if bin_dir:
        argv += ["--bin_dir", bin_dir]
    cpu0, wall0 = children_cpu_seconds(), time.monotonic()
    with open(log, "w") as out:
        p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600)
    wall, cpu = time.monotonic() - wall0, children_cpu_seconds() - cpu0
    if p.returncode != 0:
        with open(log) as f:
            raise RuntimeError(f"{argv[0]} run {job_path} failed ({p.returncode}):\n{f.read()[-3000:]}")
    with open(summary) as f:
        s = json.load(f)
    return dict(s, wall_s=wall, cpu_s=cpu)
