"""The TrainingJob CRD (deploy/crd/kubetrain.io_trainingjobs.yaml) on a real
kube-apiserver: the examples are accepted, malformed jobs are refused with a
message naming the field (mirroring core/job_spec.cc), printer columns and the
status subresource work.

Run: python3 -m pytest -q tests/operator/test_crd.py
(starts etcd + kube-apiserver via tests/cluster/up.sh; builds them on first use)."""
import copy
import glob
import json
import os
import re

import pytest
import yaml

from kube_api import KubeApi

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CRD_FILE = os.path.join(ROOT, "deploy", "crd", "kubetrain.io_trainingjobs.yaml")
CRD_NAME = "trainingjobs.kubetrain.io"

NS = "kt-crd-test"
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.yaml")))

BASE = {
    "apiVersion": "kubetrain.io/v1",
    "kind": "TrainingJob",
    "metadata": {"name": "crd-case", "namespace": NS},
    "spec": {
        "replicaSpecs": {"PS": {"replicas": 1}, "Worker": {"replicas": 2}},
        "training": {
            "mode": "sync",
            "model": {"type": "mlp", "hiddenUnits": [64]},
            "optimizer": {"type": "sgd", "learningRate": 0.1},
            "steps": 100,
        },
    },
}


def job(mutate=None):
    obj = copy.deepcopy(BASE)
    if mutate:
        mutate(obj)
    return obj


def spec(o):
    return o["spec"]


def training(o):
    return o["spec"]["training"]


def replicas(o):
    return o["spec"]["replicaSpecs"]


def dry_run(k, obj, *extra):
    return k.run("create", "--dry-run=server", *extra, "-o", "json", "-f", "-",
                 input=json.dumps(obj), check=False)


@pytest.fixture(scope="module")
def k(crd_installed):
    crd_installed.run("create", "namespace", NS)
    return crd_installed


# --- the CRD itself -----------------------------------------------------------------

def test_crd_names_and_established(k):
    crd = k.json("get", "crd", CRD_NAME)
    names = crd["spec"]["names"]
    assert crd["spec"]["group"] == "kubetrain.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert (names["kind"], names["plural"], names["singular"]) == (
        "TrainingJob", "trainingjobs", "trainingjob")
    assert names["shortNames"] == ["tj"] and names["categories"] == ["kubetrain"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conds.get("Established") == "True" and conds.get("NamesAccepted") == "True"


def test_crd_file_is_structural_yaml():
    with open(CRD_FILE) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"


# --- accepted -------------------------------------------------------------------------

@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_accepted_by_dry_run(k, path):
    proc = k.run("apply", "--dry-run=server", "-n", NS, "-f", path)
    assert "created (server dry run)" in proc.stdout


def test_examples_created_and_listed_with_printer_columns(k):
    assert len(EXAMPLES) == 11, EXAMPLES  # every examples/*.yaml
    for path in EXAMPLES:
        k.run("apply", "-n", NS, "-f", path)
    names = {yaml.safe_load(open(p))["metadata"]["name"] for p in EXAMPLES}
    out = k.run("get", "tj", "-n", NS).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "STEP", "ACCURACY", "AGE"], out
    assert {line.split()[0] for line in lines[1:]} >= names, out
    wide = k.run("get", "trainingjobs", "-n", NS, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "STATE", "STEP", "ACCURACY", "MODE", "PS", "WORKERS", "AGE"]
    row = next(line.split() for line in wide if line.startswith("fashion-mnist-async "))
    # No status yet: State/Step/Accuracy are empty; Mode, PS, Workers come from the spec.
    assert row[1:4] == ["async", "2", "2"], wide
    # The category and short name resolve too.
    assert "fashion-mnist-sync" in k.run("get", "kubetrain", "-n", NS, "-o", "name").stdout


def test_defaults_are_applied(k):
    obj = job(lambda o: training(o).pop("mode"))
    obj["spec"]["replicaSpecs"] = {"PS": {}, "Worker": {"replicas": 2}}
    obj["spec"]["runPolicy"] = {}
    obj["spec"]["training"]["dataset"] = {}
    proc = dry_run(k, obj)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["spec"]
    assert got["replicaSpecs"]["PS"] == {"replicas": 1, "restartPolicy": "Never"}
    assert got["runPolicy"] == {"cleanPodPolicy": "Running", "suspend": False}
    t = got["training"]
    assert (t["mode"], t["batchSize"], t["dataset"]["name"], t["model"]["type"],
            t["optimizer"]["type"]) == ("sync", 100, "fashion-mnist", "mlp", "sgd")


