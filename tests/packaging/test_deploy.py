"""deploy/ (kubebuilder config/ shape) against a real kube-apiserver + etcd
(tests/cluster/up.sh): kustomize renders, server-side dry-run and a real apply
succeed, and the operator's RBAC is exactly what it needs."""
import os

import pytest

SA = "kubetrain-system:kubetrain-operator"


@pytest.fixture(scope="module")
def rendered(kube_cluster, pk):
    return pk.docs(kube_cluster.run("kustomize", pk.DEPLOY).stdout)


def test_kustomize_renders_crd_rbac_and_operator(rendered, pk):
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRole",
                            "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"])
    # No monitors (prometheus-operator CRDs may be absent), no samples, no network policy.
    assert not [o for o in rendered if o["apiVersion"].startswith("monitoring.coreos.com")]
    for o in rendered:
        if o["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == pk.NAMESPACE, o["metadata"]


def test_deployment_runs_the_operator_hardened(rendered, pk):
    d = pk.one(rendered, "Deployment", "kubetrain-operator")
    pod = d["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kubetrain-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "kubetrain-operator:0.1.0"
    args = c["args"]
    for want in ("--in-cluster", "--leader_elect", "--leader_election_namespace=kubetrain-system",
                 "--metrics_address=0.0.0.0:8080", "--health_address=0.0.0.0:8081"):
        assert want in args, args
    assert any(a.startswith("--runtime_image=kubetrain-runtime:") for a in args), args
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsUser"] == 65532 and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8080, "health": 8081}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    svc = pk.one(rendered, "Service", "kubetrain-operator-metrics")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]


def test_operator_rbac_is_exactly_what_the_operator_uses(rendered, pk):
    assert pk.rules_of(pk.one(rendered, "ClusterRole", "kubetrain-operator")) == pk.OPERATOR_RULES
    assert pk.rules_of(pk.one(rendered, "Role", "kubetrain-leader-election")) == pk.LEASE_RULES
    viewer = pk.one(rendered, "ClusterRole", "kubetrain-trainingjob-viewer")
    editor = pk.one(rendered, "ClusterRole", "kubetrain-trainingjob-editor")
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"


def test_crd_is_the_one_in_deploy_crd(rendered, pk):
    import yaml
    with open(pk.CRD_FILE) as f:
        assert pk.one(rendered, "CustomResourceDefinition") == yaml.safe_load(f)


@pytest.mark.parametrize("sub,kinds", [
    ("prometheus", ["PodMonitor", "ServiceMonitor"]),
    ("samples", ["TrainingJob", "TrainingJob"]),
])
def test_optional_kustomizations_render(kube_cluster, pk, sub, kinds):
    objs = pk.docs(kube_cluster.run("kustomize", os.path.join(pk.DEPLOY, sub)).stdout)
    assert sorted(o["kind"] for o in objs) == kinds


def test_podmonitor_selects_training_pods_by_metrics_port(kube_cluster, pk):
    objs = pk.docs(kube_cluster.run("kustomize", os.path.join(pk.DEPLOY, "prometheus")).stdout)
    pm = pk.one(objs, "PodMonitor")
    assert pm["spec"]["selector"] == {"matchExpressions": [{"key": "kubetrain.io/job-name", "operator": "Exists"}]}
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]
    sm = pk.one(objs, "ServiceMonitor")
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]


def test_apply_dry_run_server(kube_cluster, pk):
    k = kube_cluster
    pk.apply_crd(k)
    # Namespaced objects need their namespace to exist even in a dry run.
    k.run("apply", "-f", os.path.join(pk.DEPLOY, "manager", "namespace.yaml"))
    out = k.run("apply", "-k", pk.DEPLOY, "--dry-run=server").stdout
    assert "deployment.apps/kubetrain-operator created (server dry run)" in out, out
    assert "clusterrole.rbac.authorization.k8s.io/kubetrain-operator created (server dry run)" in out, out
    # Nothing was created by the dry run.
    assert k.run("get", "deployment", "kubetrain-operator", "-n", pk.NAMESPACE, check=False).returncode != 0
    # The samples too.
    k.run("apply", "-n", "default", "-k", os.path.join(pk.DEPLOY, "samples"), "--dry-run=server")


def test_apply_grants_the_operator_exactly_its_verbs(kube_cluster, pk):
    k = kube_cluster
    pk.apply_crd(k)
    k.run("apply", "-k", pk.DEPLOY)
    k.run("get", "deployment,serviceaccount,service", "-n", pk.NAMESPACE)
    granted = [(v, "trainingjobs.kubetrain.io", None) for v in ("list", "watch", "delete")]
    granted += [("update", "trainingjobs.kubetrain.io", "status")]
    granted += [(v, "pods", None) for v in ("list", "watch", "create", "delete")]
    granted += [(v, "services", None) for v in ("list", "watch", "create", "delete")]
    granted += [(v, "configmaps", None) for v in ("list", "watch", "create", "delete")]
    granted += [(v, "secrets", None) for v in ("list", "watch", "create", "patch", "delete")]
    granted += [(v, "networkpolicies.networking.k8s.io", None) for v in ("list", "watch", "create", "delete")]
    granted += [("create", "events", None), ("patch", "events", None)]
    # Gang scheduling: PodGroups of both schedulers, with their real CRDs installed.
    crds = os.path.join(pk.ROOT, "tests", "operator", "crds")
    for path, crd in (("scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml", "podgroups.scheduling.x-k8s.io"),
                      ("volcano/scheduling.volcano.sh_podgroups.yaml", "podgroups.scheduling.volcano.sh")):
        k.run("apply", "--server-side", "-f", os.path.join(crds, path))
        k.run("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        granted += [(v, crd, None) for v in ("list", "watch", "create", "patch", "delete")]
    for verb, res, sub in granted:
        assert pk.can_i(k, verb, res, SA, subresource=sub), f"operator cannot {verb} {res} {sub or ''}"
    refused = [("create", "trainingjobs.kubetrain.io", None), ("update", "trainingjobs.kubetrain.io", None),
               ("patch", "trainingjobs.kubetrain.io", "status"), ("update", "pods", None),
               ("get", "pods", None), ("get", "configmaps", None), ("get", "secrets", None), ("update", "secrets", None), ("delete", "nodes", None),
               ("get", "networkpolicies.networking.k8s.io", None),
               ("update", "networkpolicies.networking.k8s.io", None),
               ("create", "deployments.apps", None), ("get", "services", None), ("update", "configmaps", None),
               ("create", "leases.coordination.k8s.io", None),
               ("get", "podgroups.scheduling.x-k8s.io", None), ("update", "podgroups.scheduling.volcano.sh", None)]
    for verb, res, sub in refused:
        assert not pk.can_i(k, verb, res, SA, subresource=sub), f"operator may {verb} {res} {sub or ''}"
    # Leases only in the operator's namespace, get/update only the operator's Lease.
    for verb in ("get", "update"):
        assert pk.can_i(k, verb, "leases.coordination.k8s.io", SA, ns=pk.NAMESPACE, name="kubetrain-operator")
        assert not pk.can_i(k, verb, "leases.coordination.k8s.io", SA, ns=pk.NAMESPACE, name="other")
        assert not pk.can_i(k, verb, "leases.coordination.k8s.io", SA, ns="default", name="kubetrain-operator")
    assert pk.can_i(k, "create", "leases.coordination.k8s.io", SA, ns=pk.NAMESPACE)
    assert not pk.can_i(k, "create", "leases.coordination.k8s.io", SA, ns="default")
