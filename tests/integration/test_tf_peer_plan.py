"""The pure parts of tests/bench/tf_peer (the bench itself is not in make test: it needs TensorFlow
and prints times): the examples' hyper-parameters as the TensorFlow side receives them, and the
lines the bench reads and prints. No TensorFlow, no training; milliseconds."""
import os
import sys

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
import tf_peer  # noqa: E402


def example(name):
    return yaml.safe_load(open(os.path.join(ROOT, "examples", name)))


def test_sync_example_maps_every_hyper_parameter():
    plan = tf_peer.plan_from_job(example("fashion-mnist-sync.yaml"), 3750)
    assert plan == {
        "name": "fashion-mnist-sync", "mode": "sync", "replicas_to_aggregate": 2, "max_staleness": None,
        "ps": 2, "workers": 2,
        "model": {"input_dim": 784, "num_classes": 10, "hidden_units": [256, 128]},
        "data": "/usr/share/datasets/fashion-mnist",
        "optimizer": {"type": "adam", "learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7},
        "batch_size": 64, "target_steps": 3750, "seed": 7, "eval_every_steps": 500,
    }


def test_async_example_aggregates_nothing_and_keeps_its_staleness_bound_for_the_record():
    plan = tf_peer.plan_from_job(example("fashion-mnist-async.yaml"), 7500)
    assert (plan["mode"], plan["replicas_to_aggregate"], plan["max_staleness"]) == ("async", 1, 8)
    assert plan["optimizer"]["learning_rate"] == 0.0005
    assert (plan["eval_every_steps"], plan["target_steps"]) == (1000, 7500)


@pytest.mark.parametrize("change", [
    lambda t: t.update(shuffleBuffer=1024),           # a field the TensorFlow side would not follow
    lambda t: t["optimizer"].update(type="sgd"),
    lambda t: t["model"].update(type="softmax"),
])
def test_what_is_not_mapped_stops_the_bench(change):
    job = example("fashion-mnist-sync.yaml")
    change(job["spec"]["training"])
    with pytest.raises(ValueError):
        tf_peer.plan_from_job(job, 3750)


def test_lines_read_and_printed():
    assert tf_peer.target_steps_from_validate(
        'x.yaml: valid TrainingJob "a": sync mode, mlp model, 2 PS, 2 workers, 3750 global steps\n') == 3750
    assert tf_peer.parse_tf_result('noise\ntf_peer_result {"examples": 10, "seconds": 2.0}\n') == {
        "examples": 10, "seconds": 2.0}
    run = {"eps": 100.0, "acc": 0.875, "cpu_s": 9.0, "wall_s": 12.0}
    line = tf_peer.summary_line("sync", "compat_v1", 1, [2.5], [run], [dict(run, eps=50.0)])
    keys = list(tf_peer.parse_key_values(line))
    assert keys[-7:] == ["kubetrain_eps", "tf_eps", "ratio", "kubetrain_acc", "tf_acc", "kubetrain_cpu_s", "tf_cpu_s"]
    assert tf_peer.parse_key_values(line)["ratio"] == "2.00"
    # A head that reports AUC (the Census wide & deep job) adds both sides' AUC last.
    line = tf_peer.summary_line("census-wide-deep", "compat_v1", 1, [2.5], [dict(run, auc=0.9274)],
                                [dict(run, eps=50.0, auc=0.9275)])
    values = tf_peer.parse_key_values(line)
    assert list(values)[-2:] == ["kubetrain_auc", "tf_auc"]
    assert (values["kubetrain_auc"], values["tf_auc"], values["ratio"]) == ("0.9274", "0.9275", "2.00")
