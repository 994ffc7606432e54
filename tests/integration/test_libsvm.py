"""The LIBSVM-format Census example end to end: the committed
data/census-income/adult.*.libsvm.gz are exactly what to_libsvm.py makes from
the UCI CSV files; logistic regression on them (real processes on loopback)
reaches test accuracy >= 0.845 on the 16,281-row test set, and `kubetrain eval`
of the exported model reports the same figures. Bad records are named by
file:line and token, or skipped and counted."""
import gzip
import json
import os
import subprocess
import sys

from conftest import (CENSUS_DATA as DATA, assert_eval_reproduces, assert_validate_refuses,
                      census_bad_copy, census_example, run_cli, run_job, write)


def example_text(**replace):
    return census_example("census-income-libsvm.yaml", **replace)


def test_committed_files_are_the_converters_output(tmp_path):
    subprocess.run([sys.executable, os.path.join(DATA, "to_libsvm.py"), str(tmp_path)], check=True)
    for name in ("adult.data.libsvm.gz", "adult.test.libsvm.gz"):
        made = gzip.open(tmp_path / name).read()
        assert made == gzip.open(os.path.join(DATA, name)).read(), name
    assert len(gzip.open(tmp_path / "adult.test.libsvm.gz").read().splitlines()) == 16281


def test_libsvm_example_reaches_0845_and_eval_agrees(tmp_path):
    model = str(tmp_path / "lr.ktm")
    proc, summary = run_job(tmp_path, example_text(), "--export-model", model, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "Succeeded"
    assert summary["test_accuracy"] >= 0.845, summary
    assert summary["test_auc"] > 0.89, summary
    assert 0 < summary["test_log_loss"] < 0.35, summary
    assert summary["records_skipped"] == 0
    print("census libsvm:", {k: summary[k] for k in ("test_accuracy", "test_auc",
                                                     "test_log_loss", "global_step")})
    ev = run_cli("eval", model, "--json")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout)
    assert result["examples"] == 16281
    assert result["spec"] == "layers [104] dense(1) sigmoid"
    for key in ("test_accuracy", "test_auc", "test_log_loss"):
        assert abs(result[key] - summary[key]) < 1e-9, (key, result, summary)


def bad_copy(tmp_path, bad_lines, crlf=False):
    """adult.test.libsvm with some lines replaced: {line number: text}."""
    return census_bad_copy(tmp_path, "adult.test.libsvm", bad_lines, crlf)


def test_bad_record_is_named_by_file_line_and_token(tmp_path):
    bad = bad_copy(tmp_path, {17: "+1 1:0.5 26:x 64:1"}, crlf=True)
    text = example_text(**{f"trainFiles: [{DATA}/adult.data.libsvm.gz]": f"trainFiles: [{bad}]"})
    proc = run_cli("validate", write(tmp_path, text))
    assert proc.returncode != 0
    assert f"{bad}:17: token \"26:x\": expected a number after ':'" in proc.stderr, proc.stderr
    text = example_text(**{f"trainFiles: [{DATA}/adult.data.libsvm.gz]": f"trainFiles: [{bad}]",
                           "numFeatures: 104": "numFeatures: 60"})
    proc = run_cli("validate", write(tmp_path, text))
    assert proc.returncode != 0
    assert f"{bad}:1: token \"63:0.397959\": index 63 outside [1, 60]" in proc.stderr, proc.stderr


