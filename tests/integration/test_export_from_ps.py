"""The end of a job never destroys the only copy of the parameters (issue 9,
finding 1), for real: the checkpoint directory (a tmpfs) turns read-only
before the end, so neither the chief's model.ktm nor the PS tasks' final
checkpoints can be written. The PS tasks then hold the parameters read-only,
`kubetrain run` tells the user the export command (with the job's
credentials directory) and keeps them up, and `kubetrain export --from-ps`
writes the model elsewhere (refused without the credentials), which `kubetrain
eval` scores exactly as the chief did. Needs root (mount)."""
import json
import os
import re
import signal
import subprocess
import time

from conftest import job_yaml, run_cli, write
from test_storage_faults import remount, tmpfs  # noqa: F401 (fixture)


def spec(name, ckpt, lr=0.002):
    return job_yaml(name, ps=2, workers=1, hidden="[64]", steps=3000, lr=lr,
                    extra_training=f"    checkpoint:\n      directory: {ckpt}\n"
                                   "      everySteps: 100\n")


def wait_for(run, pattern, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, run.output(), re.M)
        if m:
            return m
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} in: " + run.output()[-4000:])


def test_ps_tasks_that_cannot_checkpoint_hold_the_model_for_kubetrain_export(
        tmp_path, tmpfs, live_runs):  # noqa: F811
    disk = tmpfs("export", "32m")
    ckpt = str(disk / "ckpt")
    run = live_runs(tmp_path, spec("holdexp", ckpt), "--restart-policy=Never")
    run.wait_for_ports(3)
    run.wait_for_step("ps-0", 300)
    remount(disk, "ro")
    try:
        # Training ends, the chief cannot export, the job fails, the PS tasks
        # are stopped and cannot write their final checkpoints: they hold.
        command = wait_for(run, r"^\s+(kubetrain export --from-ps \S+ --job \S+ --output \S+ "
                                r"--auth-dir \S+)$", 240).group(1)
        out = run.output()
        assert "could not write its final checkpoint" in out, out[-4000:]
        assert "serving the parameters read-only for `kubetrain export --from-ps`" in out
        assert "Ctrl-C stops them now" in out
        chief_accuracy = float(re.search(
            r"chief: global step 3000/3000 test accuracy ([0-9.]+)", out).group(1))
        for ps in ("ps-0", "ps-1"):
            assert run.metric(ps, "kubetrain_ps_holding_unsaved_parameters") == 1, ps
        args = command.split()[1:]
        addresses = args[args.index("--from-ps") + 1]
        job = args[args.index("--job") + 1]
        auth = ["--auth-dir", args[args.index("--auth-dir") + 1]]
        assert job == run.job and len(addresses.split(",")) == 2, command
        # The PS tasks admit only the job's own credentials (kubetrain run made them).
        stranger = run_cli("export", "--from-ps", addresses, "--job", job, "--output",
                           str(tmp_path / "stranger.ktm"))
        assert stranger.returncode == 2, stranger.stderr
        assert "GetInfo: no credentials" in stranger.stderr, stranger.stderr
        assert "give the task this job's auth directory" in stranger.stderr, stranger.stderr
        assert not (tmp_path / "stranger.ktm").exists()

        # PS tasks of another job (another learning rate) or the wrong count: refused, named.
        other = write(tmp_path, spec("holdexp", ckpt, lr=0.003), "other.yaml")
        wrong = run_cli("export", "--from-ps", addresses, "--job", other, "--output",
                        str(tmp_path / "wrong.ktm"), *auth)
        assert wrong.returncode == 2, wrong.stderr
        assert "differs: " in wrong.stderr and "learningRate" in wrong.stderr, wrong.stderr
        assert not (tmp_path / "wrong.ktm").exists()
        one = run_cli("export", "--from-ps", addresses.split(",")[0], "--job", job, "--output",
                      str(tmp_path / "one.ktm"), *auth)
        assert one.returncode == 2 and "spec.replicaSpecs.PS.replicas" in one.stderr, one.stderr

        # The export the run printed, to another place.
        saved = str(tmp_path / "saved" / "model.ktm")
        exported = run_cli("export", "--from-ps", addresses, "--job", job, "--output", saved, *auth)
        assert exported.returncode == 0, exported.stderr
        assert "at global step 3000 from 2 PS tasks" in exported.stderr, exported.stderr
        ev = run_cli("eval", saved, "--json")
        assert ev.returncode == 0, ev.stderr
        assert abs(json.loads(ev.stdout)["test_accuracy"] - chief_accuracy) < 1e-4, ev.stdout
        assert json.loads(ev.stdout)["global_step"] == 3000
        assert run.proc.poll() is None  # still waiting for the PS tasks
    finally:
        run.proc.send_signal(signal.SIGINT)  # Ctrl-C: the PS tasks exit at once
        code, summary = run.finish(timeout=60)
        remount(disk, "rw")
    assert code == 1, run.output()[-4000:]
    assert summary["status"] == "Failed"
    assert "cannot export the final model to " + os.path.join(ckpt, "model.ktm") in summary["reason"]
    assert summary["export_command"] == command, summary
    # kubetrain run removed the job's credentials when it ended.
    assert not os.path.exists(auth[1]), auth
    assert summary["exit_codes"]["ps-0"] == 1 and summary["exit_codes"]["ps-1"] == 1, summary
    assert "  parameters: ps-0, ps-1 could not write the final checkpoint" in run.output()