ACCEPTED = {
    # Replica types are case-insensitive in the parser (as in TFJob); the CRD agrees.
    "lowercase-replica-types": lambda o: spec(o).update(
        replicaSpecs={"ps": {"replicas": 1}, "worker": {"replicas": 3}}),
    "chief-and-evaluator": lambda o: replicas(o).update(Chief={"replicas": 1}, Evaluator={}),
    "replicas-to-aggregate-eq-workers": lambda o: training(o).update(replicasToAggregate=2),
    "backup-workers-lowercase-key": lambda o: (
        spec(o).update(replicaSpecs={"PS": {}, "worker": {"replicas": 4}}),
        training(o).update(replicasToAggregate=3)),
    "async-bounded-with-barrier-timeout": lambda o: training(o).update(
        mode="async", maxStaleness=0, barrierTimeoutSeconds=2.5),
    "async-barrier-timeout-zero": lambda o: training(o).update(mode="async", barrierTimeoutSeconds=0),
    "sync-barrier-timeout": lambda o: training(o).update(barrierTimeoutSeconds=30),
    "softmax-empty-hidden": lambda o: training(o).update(model={"type": "softmax", "hiddenUnits": []}),
    "epochs-fraction": lambda o: (training(o).pop("steps"), training(o).update(epochs=0.5)),
    "adam-full": lambda o: training(o).update(optimizer={
        "type": "adam", "learningRate": 1e-3, "beta1": 0, "beta2": 0.999, "epsilon": 1e-7}),
    "momentum-nesterov": lambda o: training(o).update(optimizer={
        "type": "momentum", "momentum": 0.9, "nesterov": True}),
    "adagrad": lambda o: training(o).update(optimizer={
        "type": "adagrad", "epsilon": 1e-8, "initialAccumulator": 0}),
    "ftrl-learning-rate-power": lambda o: training(o).update(optimizer={
        "type": "ftrl", "learningRate": 0.1, "l1": 0.01, "l2": 0.1, "learningRatePower": -0.25}),
    "ftrl-learning-rate-power-zero": lambda o: training(o).update(optimizer={
        "type": "ftrl", "learningRatePower": 0}),
    "mnist-with-path": lambda o: training(o).update(dataset={"name": "mnist", "path": "/data/mnist"}),
    "checkpoint-full": lambda o: training(o).update(checkpoint={
        "directory": "/ckpt", "everySteps": 100, "everySeconds": 60}),
    "limits": lambda o: training(o).update(
        batchSize=65536, transport={"chunkBytes": 67108864}, placement={"splitThresholdBytes": 4096},
        startupTimeoutSeconds=1, seed=0, evaluation={"everySteps": 0}),
    "run-policy": lambda o: spec(o).update(runPolicy={
        "cleanPodPolicy": "None", "ttlSecondsAfterFinished": 0, "activeDeadlineSeconds": 1,
        "backoffLimit": 0, "suspend": True}, successPolicy="AllWorkers"),
    "scheduling-policy-volcano": lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {
            "minAvailable": 2, "queue": "research", "priorityClass": "high"}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
    "scheduling-policy-min-resources": lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {
            "minResources": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": 2}}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
    "scheduling-policy-scheduler-plugins-all-tasks": lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"scheduleTimeoutSeconds": 60}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "sp"}}),
        replicas(o)["PS"].update(template={"spec": {"schedulerName": "sp"}})),
    "scheduling-policy-four-replicas-one-scheduler": lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {}}),
        [r.update(template={"spec": {"schedulerName": "volcano"}}) for r in (
            replicas(o)["PS"], replicas(o)["Worker"],
            replicas(o).setdefault("Chief", {}), replicas(o).setdefault("Evaluator", {}))]),
    "template-kept": lambda o: replicas(o)["Worker"].update(template={
        "metadata": {"labels": {"a": "b"}},
        "spec": {"containers": [{"name": "tensorflow", "image": "kubetrain:latest"}]}}),
    "name-48": lambda o: o["metadata"].update(name="a" * 48),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_valid_variants_accepted(k, case):
    proc = dry_run(k, job(ACCEPTED[case]))
    assert proc.returncode == 0, proc.stderr


