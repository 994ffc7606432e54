"""tests/bench/scaling: examples/s of the sync MLP example against workers and PS tasks, each next to
the raw-TCP bound for the bytes its steps move.

For every (workers, PS) of --workers x --ps the example job (examples/fashion-mnist-sync.yaml) is
rewritten into a temp dir with those replicas, every gradient aggregated (replicasToAggregate =
workers), a fixed --steps global steps and only the final evaluation, and trained with
`bin/kubetrain run --summary_json`. Its figure is the chief's own examples/s over its training
phase (global steps x examples per step / seconds from the training loop's start to the end of the
final evaluation), as tests/bench/tf_peer reads it.

The bound: a sync global step moves, per worker, the whole model down (pull) and its gradient up
(push): 2 x model bytes x workers. Right before each run, raw TCP over 127.0.0.1 moves that many
bytes (`transport_bench --tcp_only`, --tcp-rounds rounds, median GB/s); the bound in examples/s is
examples per global step / (bytes per global step / that rate) = batch x rate / (2 x model bytes).
Loopback is one machine's memory and CPU: every worker and PS shares the same two cores and the same
bound, so it does not grow with workers or PS tasks as separate links would.

Prints a line per run and a table; the last line is key=value pairs:
  w1_ps1_eps=... w1_ps1_tcp_eps=... w1_ps1_vs_tcp=... w1_ps1_step_ms=... w1_ps1_cores=... ...
  steps=N runs=N load=... model_bytes=...
(medians over --runs; `step_ms` = ms per global step = examples per step / examples/s; `cores` =
CPU seconds of the launcher and all its tasks / the run's wall seconds, start-up included; `load` =
the median 1-minute load average at the start of the runs). Never fails on a time.
"""
import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

import kubetrain_run

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "fashion-mnist-sync.yaml")
INPUT_DIM, NUM_CLASSES = 784, 10  # Fashion-MNIST


def die(msg):
    print(f"scaling: {msg}", file=sys.stderr)
    sys.exit(1)


def mlp_model_bytes(training):
    """float32 bytes of the dense parameters of the job's mlp (kernels and biases)."""
    model = training.get("model", {})
    if model.get("type") != "mlp" or training.get("dataset", {}).get("name") != "fashion-mnist":
        raise ValueError("scaling measures an mlp on fashion-mnist only")
    dims = [INPUT_DIM] + list(model["hiddenUnits"]) + [NUM_CLASSES]
    return 4 * sum(a * b + b for a, b in zip(dims, dims[1:]))


def job_for(job, workers, ps, steps):
    """The example job with `workers` sync workers (all aggregated), `ps` PS tasks, `steps` global
    steps and only the final evaluation, under a name that says so."""
    out = copy.deepcopy(job)
    out["metadata"] = dict(out.get("metadata", {}), name=f"scaling-w{workers}-ps{ps}")
    spec = out["spec"]
    spec["replicaSpecs"]["PS"]["replicas"] = ps
    spec["replicaSpecs"]["Worker"]["replicas"] = workers
    t = spec["training"]
    if t.get("mode") != "sync":
        raise ValueError("scaling measures a sync job")
    t["replicasToAggregate"] = workers
    t.pop("epochs", None)
    t["steps"] = steps
    t["evaluation"] = dict(t.get("evaluation", {}), everySteps=0)
    return out


def bytes_per_global_step(model_bytes, workers):
    """Pull (the model) and push (a gradient) of every worker in one sync global step."""
    return 2 * model_bytes * workers


def tcp_bound_eps(batch, workers, model_bytes, tcp_gbps):
    """examples/s if a global step cost only raw TCP moving its bytes at `tcp_gbps` (1e9 B/s)."""
    seconds = bytes_per_global_step(model_bytes, workers) / (tcp_gbps * 1e9)
    return batch * workers / seconds


def parse_key_values(line):
    """A `key=value ...` line as a dict of strings."""
    return dict(pair.split("=", 1) for pair in line.split())


def last_line(text):
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("no output")
    return lines[-1]


