"""The pure parts of tests/bench/scaling (the bench itself is not in make test: it prints times): the
job each configuration trains, the model's bytes, the raw-TCP bound and the last line. No training;
milliseconds."""
import os
import sys

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
import scaling  # noqa: E402


def example():
    return yaml.safe_load(open(scaling.EXAMPLE))


def test_the_sync_example_rewritten_per_configuration():
    job = example()
    out = scaling.job_for(job, 4, 1, 2000)
    t = out["spec"]["training"]
    assert out["metadata"]["name"] == "scaling-w4-ps1"
    assert out["spec"]["replicaSpecs"]["Worker"]["replicas"] == 4
    assert out["spec"]["replicaSpecs"]["PS"]["replicas"] == 1
    assert (t["replicasToAggregate"], t["steps"], t["evaluation"]["everySteps"]) == (4, 2000, 0)
    assert "epochs" not in t
    # everything else as in the example, and the example itself untouched
    assert t["model"] == {"type": "mlp", "hiddenUnits": [256, 128]} and t["batchSize"] == 64
    assert job["spec"]["training"]["epochs"] == 8 and job["spec"]["replicaSpecs"]["Worker"]["replicas"] == 2


def test_model_bytes_and_bound():
    # 784-256-128-10: (784*256 + 256 + 256*128 + 128 + 128*10 + 10) floats, as step_bench prints
    assert scaling.mlp_model_bytes(example()["spec"]["training"]) == 940584
    assert scaling.bytes_per_global_step(940584, 4) == 4 * 2 * 940584
    # 2 workers x 64 examples per global step, 2 x 1 MB x 2 workers at 1 GB/s: 4 ms a step
    assert scaling.tcp_bound_eps(64, 2, 1_000_000, 1.0) == pytest.approx(128 / 0.004)


def test_refuses_what_it_does_not_measure():
    job = example()
    job["spec"]["training"]["mode"] = "async"
    with pytest.raises(ValueError):
        scaling.job_for(job, 1, 1, 10)
    with pytest.raises(ValueError):
        scaling.mlp_model_bytes({"model": {"type": "softmax"}, "dataset": {"name": "fashion-mnist"}})


def test_last_line():
    results = {(1, 1): [{"eps": 1000.0, "tcp_eps": 4000.0}], (2, 1): [{"eps": 1500.0, "tcp_eps": 4100.0}]}
    line = scaling.summary_line([(1, 1), (2, 1)], results, 2000, 1, [2.5], 940584)
    kv = scaling.parse_key_values(line)
    assert list(kv)[:3] == ["w1_ps1_eps", "w1_ps1_tcp_eps", "w1_ps1_vs_tcp"]
    assert (kv["w1_ps1_vs_tcp"], kv["w2_ps1_eps"], kv["steps"], kv["load"]) == ("0.250", "1500", "2000", "2.50")
    # with the batch: ms per global step (2 workers x 64 examples at 1500 examples/s)
    line = scaling.summary_line([(1, 1), (2, 1)], results, 2000, 1, [2.5], 940584, 64)
    assert scaling.parse_key_values(line)["w2_ps1_step_ms"] == "85.333"
