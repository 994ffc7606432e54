"""`kubetrain run` as a user meets it: bad input gets a clear error and starts
nothing; Ctrl-C stops every child; a broken dataset fails the job clearly."""
import json
import os
import re
import signal
import subprocess
import time

from conftest import binary, job_yaml, run_cli, run_job, write


def kubetrain_processes(marker):
    """PS and worker tasks whose --config is under `marker` (not the launcher itself)."""
    out = subprocess.run(["pgrep", "-f", "--", "--config=" + marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_malformed_spec_is_refused_with_the_field_named(tmp_path):
    bad = job_yaml("bad", workers=2, aggregate=5)
    proc = run_cli("run", write(tmp_path, bad))
    assert proc.returncode == 2
    assert "spec.training.replicasToAggregate" in proc.stderr
    typo = job_yaml("typo").replace("    optimizer:", "    optimiser:")
    proc = run_cli("run", write(tmp_path, typo, "typo.yaml"))
    assert proc.returncode == 2 and "optimiser" in proc.stderr
    assert not kubetrain_processes(str(tmp_path))


def test_missing_file_and_bad_flags(tmp_path):
    proc = run_cli("run", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr
    proc = run_cli("run", "x.yaml", "--summary-jsn=out.json")
    assert proc.returncode == 2 and "unknown flag --summary-jsn" in proc.stderr
    proc = run_cli("frobnicate")
    assert proc.returncode == 2 and "unknown command" in proc.stderr
    proc = run_cli("validate", write(tmp_path, job_yaml("ok")))
    assert proc.returncode == 0 and "valid TrainingJob" in proc.stdout


def test_a_job_of_own_containers_is_valid_but_not_run_locally():
    """examples/tensorflow: every replica brings its containers, no spec.training: valid for
    Kubernetes, and kubetrain run says it cannot run it (and starts nothing)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tensorflow", "ps-strategy.yaml")
    proc = run_cli("validate", path)
    assert proc.returncode == 0, proc.stderr
    assert "the replicas' own containers (no spec.training" in proc.stdout and "2 PS, 2 workers" in proc.stdout
    proc = run_cli("run", path)
    assert proc.returncode == 2
    assert "spec.training: required by kubetrain run" in proc.stderr and "kubectl apply -f" in proc.stderr
    assert not kubetrain_processes("ps-strategy")


def test_missing_dataset_is_refused_before_any_task_starts(tmp_path):
    empty = tmp_path / "no-data"
    empty.mkdir()
    proc, summary = run_job(tmp_path, job_yaml("nodata", dataset_path=str(empty)), timeout=120)
    assert proc.returncode == 2
    assert summary is None
    assert "spec.training.dataset.path: " in proc.stderr and "train-labels-idx1-ubyte.gz" in proc.stderr
    assert not kubetrain_processes(str(tmp_path))


def test_a_task_that_cannot_load_its_data_says_why_while_restarting(tmp_path):
    # The label files pass the launcher's check; the images are missing, which
    # only the worker finds: it exits 2, and every restart and the end say why.
    data = tmp_path / "labels-only"
    data.mkdir()
    for name in ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        os.symlink(os.path.join("/usr/share/datasets/fashion-mnist", name), data / name)
    text = job_yaml("labels", dataset_path=str(data)).replace(
        "      replicas: 2\n", "      replicas: 2\n      restartPolicy: OnFailure\n")
    text = text.replace("spec:\n", "spec:\n  runPolicy: {backoffLimit: 2}\n", 1)
    proc, summary = run_job(tmp_path, text, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert summary["status"] == "Failed"
    assert re.search(r"worker-\d exited with code 2; restarting in \S+ \(restart 1, restartPolicy "
                     r"OnFailure\): .*train-images-idx3-ubyte.gz", proc.stderr), proc.stderr[-3000:]
    assert "backoffLimit (2 restarts) exceeded: " in summary["reason"], summary
    assert "train-images-idx3-ubyte.gz" in summary["reason"]
    assert not kubetrain_processes(str(tmp_path))


def test_interrupt_stops_every_child(tmp_path):
    job = write(tmp_path, job_yaml("interrupt", ps=2, workers=2, steps=1000000))
    summary = tmp_path / "summary.json"
    proc = subprocess.Popen([binary("kubetrain"), "run", job, "--summary-json", str(summary)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(kubetrain_processes(job)) < 4:
            time.sleep(0.2)
        assert len(kubetrain_processes(job)) == 4
        time.sleep(2)  # training under way
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()  # its tasks die with it (PR_SET_PDEATHSIG)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert json.loads(summary.read_text())["status"] == "Interrupted"
    assert not kubetrain_processes(job)