def measure_tcp(transport_bench, nbytes, rounds):
    p = subprocess.run([transport_bench, "--tcp_only", f"--tcp_bytes={nbytes}", f"--rounds={rounds}"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        die(f"transport_bench --tcp_only failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return float(parse_key_values(last_line(p.stdout))["tcp_gbps"])


def run_kubetrain(job_path, work_dir):
    """One `kubetrain run`: the chief's examples/s, and the CPU seconds of the launcher and all its
    tasks over the whole run (cores busy = cpu_s / wall_s; start-up included)."""
    try:
        s = kubetrain_run.run_kubetrain(job_path, work_dir)
    except RuntimeError as e:
        die(str(e))
    return {"eps": s["examples_per_second"], "acc": s["test_accuracy"], "train_s": s["training_seconds"],
            "wall_s": s["wall_s"], "cpu_s": s["cpu_s"], "global_step": s["global_step"]}


def key(workers, ps):
    return f"w{workers}_ps{ps}"


def summary_line(configs, results, steps, runs, loads, model_bytes, batch=None):
    """The last line: per configuration the median examples/s, the raw-TCP bound and their ratio."""
    parts = []
    for workers, ps in configs:
        rs = results[(workers, ps)]
        eps = statistics.median(r["eps"] for r in rs)
        bound = statistics.median(r["tcp_eps"] for r in rs)
        k = key(workers, ps)
        parts += [f"{k}_eps={eps:.0f}", f"{k}_tcp_eps={bound:.0f}", f"{k}_vs_tcp={eps / bound:.3f}"]
        if batch:
            parts.append(f"{k}_step_ms={batch * workers / eps * 1e3:.3f}")
        if all("cpu_s" in r for r in rs):
            parts.append(f"{k}_cores={statistics.median(r['cpu_s'] / r['wall_s'] for r in rs):.2f}")
    parts += [f"steps={steps}", f"runs={runs}", f"load={statistics.median(loads):.2f}", f"model_bytes={model_bytes}"]
    return " ".join(parts)


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport-bench", required=True, help="the transport_bench binary (for --tcp_only)")
    ap.add_argument("--job", default=EXAMPLE, help="a sync mlp job on fashion-mnist (default: the sync example)")
    ap.add_argument("--workers", type=int_list, default=[1, 2, 4], help="comma-separated worker counts")
    ap.add_argument("--ps", type=int_list, default=[1, 2], help="comma-separated PS task counts")
    ap.add_argument("--steps", type=int, default=2000, help="global steps of every run")
    ap.add_argument("--runs", type=int, default=1, help="sweeps (medians per configuration)")
    ap.add_argument("--tcp-rounds", type=int, default=100, help="raw TCP transfers timed before each run")
    ap.add_argument("--keep-temp", action="store_true", help="keep the jobs, logs and summaries")
    args = ap.parse_args()

    job = yaml.safe_load(open(args.job))
    training = job["spec"]["training"]
    try:
        model_bytes = mlp_model_bytes(training)
        job_for(job, 1, 1, 1)
    except (ValueError, KeyError) as e:
        die(f"{args.job}: {e}")
    batch = int(training["batchSize"])
    configs = [(w, p) for w in args.workers for p in args.ps]
    print(f"scaling: {os.path.relpath(args.job, ROOT)}, mlp {model_bytes} bytes, batch {batch}, sync, "
          f"{args.steps} global steps, workers {args.workers} x PS {args.ps}, {args.runs} run(s); "
          f"{os.cpu_count()} cores", flush=True)
    tmp = tempfile.mkdtemp(prefix="kubetrain-bench-scaling.")
    results = {c: [] for c in configs}
    loads = []
    try:
        for run in range(args.runs):
            for workers, ps in configs:
                d = os.path.join(tmp, f"run{run + 1}-{key(workers, ps)}")
                os.makedirs(d)
                path = os.path.join(d, "job.yaml")
                with open(path, "w") as f:
                    yaml.safe_dump(job_for(job, workers, ps, args.steps), f, sort_keys=False)
                load = os.getloadavg()
                loads.append(load[0])
                nbytes = bytes_per_global_step(model_bytes, workers)
                gbps = measure_tcp(args.transport_bench, nbytes, args.tcp_rounds)
                r = run_kubetrain(path, d)
                r["tcp_gbps"] = gbps
                r["tcp_eps"] = tcp_bound_eps(batch, workers, model_bytes, gbps)
                results[(workers, ps)].append(r)
                print(f"run {run + 1}/{args.runs} {workers} worker(s), {ps} PS: {r['eps']:.0f} examples/s "
                      f"(train {r['train_s']:.1f} s, wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s = "
                      f"{r['cpu_s'] / r['wall_s']:.2f} cores, global step {r['global_step']}, "
                      f"accuracy {r['acc']:.4f}); "
                      f"raw TCP {gbps:.2f} GB/s for {nbytes} bytes a step = {r['tcp_eps']:.0f} examples/s, "
                      f"ratio {r['eps'] / r['tcp_eps']:.3f} (load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
                      flush=True)
    finally:
        if args.keep_temp:
            print(f"scaling: kept {tmp}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", tmp])

    print("| workers | PS | examples/s | vs 1 worker | cores busy | ms per global step | MB per global step | "
          "raw TCP ms for them (GB/s) | raw-TCP bound examples/s | examples/s / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for workers, ps in configs:
        rs = results[(workers, ps)]
        eps = statistics.median(r["eps"] for r in rs)
        one = results.get((1, ps))
        base = statistics.median(r["eps"] for r in one) if one else None
        bound = statistics.median(r["tcp_eps"] for r in rs)
        gbps = statistics.median(r["tcp_gbps"] for r in rs)
        cores = statistics.median(r["cpu_s"] / r["wall_s"] for r in rs)
        nbytes = bytes_per_global_step(model_bytes, workers)
        print(f"| {workers} | {ps} | {eps:.0f} | {f'{eps / base:.2f}x' if base else '-'} | {cores:.2f} | "
              f"{batch * workers / eps * 1e3:.2f} | {nbytes / 1e6:.2f} | {nbytes / (gbps * 1e9) * 1e3:.2f} ({gbps:.2f}) | "
              f"{bound:.0f} | {eps / bound:.3f} |")
    print(summary_line(configs, results, args.steps, args.runs, loads, model_bytes, batch), flush=True)


if __name__ == "__main__":
    main()