def test_skipped_records_are_counted_in_the_summary(tmp_path):
    bad = bad_copy(tmp_path, {5: "garbage", 9: "2 1:1", 11: "# a comment line is not a record"})
    text = example_text(**{
        f"testFiles: [{DATA}/adult.test.libsvm.gz]": f"testFiles: [{bad}]",
        "onBadRecord: fail": "onBadRecord: skip",
        "epochs: 8": "steps: 60",
    })
    proc, summary = run_job(tmp_path, text, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["records_skipped"] == 2, summary
    assert "bad records skipped 2" in proc.stdout + proc.stderr


def sparse_example_text(**replace):
    return census_example("census-income-libsvm-sparse.yaml", **replace)


def test_libsvm_weighted_column_feeds_the_tables_reaches_0845_and_eval_agrees(tmp_path):
    """The same records as one weighted column (ids: the indices, weights: the
    values) looked up by an embedding and the wide part, sharded over 2 PS."""
    model = str(tmp_path / "sparse.ktm")
    proc, summary = run_job(tmp_path, sparse_example_text(), "--export-model", model, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "Succeeded"
    assert summary["test_accuracy"] >= 0.845, summary
    assert summary["test_auc"] >= 0.90, summary
    out = proc.stdout + proc.stderr
    assert "embedding.features[52 of 104x8 rows]" in out, out[-3000:]
    assert "wide.features[52 of 104x1 rows]" in out, out[-3000:]
    print("census libsvm weighted column:", {k: summary[k] for k in (
        "test_accuracy", "test_auc", "test_log_loss", "global_step")})
    assert_eval_reproduces(model, summary, 16281)


def test_libsvm_weights_reach_the_model(tmp_path):
    """Every value set to 1 (the one-hot features are 1 already; the numbers
    lose their magnitude) trains another model: the weights are used."""
    ones = tmp_path / "ones.libsvm"
    with gzip.open(os.path.join(DATA, "adult.data.libsvm.gz"), "rt") as f:
        ones.write_text("".join(" ".join([t.split(":")[0] + ":1" if ":" in t else t
                                          for t in line.split()]) + "\n" for line in f))
    base = sparse_example_text(**{"epochs: 8": "epochs: 1"})
    runs = {}
    for name, text in (("values", base),
                       ("ones", base.replace(os.path.join(DATA, "adult.data.libsvm.gz"), str(ones)))):
        run_dir = tmp_path / name
        run_dir.mkdir()
        proc, summary = run_job(run_dir, text, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = summary["test_log_loss"]
    assert runs["values"] != runs["ones"], runs


BAD_WEIGHTED = [
    ({"weightedColumn: {name: features, maxValues: 16}": "weightedColumn: {name: features}"},
     "spec.training.dataset.weightedColumn.maxValues: required"),
    ({"maxValues: 16}": "maxValues: 0}"},
     "spec.training.dataset.weightedColumn.maxValues: must be in [1, 65536], got 0"),
    ({"- {column: features, dim: 8, combiner: sum}": "- {column: feature, dim: 8, combiner: sum}"},
     "spec.training.model.embeddings[0].column: no column \"feature\"; the libsvm dataset's "
     "weighted column is \"features\""),
    ({"      weightedColumn: {name: features, maxValues: 16}\n": ""},
     "spec.training.model.embeddings[0].column: a libsvm dataset's features are looked up as one "
     "weighted column: set spec.training.dataset.weightedColumn"),
    ({"        columns: [features]\n": "        columns: [features]\n        crossed:\n"
      "          - {columns: [features, features], hashBuckets: 10}\n"},
     "cannot be crossed"),
]


def test_bad_weighted_column_specs_are_refused_naming_the_field(tmp_path):
    for replace, message in BAD_WEIGHTED:
        assert_validate_refuses(tmp_path, sparse_example_text(**replace), message)


def test_a_record_with_more_features_than_maxvalues_names_the_file_and_line(tmp_path):
    # The training file has at most 12 features a record.
    path = bad_copy(tmp_path, {3: "1 " + " ".join(f"{i}:1" for i in range(1, 14))})
    text = sparse_example_text(**{"maxValues: 16": "maxValues: 12"}).replace(
        os.path.join(DATA, "adult.test.libsvm.gz"), path)
    assert_validate_refuses(tmp_path, text,
                            f"{path}:3: 13 features, more than weightedColumn.maxValues (12)")
