"""kubetrain against TensorFlow's own parameter-server training on the same job (tests/bench/tf_peer).

One example TrainingJob is trained, alternately, by `bin/kubetrain run` and by TensorFlow (one
process per task on loopback ports: tf_peer_compat_v1.py or tf_peer_ps_strategy.py), with the job's model,
initial weights, per-worker batch order, optimizer, batch size, steps, evaluation schedule and
cluster shape mapped to TensorFlow by plan_from_job below (the Census wide & deep job by
tf_peer_census.py). Per run: examples/s of the training phase, test accuracy (and for a binary
head AUC) of the final model on the whole test set, and CPU seconds of every process of the job;
then the medians. Prints figures only, never fails on a time. The last line:
`example=… tf_api=… runs=N load=… kubetrain_eps=… tf_eps=… ratio=… kubetrain_acc=… tf_acc=…
kubetrain_cpu_s=… tf_cpu_s=…` (then `kubetrain_auc=… tf_auc=…` for census-wide-deep)."""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

import kubetrain_run
import tf_peer_census

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = {
    "sync": "examples/fashion-mnist-sync.yaml",
    "async": "examples/fashion-mnist-async.yaml",
    "census-wide-deep": "examples/census-income-wide-deep.yaml",
}
# Per TensorFlow API: its program, and whether a coordinator task ("chief") drives the workers.
TF_PROGRAMS = {"compat_v1": ("tf_peer_compat_v1.py", False), "ps_strategy": ("tf_peer_ps_strategy.py", True)}
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# kubetrain's defaults for what the examples leave out (core/job_spec.h).
ADAM_DEFAULTS = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}
# Fields of spec.training the mapping reads, or knows have no TensorFlow counterpart that changes
# what is trained (noted in tests/bench/README.md). Any other field stops the bench, so a new
# hyper-parameter in an example is never silently left out of the TensorFlow side.
MAPPED_TRAINING_FIELDS = {"mode", "replicasToAggregate", "maxStaleness", "model", "dataset", "optimizer",
                          "batchSize", "epochs", "steps", "seed", "evaluation"}


def plan_from_job(job, target_steps):
    """The TensorFlow side's hyper-parameters for a kubetrain TrainingJob (a parsed YAML mapping).
    target_steps: the job's global steps as `kubetrain validate` reports them."""
    spec = job["spec"]
    training = spec["training"]
    unknown = set(training) - MAPPED_TRAINING_FIELDS
    if unknown:
        raise ValueError(f"spec.training fields with no TensorFlow mapping here: {sorted(unknown)}")
    replicas = spec["replicaSpecs"]
    if set(replicas) - {"PS", "Worker"}:
        raise ValueError(f"replica types other than PS and Worker: {sorted(set(replicas) - {'PS', 'Worker'})}")
    workers = replicas["Worker"].get("replicas", 1)
    model = training["model"]
    if model.get("head") == "wideAndDeep":
        return tf_peer_census.plan_from_census_job(job, target_steps, ROOT)
    if model.get("type") != "mlp":
        raise ValueError(f"model type {model.get('type')!r}: only the mlp shorthand and wideAndDeep are mapped")
    dataset = training.get("dataset", {})
    if dataset.get("name", "fashion-mnist") != "fashion-mnist" or dataset.get("format"):
        raise ValueError("only the Fashion-MNIST IDX files are mapped")
    optimizer = dict(training.get("optimizer", {}))
    if optimizer.get("type") != "adam" or set(optimizer) - {"type", "learningRate", "beta1", "beta2", "epsilon"}:
        raise ValueError(f"optimizer {optimizer}: only adam (learningRate, beta1, beta2, epsilon) is mapped")
    mode = training.get("mode", "sync")
    return {
        "name": job["metadata"]["name"],
        "mode": mode,
        "replicas_to_aggregate": training.get("replicasToAggregate", workers) if mode == "sync" else 1,
        # kubetrain bounds how far a fast async worker may run ahead; TensorFlow has no such bound.
        "max_staleness": training.get("maxStaleness"),
        "ps": replicas["PS"].get("replicas", 1),
        "workers": workers,
        "model": {"input_dim": 28 * 28, "num_classes": 10, "hidden_units": list(model["hiddenUnits"])},
        "data": dataset.get("path", FASHION_MNIST),
        "optimizer": {"type": "adam", "learning_rate": optimizer.get("learningRate", 0.01),
                      **{k: optimizer.get(k, v) for k, v in ADAM_DEFAULTS.items()}},
        "batch_size": training.get("batchSize", 100),
        "target_steps": target_steps,
        "seed": training.get("seed", 1),
        "eval_every_steps": training.get("evaluation", {}).get("everySteps", 0),
    }


