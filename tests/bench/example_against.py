"""tests/bench/example: one example job trained by `kubetrain run` of two builds, alternately.

Called by tests/bench/example with two directories holding each build's bin/kubetrain,
kubetrain-ps and kubetrain-worker (copies made by tests/bench/against.sh). Per round, each build
trains the job once (`kubetrain run JOB --quiet --summary_json F --bin_dir DIR`, through
tests/bench/kubetrain_run.py), the builds
taking turns to go first. examples/s is the chief's own, over its training loop (the summary's
examples_per_second); CPU is user + sys of `kubetrain run` and its tasks (RUSAGE_CHILDREN).
Last line:
  eps=... against_eps=... eps_vs_against=... acc=... against_acc=... cpu_s=... against_cpu_s=...
  training_s=... against_training_s=... rev=SHA rounds=N job=NAME
(eps_vs_against = current / REV medians: above 1, the current tree trains faster).
"""
import argparse
import statistics
import sys
import tempfile

import yaml

import kubetrain_run


def train(bin_dir, job, work_dir):
    s = kubetrain_run.run_kubetrain(job, work_dir, bin_dir=bin_dir)
    return {"eps": s["examples_per_second"], "acc": s["test_accuracy"], "cpu_s": s["cpu_s"],
            "training_s": s.get("training_seconds", float("nan"))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--current", required=True, help="this tree's binaries")
    ap.add_argument("--against", required=True, help="REV's binaries")
    ap.add_argument("--rev", required=True, help="REV's short sha (for the output)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--job", required=True)
    args = ap.parse_args()
    runs = {"current": [], "against": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("current", "against") if r % 2 == 0 else ("against", "current")
            for side in order:
                try:
                    res = train(getattr(args, side), args.job, tmp)
                except RuntimeError as e:
                    sys.exit(f"bench example: {e}")
                runs[side].append(res)
                label = "current" if side == "current" else args.rev
                print(f"round {r + 1} {label:8s}: {res['eps']:9.0f} examples/s, test accuracy "
                      f"{res['acc']:.4f}, CPU {res['cpu_s']:.1f} s, training {res['training_s']:.1f} s",
                      flush=True)

    def med(side, key):
        return statistics.median(x[key] for x in runs[side])

    print(f"\nmedians of {args.rounds} runs each:")
    for key in ("eps", "acc", "cpu_s", "training_s"):
        c, a = med("current", key), med("against", key)
        print(f"  {key:10s} current {c:10.4g}   {args.rev} {a:10.4g}   current/{args.rev} {c / a:.3f}")
    with open(args.job) as f:
        name = (yaml.safe_load(f).get("metadata") or {}).get("name", "?")
    c_eps, a_eps = med("current", "eps"), med("against", "eps")
    print(f"eps={c_eps:.0f} against_eps={a_eps:.0f} eps_vs_against={c_eps / a_eps:.3f} "
          f"acc={med('current', 'acc'):.4f} against_acc={med('against', 'acc'):.4f} "
          f"cpu_s={med('current', 'cpu_s'):.1f} against_cpu_s={med('against', 'cpu_s'):.1f} "
          f"training_s={med('current', 'training_s'):.1f} against_training_s={med('against', 'training_s'):.1f} "
          f"rev={args.rev} rounds={args.rounds} job={name}")


if __name__ == "__main__":
    main()
