"""Checkpoints as a user meets them through `kubetrain run`: a job resumes from
its checkpoint directory; a corrupt or truncated newest checkpoint is reported
by name and the previous one used; a checkpoint of another model is refused
with a clear error; the exported model evaluates with `kubetrain eval`."""
import glob
import json
import os

from conftest import job_yaml, run_cli, run_job


def spec(name, ckpt, steps, hidden="[32]"):
    return job_yaml(name, ps=1, workers=1, hidden=hidden, steps=steps,
                    extra_training=f"    checkpoint:\n      directory: {ckpt}\n      everySteps: 100\n")


def checkpoints(ckpt):
    return sorted(glob.glob(os.path.join(ckpt, "ps-0", "ckpt-*.ktc")))


def test_resume_skips_corrupt_and_truncated_checkpoints(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    proc, summary = run_job(tmp_path, spec("resume", ckpt, 300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = checkpoints(ckpt)
    assert [os.path.basename(f) for f in files] == [
        "ckpt-000000000100.ktc", "ckpt-000000000200.ktc", "ckpt-000000000300.ktc"]
    # The chief exported the final model next to the checkpoints; it evaluates.
    model = os.path.join(ckpt, "model.ktm")
    assert summary["model_path"] == model
    ev = run_cli("eval", model, "--json")
    assert ev.returncode == 0, ev.stderr
    assert abs(json.loads(ev.stdout)["test_accuracy"] - summary["test_accuracy"]) < 1e-9

    # Corrupt the newest (300) and truncate the next (200): the PS says so by
    # name and resumes from 100.
    newest, middle = files[2], files[1]
    data = bytearray(open(newest, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(newest, "wb").write(bytes(data))
    open(middle, "r+b").truncate(os.path.getsize(middle) // 2)
    proc, summary = run_job(tmp_path, spec("resume", ckpt, 400))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ckpt-000000000300.ktc" in proc.stderr and "checksum mismatch" in proc.stderr
    assert "ckpt-000000000200.ktc" in proc.stderr and "truncated" in proc.stderr
    assert "ps:0 restored version 100" in proc.stderr
    assert summary["status"] == "Succeeded" and summary["global_step"] == 400
    assert summary["restored_version"] == 100


def test_checkpoint_of_another_model_is_refused(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    proc, _ = run_job(tmp_path, spec("model-a", ckpt, 100, hidden="[32]"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = {f: open(f, "rb").read() for f in checkpoints(ckpt)}
    proc, summary = run_job(tmp_path, spec("model-b", ckpt, 100, hidden="[48]"))
    assert proc.returncode == 1
    assert summary["status"] == "Failed"
    assert "ps-0 exited with code 2" in summary["reason"]
    assert "refusing to load it" in proc.stderr
    # Nothing was overwritten or deleted.
    assert {f: open(f, "rb").read() for f in checkpoints(ckpt)} == before
