"""A job with a Chief replica, its processes started by hand with TF_CONFIG
(as the operator's pods get it): the chief is a coordinator that computes no
gradients, evaluates at evaluation.everySteps and at the end, exports the
model, reports the result and ends the job; worker 0 is a plain worker; an
evaluator evaluates on its own and never ends the job. Every process exits 0."""
import json
import re

from conftest import job_yaml, report_lines, run_cli


def test_a_chief_replica_coordinates_evaluates_and_ends_the_job(cluster_factory, tmp_path):
    steps = 300
    text = job_yaml("chief", ps=2, workers=2, chief=True, evaluator=True, steps=steps, eval_every=100)
    c = cluster_factory(text, 2, 2, chief=1, evaluator=1)
    result_file = tmp_path / "result.json"
    model = tmp_path / "model.ktm"
    c.start("chief", 0, f"--result_file={result_file}", f"--export_model={model}",
            "--progress_interval_seconds=0.2")
    c.start("evaluator", 0)
    for i in range(2):
        c.start("worker", i)
    for i in range(2):
        c.start("ps", i)
    codes = c.wait_all()
    assert all(code == 0 for code in codes.values()), (codes, c.log("chief", 0)[-3000:])

    chief_log = c.log("chief", 0)
    results = report_lines(chief_log, "kubetrain-result")
    assert len(results) == 1, chief_log[-3000:]
    result = results[0]
    assert result["status"] == "Succeeded" and result["mode"] == "sync"
    assert result["global_step"] == steps and result["target_steps"] == steps
    # Only the two workers' gradients, every step, on each of the two PS
    # tasks: the chief computed none.
    assert result["gradients_applied"] == steps * 2 * 2, result
    assert result["stale_gradients_dropped"] == 0 and result["pushes_rejected"] == 0
    assert result["test_accuracy"] > 0.6, result
    assert result["final_loss"] > 0
    # The same result in the result file (what the operator's pod writes to
    # its termination message), and progress lines while the job ran.
    assert json.loads(result_file.read_text()) == result
    progress = report_lines(chief_log, "kubetrain-progress")
    assert progress and progress[-1]["global_step"] == steps
    # Evaluated at each boundary (the first step at or after it: exactly at
    # it unless the previous evaluation was still running) and at the end.
    evaluated = [int(m) for m in re.findall(rf"chief: global step (\d+)/{steps} test accuracy", chief_log)]
    assert len(evaluated) == 3, chief_log[-3000:]
    assert 100 <= evaluated[0] < 200 and 200 <= evaluated[1] < 300 and evaluated[2] == 300, evaluated
    # The exported model evaluates to the reported accuracy.
    assert result["model_path"] == str(model)
    ev = run_cli("eval", str(model), "--json")
    assert ev.returncode == 0, ev.stderr
    assert abs(json.loads(ev.stdout)["test_accuracy"] - result["test_accuracy"]) < 1e-9

    # Worker 0 trained like any worker and reported nothing.
    worker0 = c.log("worker", 0)
    assert re.search(r"worker:0 done: \d+ local steps, global step 300", worker0), worker0[-2000:]
    assert "kubetrain-result" not in worker0 and "kubetrain-progress" not in worker0
    assert "test accuracy" not in worker0
    # The evaluator evaluated on its own and left when training was done.
    evaluator = c.log("evaluator", 0)
    assert re.search(r"evaluator: global step 300/300 test accuracy", evaluator), evaluator[-2000:]
    assert "evaluator:0 done: global step 300" in evaluator
    assert "kubetrain-result" not in evaluator
    # Both PS tasks ended when the chief said so, without waiting out their grace.
    for i in range(2):
        assert "exiting anyway" not in c.log("ps", i), c.log("ps", i)[-2000:]


def test_a_worker_is_not_the_chief_in_a_job_with_a_chief_replica(cluster_factory, tmp_path):
    """Without its chief the job does not end: worker 0 trains to the target,
    leaves and reports nothing, and the PS keeps serving (only the chief may
    end the job). The chief, started late, evaluates the final model and ends it."""
    text = job_yaml("nochief", ps=1, workers=1, chief=True, steps=30)
    c = cluster_factory(text, 1, 1, chief=1)
    c.start("ps", 0)
    worker = c.start("worker", 0)
    assert worker.wait(timeout=120) == 0, c.log("worker", 0)[-2000:]
    assert "kubetrain-result" not in c.log("worker", 0)
    assert c.procs[("ps", 0)].poll() is None  # still serving: only the chief ends the job
    c.start("chief", 0)
    codes = c.wait_all(timeout=120)
    assert all(code == 0 for code in codes.values()), (codes, c.log("chief", 0)[-2000:])
    results = report_lines(c.log("chief", 0), "kubetrain-result")
    assert len(results) == 1 and results[0]["global_step"] == 30
