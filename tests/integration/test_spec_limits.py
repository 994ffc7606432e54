"""Specs that validate used to accept and then crash or mislead (issue 9):
models too big for the memory a task has, hyper-parameters outside float32,
and std::bad_alloc in a real PS process."""
import json
import os
import shutil
import subprocess

from conftest import binary, free_ports, job_yaml, run_cli, write


def ps_env(ps_port, worker_port):
    tf = {"cluster": {"ps": [f"127.0.0.1:{ps_port}"], "worker": [f"127.0.0.1:{worker_port}"]},
          "task": {"type": "ps", "index": 0}}
    return dict(os.environ, TF_CONFIG=json.dumps(tf))


def run_ps(job, *prefix, timeout=60):
    ps, worker, metrics = free_ports(3)
    cmd = [*prefix, binary("kubetrain-ps"), f"--config={job}", f"--metrics_address=127.0.0.1:{metrics}",
           "--bind_host=127.0.0.1", "--insecure"]
    return subprocess.run(cmd, env=ps_env(ps, worker), capture_output=True, text=True, timeout=timeout)


def test_a_model_too_big_for_memory_is_refused_by_validate_run_and_the_ps(tmp_path):
    job = write(tmp_path, job_yaml("huge", ps=1, workers=1, hidden="[65536, 65536]", optimizer="sgd"))
    proc = run_cli("validate", job, "--memory-limit=8Gi")
    assert proc.returncode == 2
    assert "spec.training.model: needs at least 48.6 GiB on ps:0" in proc.stderr, proc.stderr
    assert "more than the 8.0 GiB of --memory-limit 8Gi" in proc.stderr
    proc = run_cli("run", job, "--memory-limit=8Gi")
    assert proc.returncode == 2 and "spec.training.model" in proc.stderr, proc.stderr
    # The task itself, against this machine's memory (or its cgroup limit):
    # ~145 GiB for four 65536-unit layers.
    bigger = write(tmp_path, job_yaml("huger", ps=1, workers=1, hidden="[65536, 65536, 65536, 65536]",
                                      optimizer="sgd"), "huger.yaml")
    proc = run_ps(bigger)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "spec.training.model: needs at least" in proc.stderr
    assert "memory" in proc.stderr and "bad_alloc" not in proc.stderr


def test_bad_alloc_in_a_real_ps_exits_2_with_a_message(tmp_path):
    if shutil.which("prlimit") is None:
        raise AssertionError("prlimit (util-linux) is needed: run make deps")
    # ~300 MB of parameters x 3 copies fits this machine but not a 500 MB
    # address space: the allocation itself fails.
    job = write(tmp_path, job_yaml("oom", ps=1, workers=1, hidden="[8192, 8192]", optimizer="sgd"))
    proc = run_ps(job, "prlimit", "--as=500000000")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "error: out of memory (std::bad_alloc)" in proc.stderr
    assert "spec.training.model" in proc.stderr


def test_float32_hyper_parameters_are_named(tmp_path):
    proc = run_cli("validate", write(tmp_path, job_yaml("lr", lr="1e39")))
    assert proc.returncode == 2
    assert "spec.training.optimizer.learningRate: must be at most 3.40282e+38" in proc.stderr
    eps = job_yaml("eps").replace("      learningRate: 0.002", "      learningRate: 0.002\n      epsilon: 1e-50")
    proc = run_cli("validate", write(tmp_path, eps, "eps.yaml"))
    assert proc.returncode == 2
    assert "spec.training.optimizer.epsilon: must be 0 or at least 1.17549e-38" in proc.stderr


def test_yaml_syntax_directories_and_huge_files_get_clear_messages(tmp_path):
    unterminated = job_yaml("quote").replace("  name: quote", '  name: "quote')
    job = write(tmp_path, unterminated, "quote.yaml")
    proc = run_cli("validate", job)
    assert proc.returncode == 2
    assert f"{job}: invalid YAML at line 4, column 9: unterminated quoted string" in proc.stderr, proc.stderr
    proc = run_cli("validate", str(tmp_path))
    assert proc.returncode == 2
    assert f"{tmp_path}: is a directory, expected a TrainingJob YAML file" in proc.stderr
    huge = job_yaml("huge") + "# " + "x" * (50 << 20) + "\n"
    job = write(tmp_path, huge, "huge.yaml")
    for command in ("validate", "run"):
        proc = run_cli(command, job)
        assert proc.returncode == 2
        assert f"{job}: is {len(huge)} bytes; a TrainingJob may be at most 1572864 bytes" in proc.stderr


def test_a_worker_with_another_spec_is_refused_saying_what_differs(tmp_path, cluster_factory):
    ps_job = job_yaml("mismatch", ps=1, workers=1, steps=50)
    c = cluster_factory(ps_job, ps=1, workers=1)
    other = write(tmp_path, ps_job.replace("seed: 3", "seed: 4").replace("learningRate: 0.002",
                                                                           "learningRate: 0.003"),
                  "other.yaml")
    c.start("ps", 0)
    c.job = other  # the worker reads another file
    worker = c.start("worker", 0)
    code = worker.wait(timeout=60)
    log = c.log("worker", 0)
    assert code != 0, log
    assert "differs: seed: 3 there, 4 here; optimizer.learningRate: 0.002 there, 0.003 here" in log, log
