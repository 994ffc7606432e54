"""Multi-valued features end to end (examples/census-income-profile.yaml): a CSV
column holding several values (`separator`, `maxValues`) looked up by id in an
embedding table with each combiner and in the wide part, real UCI data, real
processes on loopback. Each combiner reaches the example's bar and trains a
different model (the combiner reaches the job); bad multi-valued specs and data
are refused naming the field, or the file and line."""
import filecmp
import os
import subprocess
import sys

from conftest import CENSUS_DATA as DATA, assert_validate_refuses, census_example, run_job


def example_text(**replace):
    return census_example("census-income-profile.yaml", **replace)


def test_committed_profile_files_are_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, os.path.join(DATA, "to_profile.py"), str(tmp_path)], check=True)
    for name in ("adult.data.profile.csv.gz", "adult.test.profile.csv.gz"):
        assert filecmp.cmp(tmp_path / name, os.path.join(DATA, name), shallow=False), name


def test_each_combiner_reaches_085_and_trains_its_own_model(tmp_path):
    losses = {}
    for combiner in ("sum", "mean", "sqrtn"):
        run_dir = tmp_path / combiner
        run_dir.mkdir()
        proc, summary = run_job(run_dir, example_text(**{"combiner: mean": f"combiner: {combiner}"}),
                                timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert summary["status"] == "Succeeded"
        assert summary["test_accuracy"] >= 0.85, (combiner, summary)
        assert summary["test_auc"] >= 0.90, (combiner, summary)
        out = proc.stdout + proc.stderr
        # One table per use of the bag, its rows split over both PS tasks.
        assert "embedding.profile[500 of 1000x16 rows]" in out, out[-3000:]
        assert "wide.profile[500 of 1000x1 rows]" in out, out[-3000:]
        losses[combiner] = summary["test_log_loss"]
        print(f"profile combiner {combiner}:", {k: summary[k] for k in ("test_accuracy", "test_auc",
                                                                        "test_log_loss", "global_step")})
    # Same data, seed and batches: only the combiner differs, so must the models.
    assert len(set(losses.values())) == 3, losses


BAD_SPECS = [
    ({"separator: \"|\", maxValues: 8": "separator: \"|\""},
     "spec.training.dataset.columns[5].maxValues: required with separator"),
    ({"separator: \"|\", maxValues: 8": "maxValues: 8"},
     "spec.training.dataset.columns[5].maxValues: only applies to a multi-valued column"),
    ({"maxValues: 8": "maxValues: 0"},
     "spec.training.dataset.columns[5].maxValues: must be in [1, 1024], got 0"),
    ({"separator: \"|\"": "separator: \"||\""},
     "spec.training.dataset.columns[5].separator: must be one character"),
    ({"separator: \"|\"": "separator: \",\""},
     "spec.training.dataset.columns[5].separator: must differ from the dataset's delimiter \",\""),
    ({"{name: age, type: numeric, normalize: true}":
      "{name: age, type: numeric, normalize: true, separator: \"|\"}"},
     "spec.training.dataset.columns[0].separator: unknown field"),
]


def test_bad_multivalued_specs_are_refused_naming_the_field(tmp_path):
    for replace, message in BAD_SPECS:
        assert_validate_refuses(tmp_path, example_text(**replace), message)


def test_a_field_with_more_values_than_maxvalues_names_the_file_and_line(tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("age,education-num,capital-gain,capital-loss,hours-per-week,profile,income\n"
                    "39,13,0,0,40,a|b,<=50K\n"
                    "50,13,0,0,13,a|b|c,>50K\n")
    text = example_text(**{"maxValues: 8": "maxValues: 2"}).replace(
        os.path.join(DATA, "adult.data.profile.csv.gz"), str(data))
    assert_validate_refuses(
        tmp_path, text, f"{data}:3: column 'profile': more than maxValues (2) values in \"a|b|c\"")