def test_template_is_preserved(k):
    proc = dry_run(k, job(ACCEPTED["template-kept"]))
    assert proc.returncode == 0, proc.stderr
    tmpl = json.loads(proc.stdout)["spec"]["replicaSpecs"]["Worker"]["template"]
    assert tmpl["spec"]["containers"][0]["image"] == "kubetrain:latest"


# --- refused ----------------------------------------------------------------------------
# case -> (mutation, substrings that must all appear in kubectl's error)

def _pop_worker(o):
    del replicas(o)["Worker"]


REFUSED = {
    "missing-worker": (_pop_worker, ["spec.replicaSpecs", "Worker: required"]),
    "missing-ps": (lambda o: replicas(o).pop("PS"), ["spec.replicaSpecs", "PS: required"]),
    "missing-training": (lambda o: spec(o).pop("training"),
                         ["spec.training", "Required value",
                          "required unless every replica's template names its own containers"]),
    "missing-spec": (lambda o: o.pop("spec"), ["spec", "Required value"]),
    "negative-replicas": (lambda o: replicas(o)["Worker"].update(replicas=-1),
                          ["spec.replicaSpecs.Worker.replicas", "greater than or equal to 1"]),
    "replicas-100000": (lambda o: replicas(o)["PS"].update(replicas=100000),
                        ["spec.replicaSpecs.PS.replicas", "less than or equal to 1000"]),
    "replicas-two-string": (lambda o: replicas(o)["Worker"].update(replicas="two"),
                            ["spec.replicaSpecs.Worker.replicas", "must be of type integer"]),
    "replicas-fraction": (lambda o: replicas(o)["Worker"].update(replicas=1.5),
                          ["spec.replicaSpecs.Worker.replicas", "integer"]),
    "chief-replicas-2": (lambda o: replicas(o).update(Chief={"replicas": 2}),
                         ["spec.replicaSpecs", "Chief.replicas: must be 1, got 2"]),
    "evaluator-replicas-3": (lambda o: replicas(o).update(evaluator={"replicas": 3}),
                             ["spec.replicaSpecs", "evaluator.replicas: must be 1, got 3"]),
    "unknown-replica-type": (lambda o: replicas(o).update(Launcher={}),
                             ["spec.replicaSpecs", 'unknown replica type "Launcher"']),
    "master-replica-type": (lambda o: replicas(o).update(Master={}),
                            ["spec.replicaSpecs", 'unknown replica type "Master"', "use Chief"]),
    "duplicate-replica-type": (lambda o: replicas(o).update(worker={"replicas": 1}),
                               ["spec.replicaSpecs", "duplicate replica type"]),
    "bad-restart-policy": (lambda o: replicas(o)["PS"].update(restartPolicy="onfailure"),
                           ["spec.replicaSpecs.PS.restartPolicy", "Unsupported value", '"onfailure"']),
    "unknown-mode": (lambda o: training(o).update(mode="fast"),
                     ["spec.training.mode", "Unsupported value", '"fast"']),
    "replicas-to-aggregate-gt-workers": (
        lambda o: training(o).update(replicasToAggregate=3),
        ["spec.training.replicasToAggregate",
         "must be in [1, 2] (the number of Worker replicas), got 3"]),
    "replicas-to-aggregate-zero": (lambda o: training(o).update(replicasToAggregate=0),
                                   ["spec.training.replicasToAggregate", "greater than or equal to 1"]),
    "replicas-to-aggregate-async": (
        lambda o: training(o).update(mode="async", replicasToAggregate=1),
        ["spec.training.replicasToAggregate", "only applies to mode sync"]),
    "max-staleness-sync": (lambda o: training(o).update(maxStaleness=4),
                           ["spec.training.maxStaleness", "only applies to mode async"]),
    "max-staleness-negative": (lambda o: training(o).update(mode="async", maxStaleness=-1),
                               ["spec.training.maxStaleness", "greater than or equal to 0"]),
    "barrier-timeout-async-unbounded": (
        lambda o: training(o).update(mode="async", barrierTimeoutSeconds=5),
        ["spec.training.barrierTimeoutSeconds", "async with maxStaleness"]),
    "barrier-timeout-negative": (lambda o: training(o).update(barrierTimeoutSeconds=-1),
                                 ["spec.training.barrierTimeoutSeconds", "greater than or equal to 0"]),
    "steps-and-epochs": (lambda o: training(o).update(epochs=2),
                         ["spec.training.epochs", "cannot be set together with steps"]),
    "neither-steps-nor-epochs": (lambda o: training(o).pop("steps"),
                                 ["spec.training", "one of steps or epochs is required"]),
    "steps-zero": (lambda o: training(o).update(steps=0),
                   ["spec.training.steps", "greater than or equal to 1"]),
    "epochs-zero": (lambda o: (training(o).pop("steps"), training(o).update(epochs=0)),
                    ["spec.training.epochs", "greater than 0"]),
    "learning-rate-zero": (lambda o: training(o)["optimizer"].update(learningRate=0),
                           ["spec.training.optimizer.learningRate", "greater than 0"]),
    "learning-rate-string": (lambda o: training(o)["optimizer"].update(learningRate="0.1"),
                             ["spec.training.optimizer.learningRate", "must be of type number"]),
    "unknown-optimizer": (lambda o: training(o)["optimizer"].update(type="rmsprop"),
                          ["spec.training.optimizer.type", "Unsupported value"]),
    "momentum-with-sgd": (lambda o: training(o)["optimizer"].update(momentum=0.9),
                          ["spec.training.optimizer.momentum",
                           "only applies to type momentum, but type is sgd"]),
    "epsilon-with-momentum": (
        lambda o: training(o)["optimizer"].update(type="momentum", epsilon=1e-8),
        ["spec.training.optimizer.epsilon", "only applies to type adam or adagrad"]),
    "beta1-one": (lambda o: training(o).update(optimizer={"type": "adam", "beta1": 1}),
                  ["spec.training.optimizer.beta1", "less than 1"]),
    "epsilon-zero": (lambda o: training(o).update(optimizer={"type": "adam", "epsilon": 0}),
                     ["spec.training.optimizer.epsilon", "greater than 0"]),
    "learning-rate-power-positive": (
        lambda o: training(o).update(optimizer={"type": "ftrl", "learningRatePower": 0.5}),
        ["spec.training.optimizer.learningRatePower", "less than or equal to 0"]),
    "learning-rate-power-with-adagrad": (
        lambda o: training(o).update(optimizer={"type": "adagrad", "learningRatePower": -0.5}),
        ["spec.training.optimizer.learningRatePower",
         "only applies to type ftrl, but type is adagrad"]),
    "initial-accumulator-negative": (
        lambda o: training(o).update(optimizer={"type": "adagrad", "initialAccumulator": -0.1}),
        ["spec.training.optimizer.initialAccumulator", "greater than or equal to 0"]),
    "mlp-without-hidden-units": (lambda o: training(o)["model"].pop("hiddenUnits"),
                                 ["spec.training.model.hiddenUnits", "required for type mlp"]),
    "mlp-empty-hidden-units": (lambda o: training(o)["model"].update(hiddenUnits=[]),
                               ["spec.training.model.hiddenUnits", "required for type mlp"]),
    "softmax-with-hidden-units": (lambda o: training(o)["model"].update(type="softmax"),
                                  ["spec.training.model.hiddenUnits", "must be empty for type softmax"]),
    "default-softmax-with-hidden-units": (lambda o: training(o)["model"].pop("type"),
                                          ["spec.training.model.hiddenUnits", "must be empty"]),
    "hidden-units-zero": (lambda o: training(o)["model"].update(hiddenUnits=[64, 0]),
                          ["spec.training.model.hiddenUnits[1]", "greater than or equal to 1"]),
    "hidden-units-too-wide": (lambda o: training(o)["model"].update(hiddenUnits=[70000]),
                              ["spec.training.model.hiddenUnits[0]", "less than or equal to 65536"]),
    "embedding-max-rows-zero": (lambda o: training(o)["model"].update(
        embeddings=[{"column": "c", "dim": 8, "maxRows": 0}]),
        ["spec.training.model.embeddings[0].maxRows", "greater than or equal to 1"]),
    "embedding-dim-zero": (lambda o: training(o)["model"].update(
        embeddings=[{"column": "c", "dim": 0}]),
        ["spec.training.model.embeddings[0].dim", "greater than or equal to 1"]),
    "wide-max-rows-zero": (lambda o: training(o)["model"].update(wide={"maxRows": 0}),
                           ["spec.training.model.wide.maxRows", "greater than or equal to 1"]),
    "column-dynamic-not-a-boolean": (lambda o: training(o).update(dataset={
        "format": "csv", "columns": [{"name": "c", "type": "categorical", "dynamic": "yes"}]}),
        ["spec.training.dataset.columns[0].dynamic", "must be of type boolean"]),
    "unknown-model": (lambda o: training(o)["model"].update(type="cnn"),
                      ["spec.training.model.type", "Unsupported value"]),
    "unknown-dataset": (lambda o: training(o).update(dataset={"name": "cifar10", "path": "/d"}),
                        ["spec.training.dataset.name", "Unsupported value"]),
    "mnist-without-path": (lambda o: training(o).update(dataset={"name": "mnist"}),
                           ["spec.training.dataset.path", 'required for dataset "mnist"']),
    "empty-dataset-path": (lambda o: training(o).update(dataset={"path": ""}),
                           ["spec.training.dataset.path", "at least 1 chars long"]),
    "batch-size-zero": (lambda o: training(o).update(batchSize=0),
                        ["spec.training.batchSize", "greater than or equal to 1"]),
    "batch-size-too-big": (lambda o: training(o).update(batchSize=65537),
                           ["spec.training.batchSize", "less than or equal to 65536"]),
    "seed-negative": (lambda o: training(o).update(seed=-1),
                      ["spec.training.seed", "greater than or equal to 0"]),
    "checkpoint-without-directory": (lambda o: training(o).update(checkpoint={"everySteps": 10}),
                                     ["spec.training.checkpoint.directory",
                                      "required when everySteps or everySeconds is set"]),
    "split-threshold-small": (lambda o: training(o).update(placement={"splitThresholdBytes": 1024}),
                              ["spec.training.placement.splitThresholdBytes",
                               "greater than or equal to 4096"]),
    "chunk-bytes-big": (lambda o: training(o).update(transport={"chunkBytes": 67108865}),
                        ["spec.training.transport.chunkBytes", "less than or equal to 67108864"]),
    "startup-timeout-zero": (lambda o: training(o).update(startupTimeoutSeconds=0),
                             ["spec.training.startupTimeoutSeconds", "greater than or equal to 1"]),
    "eval-every-negative": (lambda o: training(o).update(evaluation={"everySteps": -1}),
                            ["spec.training.evaluation.everySteps", "greater than or equal to 0"]),
    "clean-pod-policy": (lambda o: spec(o).update(runPolicy={"cleanPodPolicy": "Some"}),
                         ["spec.runPolicy.cleanPodPolicy", "Unsupported value"]),
    "active-deadline-zero": (lambda o: spec(o).update(runPolicy={"activeDeadlineSeconds": 0}),
                             ["spec.runPolicy.activeDeadlineSeconds", "greater than or equal to 1"]),
    "backoff-limit-negative": (lambda o: spec(o).update(runPolicy={"backoffLimit": -1}),
                               ["spec.runPolicy.backoffLimit", "greater than or equal to 0"]),
    "suspend-string": (lambda o: spec(o).update(runPolicy={"suspend": "yes"}),
                       ["spec.runPolicy.suspend", "must be of type boolean"]),
    "min-available-zero": (lambda o: spec(o).update(runPolicy={"schedulingPolicy": {"minAvailable": 0}}),
                           ["spec.runPolicy.schedulingPolicy.minAvailable", "greater than or equal to 1"]),
    "scheduling-policy-unknown": (lambda o: spec(o).update(runPolicy={"schedulingPolicy": {"minMember": 2}}),
                                  ['unknown field "spec.runPolicy.schedulingPolicy.minMember"']),
    "gang-queue-not-dns": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"queue": "Research"}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
        ["spec.runPolicy.schedulingPolicy.queue", "should match"]),
    "gang-priority-class-not-dns": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"priorityClass": "-x"}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
        ["spec.runPolicy.schedulingPolicy.priorityClass", "should match"]),
    "gang-without-scheduler-name": (lambda o: spec(o).update(runPolicy={"schedulingPolicy": {}}),
                                    ["spec.runPolicy.schedulingPolicy", "needs the gang scheduler's name"]),
    "gang-two-schedulers": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}}),
        replicas(o)["PS"].update(template={"spec": {"schedulerName": "other"}})),
        ["spec.replicaSpecs", "must be the same in every replica"]),
    "gang-one-of-four-schedulers-differs": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {}}),
        [r.update(template={"spec": {"schedulerName": "volcano"}}) for r in (
            replicas(o)["PS"], replicas(o)["Worker"],
            replicas(o).setdefault("Chief", {}), replicas(o).setdefault("Evaluator", {}))],
        replicas(o)["Evaluator"]["template"]["spec"].update(schedulerName="other")),
        ["spec.replicaSpecs", "must be the same in every replica"]),
    "gang-queue-not-volcano": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"queue": "q"}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "sp"}})),
        ["spec.runPolicy.schedulingPolicy.queue", "only Volcano has queues"]),
    "gang-timeout-volcano": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"scheduleTimeoutSeconds": 5}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
        ["spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds", "Volcano's has no timeout"]),
    "gang-min-resources-not-a-quantity": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"minResources": {"cpu": "2x"}}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
        ["spec.runPolicy.schedulingPolicy.minResources.cpu", "should match"]),
    "gang-min-available-over-tasks": (lambda o: (
        spec(o).update(runPolicy={"schedulingPolicy": {"minAvailable": 99}}),
        replicas(o)["Worker"].update(template={"spec": {"schedulerName": "volcano"}})),
        ["spec.runPolicy.schedulingPolicy.minAvailable", "must be in [1, 3], got 99"]),
    "success-policy": (lambda o: spec(o).update(successPolicy="Chief"),
                       ["spec.successPolicy", "Unsupported value"]),
    "template-not-mapping": (lambda o: replicas(o)["Worker"].update(template="pod.yaml"),
                             ["spec.replicaSpecs.Worker.template", "must be of type object"]),
    "name-too-long": (lambda o: o["metadata"].update(name="a" * 49),
                      ["metadata.name: Invalid value", "must be at most 48 characters", "got 49"]),
    "name-not-dns-1035": (lambda o: o["metadata"].update(name="9-lives.v2"),
                          ["metadata.name: Invalid value", "must be a DNS-1035 label", '"9-lives.v2"']),
    # CEL: a container without an image would make the API server refuse every pod.
    "template-container-no-image": (
        lambda o: replicas(o)["Worker"].update(template={"spec": {"containers": [
            {"name": "tensorflow", "image": "kubetrain:latest"}, {"name": "sidecar"}]}}),
        ["template.spec.containers", 'every container needs an image']),
    "template-empty-image": (
        lambda o: replicas(o)["PS"].update(template={"spec": {"containers": [
            {"name": "tensorflow", "image": ""}]}}),
        ["template.spec.containers", 'every container needs an image']),
    # A `kubetrain` container with a command is the user's program: it needs its image.
    "template-kubetrain-command-no-image": (
        lambda o: replicas(o)["PS"].update(template={"spec": {"containers": [
            {"name": "kubetrain", "command": ["my-ps"]}]}}),
        ["template.spec.containers", 'every container needs an image']),
    "template-init-container-no-image": (
        lambda o: replicas(o)["Worker"].update(template={"spec": {
            "containers": [{"name": "tensorflow", "image": "kubetrain:latest"}],
            "initContainers": [{"name": "fetch"}]}}),
        ["template.spec.initContainers", 'every container needs an image']),
    # kubectl's default (strict) field validation refuses typos instead of pruning them.
    "unknown-field-typo": (lambda o: training(o).update(optimiser={"type": "adam"}),
                           ['unknown field "spec.training.optimiser"']),
    "unknown-field-in-replica-spec": (lambda o: replicas(o)["PS"].update(replica=2),
                                      ['unknown field "spec.replicaSpecs.PS.replica"']),
}


