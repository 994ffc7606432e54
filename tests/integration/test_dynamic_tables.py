"""Dynamic tables end to end (examples/census-income-dynamic.yaml): the
Census wide & deep model with native-country, capital-gain and capital-loss as
dynamic columns (ids hashed from the values, rows created on the PS tasks on
first use, bounded by maxRows), real processes on loopback.

- sync and async jobs train, and `kubetrain eval` of the exported model
  (which holds only the rows that exist) reports the job's figures exactly;
- a PS killed mid-job restores its dynamic shard from its checkpoint and the
  job finishes;
- a maxRows below the ids in use evicts rows, counted in the PS metrics and
  the summary, and the exported model still evaluates as the job did;
- a maxRows that a batch's ids could overflow on one PS task is refused,
  naming the field."""
import os
import signal

import pytest

from conftest import assert_eval_reproduces, census_example, run_cli, run_job, write

EXAMPLE = "census-income-dynamic.yaml"


TEST_EXAMPLES = 16281  # adult.test


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dynamic_job_trains_and_eval_of_its_model_reproduces_the_figures(tmp_path, mode):
    model = str(tmp_path / "dynamic.ktm")
    text = census_example(EXAMPLE, **{"mode: sync": f"mode: {mode}", "epochs: 8": "epochs: 3"})
    proc, summary = run_job(tmp_path, text, "--export-model", model, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "Succeeded", summary
    print(f"dynamic {mode}:", {k: summary[k] for k in ("test_accuracy", "test_auc", "test_log_loss",
                                                       "global_step", "dynamic_rows",
                                                       "dynamic_rows_evicted")})
    # The bar of the fixed-table example (issue 11), with a third of its epochs.
    assert summary["test_accuracy"] >= 0.86, summary
    assert summary["test_auc"] >= 0.91, summary
    out = proc.stdout + proc.stderr
    # Each PS task holds the rows of the ids it owns (id mod 2), created on first use.
    assert "embedding.native-country[dynamic x8]" in out, out[-3000:]
    assert "embedding.capital-gain[dynamic x8, at most 100 rows]" in out
    assert "wide.capital-loss[dynamic x1, at most 200 rows]" in out
    # 41 countries, ~120 gains, ~100 losses, in an embedding and a wide table each.
    assert 300 <= summary["dynamic_rows"] <= 1000, summary
    assert summary["dynamic_rows_evicted"] == 0, summary
    assert f"dynamic tables: {summary['dynamic_rows']} rows held, 0 evicted" in out
    assert summary["model_path"] == model, summary
    assert_eval_reproduces(model, summary, TEST_EXAMPLES)


def test_ps_killed_mid_job_restores_its_dynamic_shard(tmp_path, live_runs):
    ckpt = tmp_path / "ckpt"
    model = str(tmp_path / "dynamic.ktm")
    text = census_example(EXAMPLE, **{
        "    PS:\n      replicas: 2": "    PS:\n      replicas: 2\n      restartPolicy: OnFailure",
        "    evaluation:": f"    checkpoint:\n      directory: {ckpt}\n      everySteps: 50\n"
                          "    barrierTimeoutSeconds: 0.5\n    evaluation:"})
    run = live_runs(tmp_path, text, "--export-model", model)
    run.wait_for_ports(4)
    run.wait_for_step("ps-1", 1000)
    table = {"table": "embedding.native-country"}
    before = run.metric("ps-1", "kubetrain_table_rows", table)
    assert before and before > 0, before
    os.kill(run.pid_of("ps-1"), signal.SIGKILL)
    # The restarted task holds the checkpoint's rows: more rows than it has
    # created since it started (all of them, had it started empty).
    restored = run.wait_for_step("ps-1", 1050, timeout=300)
    rows = run.metric("ps-1", "kubetrain_table_rows", table)
    created = run.metric("ps-1", "kubetrain_table_rows_created_total", table)
    assert rows is not None and created is not None, (rows, created)
    assert rows >= before and created < rows, (before, rows, created, restored)
    code, summary = run.finish(timeout=900)
    out = run.output()
    assert code == 0, out[-4000:]
    assert summary["status"] == "Succeeded", summary
    assert summary["restarts"]["ps-1"] == 1, summary["restarts"]
    assert "ps:1 restored version" in out
    assert summary["restored_version"] >= 900, summary
    assert summary["test_accuracy"] >= 0.86, summary
    assert summary["test_auc"] >= 0.91, summary
    assert_eval_reproduces(model, summary, TEST_EXAMPLES)


def test_max_rows_evicts_rows_counts_them_and_the_model_still_evaluates_as_the_job(
        tmp_path, live_runs):
    # batchSize 32 over 2 PS tasks: maxRows >= 63; 64 rows (32 per task) hold
    # only about half of capital-gain's ~120 values.
    model = str(tmp_path / "evicting.ktm")
    text = census_example(EXAMPLE, **{
        "batchSize: 64": "batchSize: 32", "epochs: 8": "epochs: 1",
        "{column: capital-gain, dim: 8, maxRows: 200}": "{column: capital-gain, dim: 8, maxRows: 64}",
        "maxRows: 400": "maxRows: 64"})
    run = live_runs(tmp_path, text, "--export-model", model)
    run.wait_for_ports(4)
    run.wait_for_step("ps-0", 300)
    table = {"table": "embedding.capital-gain"}
    for ps in ("ps-0", "ps-1"):
        evicted = run.metric(ps, "kubetrain_table_rows_evicted_total", table)
        rows = run.metric(ps, "kubetrain_table_rows", table)
        assert evicted and evicted > 0, (ps, evicted)
        assert rows is not None and rows <= 32 + 32, (ps, rows)  # one request may pass the bound
    code, summary = run.finish(timeout=900)
    out = run.output()
    assert code == 0, out[-4000:]
    assert summary["dynamic_rows_evicted"] > 0, summary
    assert f"{summary['dynamic_rows_evicted']} evicted (maxRows)" in out
    assert_eval_reproduces(model, summary, TEST_EXAMPLES)


@pytest.mark.parametrize("old,new,field", [
    ("{column: capital-gain, dim: 8, maxRows: 200}", "{column: capital-gain, dim: 8, maxRows: 100}",
     "spec.training.model.embeddings[8].maxRows: 100 rows over 2 PS tasks is at most 50 per task, "
     "fewer than the 64 distinct ids one batch can look up in it"),
    ("maxRows: 400", "maxRows: 0", "spec.training.model.wide.maxRows: must be >= 1"),
    ("{column: education, dim: 8}", "{column: education, dim: 8, maxRows: 500}",
     "spec.training.model.embeddings[1].maxRows: only applies to a dynamic column"),
    ("{name: capital-loss, type: categorical, dynamic: true}",
     "{name: capital-loss, type: categorical, dynamic: true, hashBuckets: 10}",
     "spec.training.dataset.columns[11]: a categorical column needs exactly one of vocabulary, "
     "hashBuckets or dynamic: true"),
])
def test_bad_dynamic_specs_are_refused_naming_the_field(tmp_path, old, new, field):
    job = write(tmp_path, census_example(EXAMPLE, **{old: new}))
    proc = run_cli("validate", job)
    assert proc.returncode != 0
    assert field in proc.stdout + proc.stderr, proc.stdout + proc.stderr
