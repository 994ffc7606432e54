"""The Fashion-MNIST CNN example (a layer list: conv+pool twice, dense,
dropout; 2 PS, 2 sync workers) shortened to 150 global steps: it must train
past a stated bar, its conv kernels must be placed by their stable names, and
`kubetrain eval` of the exported model must report the job's accuracy."""
import json
import os
import re

from conftest import ROOT, run_cli, run_job

EXAMPLE = os.path.join(ROOT, "examples", "fashion-mnist-cnn.yaml")


def test_cnn_example_shortened_trains_and_eval_agrees(tmp_path):
    text = open(EXAMPLE).read()
    assert "epochs: 12" in text and "everySteps: 1000" in text
    text = text.replace("epochs: 12", "steps: 150").replace("everySteps: 1000", "everySteps: 100")
    model = str(tmp_path / "cnn.ktm")
    proc, summary = run_job(tmp_path, text, "--export-model", model, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "Succeeded"
    assert summary["global_step"] == 150
    # 150 steps x 128 examples (a third of an epoch) of this CNN; chance is 0.1.
    assert summary["test_accuracy"] >= 0.70, summary
    print("cnn (150 steps):", {k: summary[k] for k in ("test_accuracy", "examples_per_second",
                                                      "training_seconds")})
    assert re.search(r"layers\.2\.kernel", proc.stderr), "conv2 kernel not placed by name"
    ev = run_cli("eval", model, "--json")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout)
    assert result["examples"] == 10000
    assert result["spec"].startswith("layers [28, 28, 1] conv2d(32,3x3,relu) maxpool2d(2)")
    assert abs(result["test_accuracy"] - summary["test_accuracy"]) < 1e-9