def target_steps_from_validate(text):
    """The global steps in `kubetrain validate`'s line ("..., 3750 global steps")."""
    m = re.search(r"(\d+) global steps", text)
    if not m:
        raise ValueError(f"no 'N global steps' in kubetrain validate's output:\n{text}")
    return int(m.group(1))


def parse_tf_result(stdout):
    """The chief's `tf_peer_result {json}` line, as a dict."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("tf_peer_result "):
            return json.loads(line[len("tf_peer_result "):])
    raise ValueError("the TensorFlow chief printed no tf_peer_result line")


def parse_key_values(line):
    """A `key=value ...` line as a dict of strings (the bench's own last line, for callers)."""
    return dict(pair.split("=", 1) for pair in line.split())


def free_loopback_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def load_text():
    return "load %.2f %.2f %.2f" % os.getloadavg()


def run_kubetrain(job_path, work_dir):
    """One `kubetrain run` of the job: its chief's own examples/s over its training phase (global
    steps x examples per step / seconds from the training loop's start to the end of the final
    evaluation), the final test accuracy, and the CPU of the launcher and all its tasks."""
    s = kubetrain_run.run_kubetrain(job_path, work_dir)
    return {"eps": s["examples_per_second"], "acc": s["test_accuracy"], "auc": s.get("test_auc"),
            "cpu_s": s["cpu_s"], "train_s": s["training_seconds"], "wall_s": s["wall_s"],
            "global_step": s["global_step"]}


def stop(processes):
    for p in processes:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 10
    for p in processes:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_tensorflow(plan, tf_python, tf_api, work_dir):
    """One TensorFlow run: PS and worker processes on loopback ports; returns the chief's figures
    and the CPU of all the task processes (each waited for, so RUSAGE_CHILDREN holds them all)."""
    program, with_coordinator = TF_PROGRAMS[tf_api]
    counts = {"ps": plan["ps"], "worker": plan["workers"], **({"chief": 1} if with_coordinator else {})}
    ports = iter(free_loopback_ports(sum(counts.values())))
    cluster = {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in counts.items()}
    run_dir = tempfile.mkdtemp(prefix="tf-", dir=work_dir)
    plan_path = os.path.join(run_dir, "plan.json")
    with open(plan_path, "w") as f:
        json.dump({**plan, "cluster": cluster, "run_dir": run_dir}, f)
    program = os.path.join(HERE, program)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    cpu0, wall0 = kubetrain_run.children_cpu_seconds(), time.monotonic()
    tasks = []
    for job in cluster:
        for i in range(len(cluster[job])):
            out = open(os.path.join(run_dir, f"{job}{i}.log"), "w")
            tasks.append((f"{job}{i}", subprocess.Popen(
                [tf_python, program, "--plan", plan_path, "--job", job, "--task", str(i)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=run_dir)))
    reporter = "chief0" if with_coordinator else "worker0"
    chief = dict(tasks)[reporter]
    try:
        deadline = time.monotonic() + 3600
        while chief.poll() is None:
            failed = [name for name, p in tasks if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"TensorFlow task(s) {failed or [reporter + ' (timeout)']} failed:\n"
                                   + tail_logs(run_dir))
            time.sleep(0.05)
        wall = time.monotonic() - wall0
    finally:
        stop([p for _, p in tasks])
    cpu = kubetrain_run.children_cpu_seconds() - cpu0
    if chief.returncode != 0:
        raise RuntimeError(f"the TensorFlow chief exited {chief.returncode}:\n" + tail_logs(run_dir))
    r = parse_tf_result(open(os.path.join(run_dir, reporter + ".log")).read())
    return {"eps": r["examples"] / r["seconds"], "acc": r["test_accuracy"], "auc": r.get("test_auc"), "cpu_s": cpu,
            "train_s": r["seconds"], "wall_s": wall, "global_step": r["global_step"]}


def tail_logs(run_dir):
    parts = []
    for name in sorted(os.listdir(run_dir)):
        if name.endswith(".log"):
            parts.append(f"--- {name}\n" + open(os.path.join(run_dir, name)).read()[-2000:])
    return "\n".join(parts)


def describe(who, i, runs, r, load):
    auc = f" auc={r['auc']:.4f}" if r.get("auc") is not None else ""
    return (f"{who} {i}/{runs}: eps={r['eps']:.0f} acc={r['acc']:.4f}{auc} cpu_s={r['cpu_s']:.1f} "
            f"train_s={r['train_s']:.1f} wall_s={r['wall_s']:.1f} global_step={r['global_step']} ({load})")


def summary_line(example, tf_api, runs, loads, kubetrain, tensorflow):
    """The last line: medians over the runs of each side, ratio = kubetrain's ÷ TensorFlow's eps."""
    def med(results, key):
        return statistics.median(r[key] for r in results)
    k_eps, t_eps = med(kubetrain, "eps"), med(tensorflow, "eps")
    # AUC only where the job's head reports one (the Census jobs), on both sides.
    with_auc = all(r.get("auc") is not None for r in kubetrain + tensorflow)
    auc = f" kubetrain_auc={med(kubetrain, 'auc'):.4f} tf_auc={med(tensorflow, 'auc'):.4f}" if with_auc else ""
    return (f"example={example} tf_api={tf_api} runs={runs} load={statistics.median(loads):.2f} "
            f"kubetrain_wall_s={med(kubetrain, 'wall_s'):.1f} tf_wall_s={med(tensorflow, 'wall_s'):.1f} "
            f"kubetrain_eps={k_eps:.0f} tf_eps={t_eps:.0f} ratio={k_eps / t_eps:.2f} "
            f"kubetrain_acc={med(kubetrain, 'acc'):.4f} tf_acc={med(tensorflow, 'acc'):.4f} "
            f"kubetrain_cpu_s={med(kubetrain, 'cpu_s'):.1f} tf_cpu_s={med(tensorflow, 'cpu_s'):.1f}{auc}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="sync",
                        help="which example job (sync: fashion-mnist-sync.yaml, async: fashion-mnist-async.yaml, "
                        "census-wide-deep: census-income-wide-deep.yaml)")
    parser.add_argument("--tf-api", choices=sorted(TF_PROGRAMS), default="compat_v1")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument("--tf-python", required=True, help="the python of the TensorFlow virtualenv")
    parser.add_argument("--tensorflow-first", action="store_true", help="start each pair with TensorFlow")
    parser.add_argument("--steps", type=int, help="train this many global steps instead of the job's epochs "
                        "(a quick check of the bench itself, not a figure to compare)")
    parser.add_argument("--keep-temp", action="store_true")
    args = parser.parse_args()

    work_dir = tempfile.mkdtemp(prefix="kubetrain-tf-peer.")
    job_path = os.path.join(ROOT, EXAMPLES[args.example])
    if args.steps:
        job = yaml.safe_load(open(job_path))
        job["spec"]["training"].pop("epochs", None)
        job["spec"]["training"]["steps"] = args.steps
        job_path = os.path.join(work_dir, os.path.basename(job_path))
        with open(job_path, "w") as f:
            yaml.safe_dump(job, f, sort_keys=False)
    validate = subprocess.run([os.path.join(ROOT, "bin", "kubetrain"), "validate", job_path], cwd=ROOT,
                              capture_output=True, text=True, check=True)
    plan = plan_from_job(yaml.safe_load(open(job_path)), target_steps_from_validate(validate.stdout))
    if args.tf_api == "ps_strategy" and plan["mode"] != "async":
        parser.error("ParameterServerStrategy trains asynchronously only: use --tf-api compat_v1 "
                     "(SyncReplicasOptimizer) for a sync job")
    print(f"tf_peer: {EXAMPLES[args.example]} ({plan['mode']}, {plan['ps']} PS, {plan['workers']} workers, "
          f"{plan['target_steps']} global steps, batch {plan['batch_size']}) vs TensorFlow {args.tf_api}; "
          f"{args.runs} runs each, alternating", flush=True)
    kubetrain, tensorflow, loads = [], [], []
    try:
        for i in range(1, args.runs + 1):
            sides = [("kubetrain", lambda: run_kubetrain(job_path, work_dir), kubetrain),
                     ("tensorflow", lambda: run_tensorflow(plan, args.tf_python, args.tf_api, work_dir), tensorflow)]
            for who, run, results in (sides[::-1] if args.tensorflow_first else sides):
                load = load_text()
                loads.append(os.getloadavg()[0])
                results.append(run())
                print(describe(who, i, args.runs, results[-1], load), flush=True)
    finally:
        if args.keep_temp:
            print(f"tf_peer: kept {work_dir}", file=sys.stderr)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(f"tf_peer: at the end, {load_text()}")
    print(summary_line(args.example, args.tf_api, args.runs, loads, kubetrain, tensorflow))


if __name__ == "__main__":
    main()
