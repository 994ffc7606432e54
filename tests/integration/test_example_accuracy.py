"""Every example's documented accuracy is checked by a test, so a change that
silently costs accuracy fails: the README's figures table names each example
with its accuracy, and some test runs the example (a short run where the full
one is too long) and asserts it. This file holds that guard and the runs of
the examples no other test covers; the rest are checked where their feature
is tested (test_census*, test_cnn, test_libsvm, test_multivalued,
test_dynamic_tables)."""
import glob
import os
import re

from conftest import ROOT, run_job

README = os.path.join(ROOT, "README.md")


def training_examples():
    """examples/*.yaml that train a kubetrain model (examples/tensorflow/ runs
    the user's own TensorFlow program; tests/tensorflow checks it)."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.yaml")))


def documented_accuracy(example):
    """The README figures row of `example`: its first accuracy figure."""
    for line in open(README):
        if line.startswith("| accuracy, `examples/" + example + "`"):
            figure = line.split("|")[2]
            m = re.search(r"(0\.\d{3,4})", figure)
            assert m, (example, figure)
            return float(m.group(1))
    raise AssertionError(f"README.md's figures table has no accuracy row for examples/{example}")


def files_asserting_accuracy_of(example):
    """Test files that name `example` and assert an accuracy."""
    found = []
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True):
        text = open(path).read()
        if example in text and re.search(r"assert .*(accuracy|auc)", text):
            found.append(os.path.relpath(path, ROOT))
    return found


def test_every_example_has_a_documented_accuracy_checked_by_a_test():
    examples = training_examples()
    assert len(examples) >= 11, examples
    for example in examples:
        documented_accuracy(example)
        assert files_asserting_accuracy_of(example), f"no test runs examples/{example} and asserts its accuracy"


def run_example(tmp_path, example):
    proc, summary = run_job(tmp_path, open(os.path.join(ROOT, "examples", example)).read(),
                            timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "Succeeded", summary
    return summary


def test_fashion_mnist_sync_reaches_its_documented_accuracy(tmp_path):
    """Sync training is deterministic on one machine (the same bits every run:
    test_reproducibility.py). Across machines it is not bit for bit: the build
    is -march=native, and a CPU with AVX-512 sums a GEMM in another order than
    one with AVX2, and two AVX2 CPUs differ too (0.8790 with AVX-512; 0.8780 on
    an Intel, 0.8831 on an AMD EPYC with AVX2). So: the README's figure within
    half a point, the band issue 25 allows a comparison with TensorFlow."""
    summary = run_example(tmp_path, "fashion-mnist-sync.yaml")
    assert abs(summary["test_accuracy"] - documented_accuracy("fashion-mnist-sync.yaml")) <= 0.005, summary


def test_fashion_mnist_async_reaches_its_documented_accuracy(tmp_path):
    """Async training depends on the arrival order of pushes: within a point."""
    summary = run_example(tmp_path, "fashion-mnist-async.yaml")
    assert summary["test_accuracy"] >= documented_accuracy("fashion-mnist-async.yaml") - 0.01, summary


def test_softmax_seed_reaches_its_documented_accuracy(tmp_path):
    summary = run_example(tmp_path, "softmax-seed.yaml")
    assert summary["test_accuracy"] >= documented_accuracy("softmax-seed.yaml") - 0.005, summary