def test_base_job_is_valid(k):
    proc = dry_run(k, job())
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_malformed_refused(k, case):
    mutate, expected = REFUSED[case]
    proc = dry_run(k, job(mutate))
    assert proc.returncode != 0, f"{case} was accepted:\n{proc.stdout}"
    err = proc.stderr
    assert re.search(r'TrainingJob(\.kubetrain\.io)? "[a-z0-9.-]+" is invalid', err) or \
        "unknown field" in err, err
    for want in expected:
        assert want in err, f"{case}: {want!r} not in:\n{err}"


# --- rules over a map: the same verdict whatever order CEL sees the keys in ------------------
# replicaSpecs is a map and CEL promises no order for a map's keys: the API server (Go) may see
# another order at each evaluation, so a rule that depends on it (e.g. comparing every name with
# element [0] of a list built from the map) decides a spec by chance. Every case that has more
# than one replica type in play is therefore sent many times, with its keys in every rotation
# too; one verdict (and message) that differs fails the test. The old schedulerName rule was
# accepted about one time in eight, so 40 sends catch it in all but ~0.5 % of runs.
ORDER_REPEATS = 40


def _rotations(obj):
    keys = list(replicas(obj))
    for i in range(len(keys)):
        o = copy.deepcopy(obj)
        o["spec"]["replicaSpecs"] = {key: replicas(obj)[key] for key in keys[i:] + keys[:i]}
        yield o


