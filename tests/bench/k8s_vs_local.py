"""tests/bench/k8s_vs_local: examples/s of one TrainingJob on the test cluster vs `kubetrain run`.

Starts a private test cluster (tests/cluster/cluster-up.sh: kube-apiserver + etcd, the CRD, the
operator process and the test node agent; pods from the runtime image unless --host-binaries),
then per round trains the job locally (`bin/kubetrain run --summary-json`) and on the cluster
(`kubectl apply` under a fresh name, until .status.state is Succeeded, reading the chief's
.status.result), alternating which goes first. The figure of each is the chief's own
examples/s over its training (the same counter in both: the operator copies the chief's
termination message into .status.result). Last line:
  k8s_eps=... local_eps=... ratio=... k8s_acc=... local_acc=... k8s_min=... k8s_max=... local_min=... local_max=... rounds=N job=NAME images=0|1 local_tls=0|1
With --split-tls each round also trains the job with `kubetrain run --tls`, and the line ends with
  local_tls_eps=... local_tls_ratio=... k8s_vs_local_tls=...
(local_tls_ratio = local with TLS / local: what TLS alone costs; k8s_vs_local_tls = cluster / local
with TLS: what the rest of the cluster costs).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLUSTER = os.path.join(ROOT, "tests", "cluster")
sys.path.insert(0, CLUSTER)
import testlib  # noqa: E402


def die(msg):
    print(f"k8s_vs_local: {msg}", file=sys.stderr)
    sys.exit(1)


def result_value(result, snake):
    camel = snake.split("_")[0] + "".join(w.title() for w in snake.split("_")[1:])
    return result.get(camel, result.get(snake))


class Cluster:
    def __init__(self, host_binaries):
        try:
            self.state, self.env, ex = testlib.cluster_up(
                "kubetrain-k8s-vs-local.", timeout=900, down_args=("--purge", "--quiet"),
                KUBETRAIN_HOST_BINARIES="1" if host_binaries else "0")
        except testlib.ClusterUpFailed as e:
            die(str(e))
        self.env.update(ex)
        self.kubectl = os.path.join(testlib.cache_bin(), "kubectl")

    def run(self, *args, input=None, check=True):
        proc = subprocess.run([self.kubectl, *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=120)
        if check and proc.returncode != 0:
            die(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def train(self, job, name, timeout):
        obj = dict(job)
        obj["metadata"] = dict(job.get("metadata", {}), name=name, namespace="default")
        self.run("apply", "-f", "-", input=json.dumps(obj))
        deadline = time.monotonic() + timeout
        while True:
            status = json.loads(self.run("get", "tj", name, "-o", "json").stdout).get("status", {})
            state = status.get("state")
            if state == "Succeeded":
                break
            if state == "Failed" or time.monotonic() > deadline:
                conditions = "; ".join(f"{c.get('type')}: {c.get('message', '')}"
                                       for c in status.get("conditions", []))
                die(f"job {name} on the cluster ended {state or 'without finishing'}: {conditions}")
            time.sleep(1)
        self.run("delete", "tj", name, "--wait=false")
        return status.get("result", {})

    def down(self):
        testlib.cluster_down(self.env, "cluster-up.sh", "--purge", "--quiet", timeout=300)


def train_locally(path, tmp, tls):
    summary = os.path.join(tmp, "summary.json")
    proc = subprocess.run([os.path.join(ROOT, "bin", "kubetrain"), "run", path, "--quiet",
                           "--summary-json", summary] + (["--tls"] if tls else []),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        die(f"kubetrain run {path} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    with open(summary) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "fashion-mnist-sync.yaml"))
    ap.add_argument("--host-binaries", action="store_true",
                    help="pods as host processes from bin/ instead of the runtime image")
    ap.add_argument("--local-tls", action="store_true",
                    help="kubetrain run --tls (mutual TLS between the local tasks too, as on the cluster)")
    ap.add_argument("--split-tls", action="store_true",
                    help="per round also kubetrain run --tls, and print what TLS alone costs locally "
                         "(local_tls_eps, local_tls_ratio = local --tls / local) and the cluster against "
                         "it (k8s_vs_local_tls): the rest of the cluster's cost")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per job on the cluster")
    args = ap.parse_args()
    if args.rounds < 1:
        die("--rounds must be >= 1")
    if args.split_tls and args.local_tls:
        die("--split-tls already trains locally with and without --tls; leave out --local-tls")
    if os.geteuid() != 0:
        die("needs root (the test node agent runs pods in namespaces and chroots)")
    if not args.host_binaries:  # images=1 must mean the pods ran from the images
        testlib.require_images(die)
    with open(args.job) as f:
        job = yaml.safe_load(f)
    name = job["metadata"]["name"]
    cluster = Cluster(args.host_binaries)
    k8s, local, local_tls = [], [], []
    runs = {"local": local, "k8s": k8s, "local-tls": local_tls}
    kinds = ["local", "k8s"] + (["local-tls"] if args.split_tls else [])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                # Each kind goes first in turn, so load drift hits all alike.
                order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
                for where in order:
                    if where == "k8s":
                        res = cluster.train(job, f"{name}-{r}", args.timeout)
                        k8s.append((result_value(res, "examples_per_second"), result_value(res, "test_accuracy")))
                    else:
                        s = train_locally(args.job, tmp, args.local_tls or where == "local-tls")
                        runs[where].append((s["examples_per_second"], s["test_accuracy"]))
                    eps, acc = runs[where][-1]
                    print(f"round {r + 1} {where:9s}: {eps:9.0f} examples/s, test accuracy {acc:.4f}",
                          flush=True)
    finally:
        cluster.down()
    k_eps, l_eps = [e for e, _ in k8s], [e for e, _ in local]
    k_med, l_med = statistics.median(k_eps), statistics.median(l_eps)
    print(f"cluster      examples/s: min {min(k_eps):.0f}  median {k_med:.0f}  max {max(k_eps):.0f}")
    print(f"kubetrain run examples/s: min {min(l_eps):.0f}  median {l_med:.0f}  max {max(l_eps):.0f}")
    split = ""
    if args.split_tls:
        t_eps = [e for e, _ in local_tls]
        t_med = statistics.median(t_eps)
        print(f"kubetrain run --tls examples/s: min {min(t_eps):.0f}  median {t_med:.0f}  max {max(t_eps):.0f}")
        split = (f" local_tls_eps={t_med:.0f} local_tls_ratio={t_med / l_med:.3f} "
                 f"k8s_vs_local_tls={k_med / t_med:.3f}")
    print(f"k8s_eps={k_med:.0f} local_eps={l_med:.0f} ratio={k_med / l_med:.3f} "
          f"k8s_acc={statistics.median(a for _, a in k8s):.4f} "
          f"local_acc={statistics.median(a for _, a in local):.4f} "
          f"k8s_min={min(k_eps):.0f} k8s_max={max(k_eps):.0f} local_min={min(l_eps):.0f} "
          f"local_max={max(l_eps):.0f} rounds={args.rounds} job={name} "
          f"images={0 if args.host_binaries else 1} local_tls={int(args.local_tls)}{split}")


if __name__ == "__main__":
    main()
