"""Checkpoint directories on disks that fail (issue 9, finding 1), for real:
a tmpfs that is full from the start, one that fills up mid-job, and a
read-only mount. The job either succeeds with the model saved or fails fast
naming spec.training.checkpoint.directory and the OS error. Needs root (mount);
every mount is undone by the fixture."""
import json
import os
import subprocess
import time

import pytest

from conftest import job_yaml, run_cli, run_job, scrape


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(name, size):
        path = tmp_path / name
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        mounted.append(str(path))
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", path], check=False)


def fill(path):
    """Fills the file system holding `path` to the last byte; returns the filler file."""
    filler = os.path.join(str(path), "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def spec(name, ckpt, steps, every=100):
    return job_yaml(name, ps=1, workers=1, hidden="[64]", steps=steps,
                    extra_training=f"    checkpoint:\n      directory: {ckpt}\n      everySteps: {every}\n")


def check_refused(tmp_path, cluster_factory, name, ckpt, os_error):
    """`kubetrain run` refuses before starting anything; each task refuses too."""
    started = time.time()
    proc, summary = run_job(tmp_path, spec(name, ckpt, 100000), "--restart-policy=Never", timeout=120)
    assert time.time() - started < 60  # not after training 100000 steps
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert summary is None
    assert f"spec.training.checkpoint.directory: {ckpt} is not writable: " in proc.stderr, proc.stderr[-3000:]
    assert os_error in proc.stderr
    # The PS task and the chief (worker 0) on their own, as the operator runs them.
    c = cluster_factory(spec(name, ckpt, 100000), ps=1, workers=1)
    for kind in ("ps", "worker"):
        code = c.start(kind, 0).wait(timeout=60)
        log = c.log(kind, 0)
        assert code == 2, log
        assert f"spec.training.checkpoint.directory: {ckpt} is not writable: " in log, log
        assert os_error in log


def test_a_disk_full_from_the_start_fails_fast_naming_the_directory(tmp_path, tmpfs, cluster_factory):
    disk = tmpfs("full", "256k")
    fill(disk)
    check_refused(tmp_path, cluster_factory, "full", str(disk / "ckpt"), "No space left on device")


def test_a_read_only_directory_fails_fast_naming_the_directory(tmp_path, tmpfs, cluster_factory):
    disk = tmpfs("ro", "4m")
    (disk / "ckpt").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    check_refused(tmp_path, cluster_factory, "readonly", str(disk / "ckpt"), "Read-only file system")


def test_a_disk_that_fills_mid_job_keeps_training_and_saves_the_model(tmp_path, tmpfs, live_runs):
    # Checkpoints of the [64] adam model are ~0.6 MB; 8 MB holds a few.
    disk = tmpfs("filling", "8m")
    ckpt = str(disk / "ckpt")
    run = live_runs(tmp_path, spec("filling", ckpt, 4000, every=200))
    run.wait_for_ports(2)
    run.wait_for_step("ps-0", 400)
    filler = fill(disk)
    # Checkpoints now either make room from older ones or fail and are
    # counted; training goes on regardless.
    deadline = time.time() + 120
    step_at_fill = run.metric("ps-0", "kubetrain_global_step")
    while time.time() < deadline:
        out = run.output()
        failures = run.metric("ps-0", "kubetrain_checkpoint_failures_total") or 0
        if failures >= 1 or "out of space: deleted" in out:
            break
        time.sleep(0.1)
    out = run.output()
    assert failures >= 1 or "out of space: deleted" in out, out[-3000:]
    if failures >= 1:
        assert "No space left on device; training goes on" in out
    assert run.wait_for_step("ps-0", step_at_fill + 200) > step_at_fill
    os.unlink(filler)  # space again: the next checkpoint and the export succeed
    code, summary = run.finish(timeout=300)
    assert code == 0, run.output()[-3000:]
    assert summary["status"] == "Succeeded"
    if failures >= 1:  # the summary counts them, with the OS error
        assert summary["checkpoint_failures"] >= failures, summary
        assert "No space left on device" in summary["checkpoint_error"], summary
    model = os.path.join(ckpt, "model.ktm")
    assert summary["model_path"] == model
    ev = run_cli("eval", model, "--json")
    assert ev.returncode == 0, ev.stderr
    assert abs(json.loads(ev.stdout)["test_accuracy"] - summary["test_accuracy"]) < 1e-9


def remount(path, mode):
    """mount -o remount,<mode>, retried while a checkpoint writer holds a file open (EBUSY)."""
    deadline = time.time() + 30
    while True:
        r = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, text=True)
        if r.returncode == 0:
            return
        assert time.time() < deadline, r.stderr
        time.sleep(0.05)


def chief_failing_line(run, task):
    """The chief's kubetrain_job_checkpoints_failing sample line, or None."""
    try:
        text = scrape(run.ports[task])
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("kubetrain_job_checkpoints_failing{"):
            return line
    return None


def test_a_directory_that_turns_read_only_mid_job_is_shown_in_the_report_and_the_summary(
        tmp_path, tmpfs, live_runs):
    disk = tmpfs("flaky", "32m")
    ckpt = str(disk / "ckpt")
    run = live_runs(tmp_path, spec("flaky", ckpt, 4000, every=100))
    run.wait_for_ports(2)
    run.wait_for_step("ps-0", 300)
    remount(disk, "ro")
    try:
        # The PS counts the failures; the chief (worker 0) reads them from the
        # PS tasks and exports them, with the OS error, for the operator.
        deadline = time.time() + 120
        line = None
        while time.time() < deadline:
            line = chief_failing_line(run, "worker-0")
            if (line and "Read-only file system" in line and float(line.rsplit(" ", 1)[1]) >= 1
                    and (run.metric("worker-0", "kubetrain_job_checkpoint_failures") or 0) >= 1):
                break
            time.sleep(0.1)
        assert line and "Read-only file system" in line, (line, run.output()[-3000:])
        assert 'last_error="ps:0 at version ' in line, line
        assert (run.metric("ps-0", "kubetrain_checkpoint_failures_total") or 0) >= 1
        assert "Read-only file system; training goes on" in run.output()
        step_at_failure = run.metric("ps-0", "kubetrain_global_step")
        assert run.wait_for_step("ps-0", step_at_failure + 200) > step_at_failure  # training goes on
    finally:
        remount(disk, "rw")
    code, summary = run.finish(timeout=300)
    assert code == 0, run.output()[-3000:]
    assert summary["status"] == "Succeeded"
    # The summary JSON and text carry the count and the last OS error.
    assert summary["checkpoint_failures"] >= 1, summary
    assert summary["checkpoint_error"].startswith("ps:0 at version "), summary
    assert "Read-only file system" in summary["checkpoint_error"], summary
    out = run.output()
    assert "  storage: " in out and "checkpoint write" in out, out[-3000:]
    storage = [l for l in out.splitlines() if l.startswith("  storage: ")]
    assert len(storage) == 1 and "Read-only file system" in storage[0], storage
    # Writable again: the model is saved and evaluates as reported.
    model = os.path.join(ckpt, "model.ktm")
    assert summary["model_path"] == model
    ev = run_cli("eval", model, "--json")
    assert ev.returncode == 0, ev.stderr
    assert abs(json.loads(ev.stdout)["test_accuracy"] - summary["test_accuracy"]) < 1e-9