def _order_sensitive_cases():
    """(name, object, refusal substrings or None): every case whose replicaSpecs-dependent rules
    have something to compare (gang scheduling, replicasToAggregate, or replica specs changed)."""
    def replica_specs(o):
        specs = o.get("spec", {}).get("replicaSpecs") if isinstance(o.get("spec"), dict) else None
        return specs if isinstance(specs, dict) else None

    base = job()
    cases = [(f"accepted:{n}", job(m), None) for n, m in sorted(ACCEPTED.items())]
    cases += [(f"refused:{n}", job(m), want) for n, (m, want) in sorted(REFUSED.items())]
    return [(n, o, want) for n, o, want in cases
            if replica_specs(o) and len(replica_specs(o)) > 1 and (
                replica_specs(o) != replicas(base) or "runPolicy" in spec(o) or
                "replicasToAggregate" in (spec(o).get("training") or {}))]


def test_map_rules_do_not_depend_on_key_order(k):
    api = KubeApi(k.env["KUBECONFIG"])
    path = (f"/apis/kubetrain.io/v1/namespaces/{NS}/trainingjobs"
            "?dryRun=All&fieldValidation=Strict")
    cases = _order_sensitive_cases()
    assert len(cases) >= 15, [n for n, _, _ in cases]
    flaky = []
    for name, obj, want in cases:
        orders = list(_rotations(obj))
        verdicts = set()
        for i in range(ORDER_REPEATS):
            code, raw = api.send("POST", path, orders[i % len(orders)])
            message = "" if code < 300 else json.loads(raw).get("message", raw.decode())
            verdicts.add((code < 300, message))
        if len(verdicts) != 1:
            flaky.append(f"{name}: {sorted(verdicts)}")
            continue
        ((accepted, message),) = verdicts
        if want is None:
            assert accepted, f"{name} refused: {message}"
        else:
            assert not accepted, f"{name} accepted"
            for w in want:
                assert w in message, f"{name}: {w!r} not in {message}"
    assert not flaky, "verdicts that depend on the order of replicaSpecs' keys:\n" + "\n".join(flaky)


