#!/usr/bin/env python3
"""Training-data memory benchmark: the peak RSS (VmHWM) of the worker
processes of a real `kubetrain run` on a big generated CSV file (default
1 GiB: 8 numeric columns and a 0/1 label, ~15M records), against the same job
on a file 1/16 the size, measured in the same run. Streaming readers keep the
two about equal (the ratio near 1): memory depends on shuffleBuffer, not on
the file. Each worker scans the whole file once (count, checks, mean/stddev)
and then trains `--steps` steps.

  make build && python3 tests/bench/data_memory.py [--mb 1024] [--bin bin]

Last line: key=value pairs."""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def generate(path, size_bytes, seed):
    if os.path.exists(path) and os.path.getsize(path) >= size_bytes:
        return
    rng = random.Random(seed)
    block = []
    for _ in range(20000):
        x = [rng.gauss(0, 1) for _ in range(8)]
        label = 1 if x[0] + 0.5 * x[1] - x[2] + rng.gauss(0, 0.5) > 0 else 0
        block.append(",".join(f"{v:.5f}" for v in x) + f",{label}\n")
    chunk = "".join(block).encode()
    with open(path + ".tmp", "wb") as f:
        written = 0
        while written < size_bytes:
            f.write(chunk)
            written += len(chunk)
    os.replace(path + ".tmp", path)


def job(path, steps):
    cols = "\n".join(f"        - {{name: x{i}, type: numeric, normalize: true}}" for i in range(8))
    return f"""apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: data-memory
spec:
  replicaSpecs:
    PS: {{replicas: 1}}
    Worker: {{replicas: 2}}
  training:
    mode: sync
    model:
      layers: [{{type: dense, units: 2}}]
      head: softmax
    dataset:
      format: csv
      trainFiles: [{path}]
      testFiles: [{path}.test]
      columns:
{cols}
        - {{name: y, type: label, numClasses: 2}}
    optimizer: {{type: adam, learningRate: 0.01}}
    batchSize: 64
    steps: {steps}
    seed: 1
    startupTimeoutSeconds: 600
"""


def worker_peaks(pids_seen):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not cmd or not cmd[0].endswith(b"kubetrain-worker"):
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        kb = int(line.split()[1])
                        pids_seen[pid] = max(pids_seen.get(pid, 0), kb)
        except OSError:
            pass


def run(bin_dir, work, path, steps):
    with open(path + ".test", "w") as f:
        with open(path) as src:
            for _, line in zip(range(2000), src):
                f.write(line)
    job_file = os.path.join(work, "job.yaml")
    with open(job_file, "w") as f:
        f.write(job(path, steps))
    start = time.time()
    proc = subprocess.Popen([os.path.join(bin_dir, "kubetrain"), "run", job_file],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = {}
    while proc.poll() is None:
        worker_peaks(peaks)
        time.sleep(0.05)
    out = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"kubetrain run failed:\n{out[-3000:]}")
    return max(peaks.values()) / 1024.0, time.time() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin"))
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "kubetrain-data-memory"))
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    big = os.path.join(args.dir, f"big-{args.mb}m.csv")
    small = os.path.join(args.dir, f"small-{args.mb // 16}m.csv")
    generate(big, args.mb << 20, 1)
    generate(small, (args.mb << 20) // 16, 1)
    small_rss, small_s = run(args.bin, args.dir, small, args.steps)
    big_rss, big_s = run(args.bin, args.dir, big, args.steps)
    print(f"worker peak RSS: {big_rss:.1f} MiB on {os.path.getsize(big) >> 20} MiB of CSV "
          f"({big_s:.0f} s), {small_rss:.1f} MiB on {os.path.getsize(small) >> 20} MiB "
          f"({small_s:.0f} s)")
    print(f"csv_mib={os.path.getsize(big) >> 20} worker_peak_rss_mib={big_rss:.1f} "
          f"small_csv_mib={os.path.getsize(small) >> 20} small_worker_peak_rss_mib={small_rss:.1f} "
          f"rss_ratio={big_rss / small_rss:.3f}")


if __name__ == "__main__":
    main()
