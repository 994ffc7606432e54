"""`kubetrain run` as a user meets it: bad input gets a clear error and starts
nothing; Ctrl-C stops every child; a broken dataset fails the job clearly."""
import json
import os
import re
import signal
import subprocess
import time

from conftest import (CENSUS_DATA, binary, census_bad_copy, census_example, job_yaml, run_cli,
                      run_job, write)


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
    assert f"spec.training.dataset.path: {empty}/train-images-idx3-ubyte.gz: cannot open" in proc.stderr, \
        proc.stderr
    assert not kubetrain_processes(str(tmp_path))


def census_steps(**replace):
    """The Census CSV example, shortened to 60 steps, with more replacements."""
    return census_example("census-income-mlp.yaml", **{"epochs: 6": "steps: 60"}, **replace)


def test_validate_checks_the_csv_data_naming_field_and_file_line(tmp_path):
    ok = run_cli("validate", write(tmp_path, census_steps()))
    assert ok.returncode == 0, ok.stderr
    assert "data: the first 100 records of every training and test file parse" in ok.stdout
    # adult.test: line 1 is a comment, so line 30 is within the first 100 records.
    bad = census_bad_copy(tmp_path, "adult.test", {30: "41, Private, 1, HS-grad, 9, Divorced, Sales, "
                                                       "Unmarried, White, Male, 0, 0, forty, Cuba, <=50K."})
    job = write(tmp_path, census_steps(**{f"testFiles: [{CENSUS_DATA}/adult.test.gz]": f"testFiles: [{bad}]"}))
    proc = run_cli("validate", job)
    assert proc.returncode == 2
    assert (f"error: {job}: spec.training.dataset.testFiles[0]: {bad}:30: column 'hours-per-week': "
            f"expected a number, got \"forty\"") in proc.stderr, proc.stderr
    missing = str(tmp_path / "nope" / "adult.test.csv")
    job = write(tmp_path, census_steps(**{f"testFiles: [{CENSUS_DATA}/adult.test.gz]": f"testFiles: [{missing}]"}),
                "missing.yaml")
    proc = run_cli("validate", job)
    assert proc.returncode == 2
    assert f"error: {job}: spec.training.dataset.testFiles[0]: {missing}: no such file" in proc.stderr, proc.stderr
    proc = run_cli("validate", job, "--skip-data")
    assert proc.returncode == 0, proc.stderr
    assert "data: not checked (--skip-data)" in proc.stdout


def test_run_refuses_a_missing_csv_test_file_naming_it(tmp_path):
    missing = str(tmp_path / "adult.test.csv")
    text = census_steps(**{f"testFiles: [{CENSUS_DATA}/adult.test.gz]": f"testFiles: [{missing}]"})
    proc, summary = run_job(tmp_path, text, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert summary is None
    assert f"spec.training.dataset.testFiles[0]: {missing}: no such file" in proc.stderr, proc.stderr
    assert "[worker-" not in proc.stderr and "[ps-" not in proc.stderr  # no task started
    assert not kubetrain_processes(str(tmp_path))


def test_a_task_that_cannot_load_its_data_says_why_while_restarting(tmp_path):
    # A bad record past the first 100 the launcher's check reads: only the
    # workers find it (they scan the training set at start); they exit 2, and
    # every restart and the end say why.
    bad = census_bad_copy(tmp_path, "adult.data", {500: "x, Private, 1, HS-grad, 9, Divorced, Sales, "
                                                        "Unmarried, White, Male, 0, 0, 40, Cuba, <=50K"})
    text = census_steps(**{f"trainFiles: [{CENSUS_DATA}/adult.data.gz]": f"trainFiles: [{bad}]"})
    text = text.replace("      replicas: 2\n", "      replicas: 2\n      restartPolicy: OnFailure\n")
    text = text.replace("spec:\n", "spec:\n  runPolicy: {backoffLimit: 2}\n", 1)
    proc, summary = run_job(tmp_path, text, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert summary["status"] == "Failed"
    assert re.search(r"worker-\d exited with code 2; restarting in \S+ \(restart 1, restartPolicy "
                     r"OnFailure\): .*adult.data:500: column 'age'", proc.stderr), proc.stderr[-3000:]
    assert "backoffLimit (2 restarts) exceeded: " in summary["reason"], summary
    assert f"{bad}:500: column 'age'" in summary["reason"]


def test_a_task_writes_its_fatal_reason_where_kubetrain_termination_log_says(tmp_path):
    """What the operator's Restarting/Failed conditions quote: the task's one-line
    reason in the file $KUBETRAIN_TERMINATION_LOG names (the operator sets
    /dev/termination-log); without the variable nothing is written."""
    job = write(tmp_path, job_yaml("reason", ps=1, workers=1, dataset_path=str(tmp_path / "nodata")))
    log = tmp_path / "termination-log"
    log.write_text("")
    tf = {"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
    env = dict(os.environ, TF_CONFIG=json.dumps(tf), KUBETRAIN_TERMINATION_LOG=str(log))
    proc = subprocess.run([binary("kubetrain-worker"), f"--config={job}"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    reason = log.read_text()
    assert reason.endswith("\n") and reason.count("\n") == 1, reason
    assert f"{tmp_path}/nodata/train-images-idx3-ubyte.gz: cannot open: No such file or directory" in reason, reason
    assert reason.strip() in proc.stderr  # the same words as its "error:" log line
    env.pop("KUBETRAIN_TERMINATION_LOG")
    log.write_text("")
    proc = subprocess.run([binary("kubetrain-worker"), f"--config={job}"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and log.read_text() == ""