def test_own_containers_need_no_training(k):
    """A TFJob user's program: every replica brings its containers, spec.training is left out
    (examples/tensorflow/ps-strategy.yaml, with YAML anchors for the shared template); one
    replica without containers makes spec.training required again."""
    path = os.path.join(ROOT, "examples", "tensorflow", "ps-strategy.yaml")
    proc = k.run("apply", "--dry-run=server", "-n", NS, "-f", path)
    assert "created (server dry run)" in proc.stdout
    own = {"template": {"spec": {"containers": [{"name": "tensorflow", "image": "tf:1"}]}}}
    obj = job(lambda o: (spec(o).pop("training"),
                         spec(o).update(replicaSpecs={"PS": copy.deepcopy(own), "Worker": copy.deepcopy(own)})))
    proc = dry_run(k, obj)
    assert proc.returncode == 0, proc.stderr
    obj["spec"]["replicaSpecs"]["Worker"] = {"replicas": 2}
    proc = dry_run(k, obj)
    assert proc.returncode != 0 and "spec.training" in proc.stderr and "own containers" in proc.stderr, proc.stderr


def test_runtime_container_needs_no_image_and_still_needs_training(k):
    """A `kubetrain` container without a command customises kubetrain's runtime (e.g. mounts
    the data): no image needed (the operator's), and it runs spec.training, so that is
    required."""
    runtime = {"template": {"spec": {
        "containers": [{"name": "kubetrain",
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "hostPath": {"path": "/srv/data"}}]}}}
    obj = job(lambda o: replicas(o)["Worker"].update(copy.deepcopy(runtime)))
    proc = dry_run(k, obj)
    assert proc.returncode == 0, proc.stderr
    spec(obj).pop("training")
    for r in replicas(obj).values():
        r.update(copy.deepcopy(runtime))
    proc = dry_run(k, obj)
    assert proc.returncode != 0 and "spec.training" in proc.stderr, proc.stderr


