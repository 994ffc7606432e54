"""Hostile YAML (issue 26): a job file of under 1 KB whose aliases stand for
billions of nodes (a "billion laughs"), or an alias inside the node it names,
is refused at once by `validate` and `run`, naming the alias's line and column;
before, both spun for hours (or overflowed the stack)."""
import subprocess

import pytest

from conftest import run_cli, write

# One minute was the symptom; a refusal takes milliseconds.
TIMEOUT = 10


def alias_bomb(indent):
    """Ten anchors, each a list of ten aliases of the previous one (10^9 nodes)."""
    pad = " " * indent
    lines = [f'{pad}a0: &a0 ["lol"]']
    lines += [f"{pad}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


def insert_after(text, line, block):
    assert line in text, line
    return text.replace(line, line + block, 1)


# A valid job, short enough that each hostile file stays under 1 KB.
BASE = """apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: bomb
spec:
  replicaSpecs:
    PS:
      replicas: 1
    Worker:
      replicas: 1
  training:
    model: {type: mlp, hiddenUnits: [32]}
    optimizer: {type: adam, learningRate: 0.002}
    batchSize: 32
    steps: 200
"""
NAME_LINE = "  name: bomb\n"
WORKER_LINE = "    Worker:\n      replicas: 1\n"


def test_the_base_job_is_valid(tmp_path):
    proc = run_cli("validate", write(tmp_path, BASE), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr

# Where the hostile block goes: the free-form maps the spec does not read field
# by field (metadata.labels and .annotations, a pod template, status).
CASES = {
    "labels": insert_after(BASE, NAME_LINE, "  labels:\n" + alias_bomb(4)),
    "annotations": insert_after(BASE, NAME_LINE, "  annotations:\n" + alias_bomb(4)),
    "template": insert_after(BASE, WORKER_LINE, "      template:\n        metadata:\n" + alias_bomb(10)),
    "status": BASE + "status:\n" + alias_bomb(2),
}


def position_of_crossing(text):
    """Line and column (from 1) of the 4th *a4 on the a5 line: there the
    aliases would repeat more than 100000 nodes (a4 is 21111 of them)."""
    for number, line in enumerate(text.split("\n"), 1):
        if "a5: &a5 [" in line:
            column = line.index("[") + 2
            return number, column + 3 * len("*a4, ")
    raise AssertionError("no a5 line")


@pytest.mark.parametrize("where", sorted(CASES))
@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_alias_bomb_is_refused_at_once_naming_the_alias(tmp_path, command, where):
    text = CASES[where]
    assert len(text.encode()) < 1024
    job = write(tmp_path, text, f"{where}.yaml")
    try:
        proc = run_cli(command, job, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`kubetrain {command}` still busy after {TIMEOUT} s on a {len(text)}-byte file")
    line, column = position_of_crossing(text)
    assert proc.returncode == 2, proc.stderr
    assert (f"{job}: invalid YAML at line {line}, column {column}: alias *a4 would expand the "
            "document past 100000 nodes") in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_alias_inside_its_own_node_is_refused(tmp_path, command):
    # yaml-cpp builds a tree that contains itself; walking it overflowed the stack.
    job = write(tmp_path, insert_after(BASE, NAME_LINE, "  labels: &l {team: [*l]}\n"))
    proc = run_cli(command, job, timeout=TIMEOUT)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert (f"{job}: invalid YAML at line 5, column 22: alias *l is inside the node it names"
            in proc.stderr), proc.stderr


def test_anchors_as_jobs_use_them_still_validate(tmp_path):
    shared = insert_after(BASE, "    PS:\n      replicas: 1\n",
                          "      template: &pod\n        metadata: {labels: {team: ml}}\n")
    shared = insert_after(shared, WORKER_LINE, "      template: *pod\n")
    proc = run_cli("validate", write(tmp_path, shared), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
