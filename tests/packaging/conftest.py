"""Fixtures for the packaging tests (deploy/ kustomize tree and the helm chart):
the real kube-apiserver + etcd of tests/cluster (the `kube_cluster` fixture of
tests/operator/conftest.py, loaded by path so the two conftest modules never
clash), a helm binary built from the Go module proxy (tests/cluster/build_helm.sh)
and small helpers, exposed as the `pk` fixture."""
import importlib.util
import json
import os
import subprocess

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "kubetrain_operator_conftest", os.path.join(ROOT, "tests", "operator", "conftest.py"))
_operator_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_operator_conftest)

# Re-exported fixtures: a private control plane per test module, and the CRD.
kube_cluster = _operator_conftest.kube_cluster
crd_installed = _operator_conftest.crd_installed
Kubectl = _operator_conftest.Kubectl
# When tests/operator and tests/packaging run in one pytest session, only one of
# the two conftest.py files is `sys.modules["conftest"]`; tests/operator's test
# modules `from conftest import ...`, so this one offers the same names.
CLUSTER = _operator_conftest.CLUSTER
_cache_bin = _operator_conftest._cache_bin
_have_go = _operator_conftest._have_go

DEPLOY = os.path.join(ROOT, "deploy")
CHART = os.path.join(ROOT, "helm", "kubetrain")
CRD_FILE = _operator_conftest.CRD_FILE
CRD_NAME = _operator_conftest.CRD_NAME
BIN = os.path.join(ROOT, "bin")
NAMESPACE = "kubetrain-system"

# Exactly the requests the operator makes (operator/reconciler.cc, controller.cc).
OPERATOR_RULES = [
    {"apiGroups": ["kubetrain.io"], "resources": ["trainingjobs"], "verbs": ["list", "watch", "delete"]},
    {"apiGroups": ["kubetrain.io"], "resources": ["trainingjobs/status"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["scheduling.x-k8s.io", "scheduling.volcano.sh"], "resources": ["podgroups"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
]
# operator/leader_election.cc: Lease kubetrain-operator, GET / CREATE / PUT.
LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kubetrain-operator"],
     "verbs": ["get", "update"]},
]


def docs(text):
    """The non-empty YAML documents of a multi-document stream."""
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def one(objs, kind, name=None):
    found = [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


class Helm(_operator_conftest.testlib.Tool):
    """Runs the helm binary against the test cluster's kubeconfig, with private
    helm config/cache/data dirs (never the user's)."""
    name, timeout, tail = "helm", 180, 4000


@pytest.fixture(scope="session")
def helm_binary():
    """bin/helm from tests/cluster/build_helm.sh (a no-op when up to date)."""
    proc = subprocess.run([os.path.join(ROOT, "tests", "cluster", "build_helm.sh"), "--quiet"],
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f"tests/cluster/build_helm.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    path = proc.stdout.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), path
    return path


def _helm_env(base_env, tmp):
    env = dict(base_env)
    for var, sub in (("HELM_CONFIG_HOME", "config"), ("HELM_CACHE_HOME", "cache"), ("HELM_DATA_HOME", "data")):
        env[var] = os.path.join(tmp, sub)
    return env


@pytest.fixture(scope="module")
def helm_offline(helm_binary, tmp_path_factory):
    """helm without any cluster (lint/template); KUBECONFIG points nowhere."""
    tmp = str(tmp_path_factory.mktemp("helm-offline"))
    env = _helm_env(os.environ, tmp)
    env["KUBECONFIG"] = os.path.join(tmp, "no-kubeconfig")
    return Helm(helm_binary, env)


@pytest.fixture(scope="module")
def helm(helm_binary, kube_cluster, tmp_path_factory):
    """helm bound to the test cluster."""
    tmp = str(tmp_path_factory.mktemp("helm"))
    return Helm(helm_binary, _helm_env(kube_cluster.env, tmp))


wait_for = _operator_conftest.testlib.wait_for


def small_job(name):
    """A small TrainingJob (1 PS, 1 worker, 100 steps) for the operator installs to run."""
    return {"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"replicaSpecs": {"PS": {"replicas": 1, "restartPolicy": "OnFailure"},
                                      "Worker": {"replicas": 1, "restartPolicy": "Never"}},
                     "training": {"mode": "sync", "model": {"type": "mlp", "hiddenUnits": [16]},
                                  "optimizer": {"type": "adam", "learningRate": 0.002}, "batchSize": 32,
                                  "steps": 100, "seed": 3, "startupTimeoutSeconds": 60}}}


def ensure_namespace(k, ns):
    k.run("create", "namespace", ns, check=False)
    wait_for(lambda: k.run("get", "ns", ns, check=False).returncode == 0, 30, f"namespace {ns}")


def apply_crd(k):
    k.run("apply", "--server-side", "--field-manager=kubetrain-tests", "-f", CRD_FILE)
    _operator_conftest.testlib.wait_established(k, CRD_NAME)


def can_i(k, verb, resource, sa, ns=None, subresource=None, name=None):
    args = ["auth", "can-i", verb, resource if name is None else f"{resource}/{name}",
            f"--as=system:serviceaccount:{sa}"]
    if ns:
        args += ["-n", ns]
    else:
        args += ["--all-namespaces"]
    if subresource:
        args += [f"--subresource={subresource}"]
    out = k.run(*args, check=False).stdout.strip()
    return out == "yes"


def rules_of(role):
    return [{k: v for k, v in r.items() if k in ("apiGroups", "resources", "verbs", "resourceNames")}
            for r in role["rules"]]


class Pk:
    """Helpers handed to the tests (no `from conftest import` ambiguity)."""
    ROOT = ROOT
    DEPLOY = DEPLOY
    CHART = CHART
    CRD_FILE = CRD_FILE
    CRD_NAME = CRD_NAME
    BIN = BIN
    NAMESPACE = NAMESPACE
    OPERATOR_RULES = OPERATOR_RULES
    LEASE_RULES = LEASE_RULES
    docs = staticmethod(docs)
    by_kind = staticmethod(by_kind)
    one = staticmethod(one)
    wait_for = staticmethod(wait_for)
    small_job = staticmethod(small_job)
    ensure_namespace = staticmethod(ensure_namespace)
    apply_crd = staticmethod(apply_crd)
    can_i = staticmethod(can_i)
    rules_of = staticmethod(rules_of)
    Kubectl = Kubectl


@pytest.fixture(scope="session")
def pk():
    return Pk