def test_refused_by_real_create_too(k):
    # Not just dry-run: a real create is refused and nothing is stored.
    obj = job(lambda o: training(o).update(replicasToAggregate=5))
    obj["metadata"]["name"] = "never-stored"
    proc = k.run("create", "-f", "-", input=json.dumps(obj), check=False)
    assert proc.returncode != 0 and "spec.training.replicasToAggregate" in proc.stderr
    assert k.run("get", "tj", "-n", NS, "never-stored", check=False).returncode != 0


def test_unknown_fields_pruned_without_strict_validation(k):
    # Clients that do not ask for strict field validation get unknown fields
    # dropped (with a warning), as documented in deploy/crd/README.md.
    proc = dry_run(k, job(lambda o: training(o).update(optimiser={"type": "adam"})),
                   "--validate=false")
    assert proc.returncode == 0, proc.stderr
    assert "optimiser" not in json.loads(proc.stdout)["spec"]["training"]


# --- status subresource ------------------------------------------------------------------

def test_status_subresource(k):
    k.run("apply", "-n", NS, "-f", os.path.join(ROOT, "examples", "softmax-seed.yaml"))
    status = {
        "state": "Running",
        "observedGeneration": 1,
        "startTime": "2024-01-01T00:00:00Z",
        "conditions": [
            {"type": "Created", "status": "True", "reason": "TrainingJobCreated",
             "message": "pods created", "lastUpdateTime": "2024-01-01T00:00:00Z",
             "lastTransitionTime": "2024-01-01T00:00:00Z"},
            {"type": "Running", "status": "True", "reason": "TrainingJobRunning"},
        ],
        "replicaStatuses": {"PS": {"active": 1}, "Worker": {"active": 1, "restarts": 2,
                                                            "recreated": 1}},
        "progress": {"globalStep": 1234, "targetSteps": 20000, "loss": 0.42,
                     "accuracy": 0.8123, "examplesPerSecond": 15000.5},
    }
    k.run("patch", "tj", "softmax-seed", "-n", NS, "--subresource=status", "--type=merge",
          "-p", json.dumps({"status": status}))
    got = k.json("get", "tj", "softmax-seed", "-n", NS)
    assert got["status"]["state"] == "Running"
    assert got["status"]["progress"]["globalStep"] == 1234
    # The operator reads replicaStatuses.*.recreated back on every reconcile.
    assert got["status"]["replicaStatuses"]["Worker"] == {"active": 1, "restarts": 2, "recreated": 1}
    assert [c["type"] for c in got["status"]["conditions"]] == ["Created", "Running"]
    out = k.run("get", "tj", "softmax-seed", "-n", NS).stdout.splitlines()
    assert out[1].split()[:4] == ["softmax-seed", "Running", "1234", "0.8123"], out

    # The status subresource ignores spec changes; the main resource ignores status.
    gen = got["metadata"]["generation"]
    k.run("patch", "tj", "softmax-seed", "-n", NS, "--subresource=status", "--type=merge",
          "-p", json.dumps({"spec": {"training": {"steps": 5}}, "status": {"state": "Succeeded"}}))
    got = k.json("get", "tj", "softmax-seed", "-n", NS)
    assert got["spec"]["training"]["steps"] == 20000 and got["status"]["state"] == "Succeeded"
    assert got["metadata"]["generation"] == gen
    k.run("patch", "tj", "softmax-seed", "-n", NS, "--type=merge",
          "-p", json.dumps({"status": {"state": "Failed"}}))
    assert k.json("get", "tj", "softmax-seed", "-n", NS)["status"]["state"] == "Succeeded"

    # Status is schema-checked too.
    proc = k.run("patch", "tj", "softmax-seed", "-n", NS, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"progress": {"globalStep": "many"}}}), check=False)
    assert proc.returncode != 0 and "status.progress.globalStep" in proc.stderr, proc.stderr


def test_spec_update_revalidated(k):
    # Updates go through the same rules: scaling workers below replicasToAggregate fails.
    k.run("apply", "-n", NS, "-f", os.path.join(ROOT, "examples", "fashion-mnist-sync.yaml"))
    proc = k.run("patch", "tj", "fashion-mnist-sync", "-n", NS, "--type=merge",
                 "-p", json.dumps({"spec": {"replicaSpecs": {"Worker": {"replicas": 1}}}}),
                 check=False)
    assert proc.returncode != 0
    assert re.search(r"spec\.training\.replicasToAggregate.*must be in \[1, 1\]", proc.stderr), \
        proc.stderr
