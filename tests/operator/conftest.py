"""Fixtures for the operator tests: a real, minimal Kubernetes control plane
(etcd + kube-apiserver on 127.0.0.1) started by tests/cluster/up.sh into a
private state dir, and a kubectl wrapper bound to its kubeconfig."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
import testlib  # noqa: E402
from testlib import BIN, CLUSTER, CRD_FILE, CRD_NAME, ROOT, Kubectl  # noqa: E402,F401

_cache_bin = testlib.cache_bin
_have_go = testlib.have_go


@pytest.fixture(scope="module")
def kube_cluster():
    """Starts etcd + kube-apiserver (tests/cluster/up.sh) in a fresh state dir for
    the module and stops them afterwards (down.sh --purge). Yields a Kubectl."""
    bin_dir = _cache_bin()
    have_bins = all(os.access(os.path.join(bin_dir, b), os.X_OK)
                    for b in ("etcd", "kube-apiserver", "kubectl"))
    if not have_bins and not _have_go():
        pytest.fail(f"no control-plane binaries in {bin_dir} and no Go toolchain to build them "
                    "(make deps installs one; tests/cluster/build.sh)")
    try:
        state, env, ex = testlib.cluster_up("kubetrain-optest.", "up.sh", down_args=("--purge", "--quiet"))
    except testlib.ClusterUpFailed as e:
        pytest.fail(str(e))
    env.update(ex)
    kubectl = os.path.join(env.get("KUBETRAIN_BIN", bin_dir), "kubectl")
    try:
        yield Kubectl(kubectl, env)
    finally:
        testlib.cluster_down(env, "up.sh", "--purge", "--quiet")


@pytest.fixture(scope="module")
def crd_installed(kube_cluster):
    """The TrainingJob CRD, applied and Established."""
    k = kube_cluster
    k.run("apply", "--server-side", "--field-manager=kubetrain-tests", "-f", CRD_FILE)
    testlib.wait_established(k, CRD_NAME)
    return k


@pytest.fixture(scope="module")
def cluster():
    """A whole test cluster for the module (tests/cluster/cluster-up.sh: etcd, kube-apiserver,
    the CRD, the operator and the node agent), stopped afterwards. Yields a Kubectl with .state."""
    for b in ("kubetrain-operator", "kubetrain-ps", "kubetrain-worker"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            pytest.fail(f"{BIN}/{b} missing: run make build")
    # Image mode: without the images the node agent would run every pod from bin/, silently.
    if testlib.e2e_images():
        testlib.require_images(pytest.fail)
    with testlib.running_cluster("kubetrain-e2e.", pytest.fail) as (state, env, _):
        k = Kubectl(os.path.join(_cache_bin(), "kubectl"), env)
        k.state = state
        yield k
