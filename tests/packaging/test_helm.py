"""The helm chart (helm/kubetrain) with a real helm (tests/cluster/build_helm.sh)
against a real kube-apiserver + etcd (tests/cluster/up.sh): lint, the values
schema, rendering, server-side dry-run, install, and the chart's RBAC proven
sufficient by running the real operator with the chart's ServiceAccount token
until a TrainingJob succeeds (pods run by the test node agent)."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import yaml

RELEASE = "kubetrain"          # fullname = "kubetrain" (the release name contains the chart name)
JOB = "helm-rbac"


def template(h, pk, *args, chart=None):
    return pk.docs(h.run("template", RELEASE, chart or pk.CHART, "-n", pk.NAMESPACE, *args).stdout)


# --- offline: lint, schema, rendering -----------------------------------------------------------

def test_lint_strict(helm_offline, pk):
    out = helm_offline.run("lint", "--strict", pk.CHART).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


def test_chart_metadata(pk):
    with open(os.path.join(pk.CHART, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    assert chart["apiVersion"] == "v2" and chart["type"] == "application"
    assert chart["version"] == "0.1.0" and chart["appVersion"]
    assert chart["kubeVersion"] == ">=1.29.0-0"


@pytest.mark.parametrize("setting", ["imag.tag=x", "image.tga=x", "operator.leaderElection=false",
                                     "monitoring.serviceMonitor.enable=true", "resources.limits.cpus=1",
                                     "crds.create=maybe", "image.pullPolicy=Sometimes",
                                     "operator.bulkPort=0", "operator.bulkPort=70000"])
def test_schema_refuses_typos(helm_offline, pk, setting):
    proc = helm_offline.run("template", RELEASE, pk.CHART, "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert "schema" in proc.stderr, proc.stderr


def test_schema_closes_every_object(pk):
    """additionalProperties at every level: false for fixed shapes, a value schema for maps."""
    with open(os.path.join(pk.CHART, "values.schema.json")) as f:
        schema = json.load(f)
    open_ok = {"/properties/global",  # Helm's reserved global values
               "/properties/affinity/properties/nodeAffinity", "/properties/affinity/properties/podAffinity",
               "/properties/affinity/properties/podAntiAffinity"}  # core/v1 types, validated by the API server
    bad = []

    def walk(node, path):
        if not isinstance(node, dict):
            return
        if node.get("type") == "object" and path not in open_ok:
            ap = node.get("additionalProperties")
            if ap is not False and not isinstance(ap, dict):
                bad.append(path or "/")
            if isinstance(ap, dict):
                walk(ap, path + "/additionalProperties")
        for key in ("properties",):
            for name, sub in node.get(key, {}).items():
                walk(sub, f"{path}/properties/{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "/items")
        for alt in node.get("anyOf", []) + node.get("oneOf", []):
            walk(alt, path)

    walk(schema, "")
    assert not bad, f"objects without additionalProperties: {bad}"
    # Every top-level value is described by the schema (values.yaml itself validates).
    with open(os.path.join(pk.CHART, "values.yaml")) as f:
        values = yaml.safe_load(f)
    assert set(values) <= set(schema["properties"])


def test_renders_operator_rbac_and_crd(helm_offline, pk):
    objs = template(helm_offline, pk)
    d = pk.one(objs, "Deployment", RELEASE)
    pod = d["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "kubetrain-operator:0.1.0"
    for want in ("--in-cluster", "--leader_elect", f"--leader_election_namespace={pk.NAMESPACE}",
                 "--metrics_address=0.0.0.0:8080", "--health_address=0.0.0.0:8081",
                 "--runtime_image=kubetrain-runtime:0.1.0", "--job_tls=true"):
        assert want in c["args"], c["args"]
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["serviceAccountName"] == pk.one(objs, "ServiceAccount", RELEASE)["metadata"]["name"]
    # RBAC mirrors deploy/rbac.
    assert pk.rules_of(pk.one(objs, "ClusterRole", RELEASE)) == pk.OPERATOR_RULES
    assert pk.rules_of(pk.one(objs, "Role", f"{RELEASE}-leader-election")) == pk.LEASE_RULES
    deploy_objs = []
    for f in ("role.yaml", "leader_election_role.yaml"):
        with open(os.path.join(pk.DEPLOY, "rbac", f)) as fh:
            deploy_objs.append(yaml.safe_load(fh))
    assert pk.rules_of(deploy_objs[0]) == pk.OPERATOR_RULES and pk.rules_of(deploy_objs[1]) == pk.LEASE_RULES
    viewer = pk.one(objs, "ClusterRole", f"{RELEASE}-trainingjob-viewer")
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    editor = pk.one(objs, "ClusterRole", f"{RELEASE}-trainingjob-editor")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    # The CRD: the same spec as deploy/crd, kept on uninstall.
    crd = pk.one(objs, "CustomResourceDefinition", pk.CRD_NAME)
    with open(pk.CRD_FILE) as f:
        original = yaml.safe_load(f)
    assert crd["spec"] == original["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    with open(pk.CRD_FILE, "rb") as a, open(os.path.join(pk.CHART, "files", "crds", os.path.basename(pk.CRD_FILE)),
                                             "rb") as b:
        assert a.read() == b.read(), "helm/kubetrain/files/crds is stale: run helm/sync-chart-files.sh"
    # No monitors without the monitoring API.
    assert not [o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")]


def test_values_reach_the_templates(helm_offline, pk):
    objs = template(helm_offline, pk, "--set", "image.repository=example/kubetrain-operator",
                    "--set", "image.tag=v9", "--set", "runtimeImage.tag=r1", "--set", "crds.create=false",
                    "--set", "operator.watchNamespace=ml", "--set", "operator.leaderElect=false",
                    "--set", "rbac.userRoles=false", "--set", "operator.jobTls=false",
                    "--set", "operator.bulkPort=-1")
    (c,) = pk.one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "example/kubetrain-operator:v9"
    assert "--runtime_image=kubetrain-runtime:r1" in c["args"] and "--namespace=ml" in c["args"]
    assert "--leader_elect" not in c["args"]
    assert "--job_tls=false" in c["args"]
    assert "--bulk_port=-1" in c["args"]
    assert not pk.by_kind(objs, "CustomResourceDefinition") and not pk.by_kind(objs, "Role")
    assert [o["metadata"]["name"] for o in pk.by_kind(objs, "ClusterRole")] == [RELEASE]


def test_monitors_only_with_the_monitoring_api(helm_offline, pk):
    on = ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
          "--set", "monitoring.podMonitor.additionalLabels.release=prom"]
    assert not [o for o in template(helm_offline, pk, *on) if o["kind"].endswith("Monitor")]
    objs = template(helm_offline, pk, *on, "--api-versions", "monitoring.coreos.com/v1")
    pm = pk.one(objs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["selector"]["matchExpressions"] == [{"key": "kubetrain.io/job-name", "operator": "Exists"}]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    sm = pk.one(objs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    svc = pk.one(objs, "Service", f"{RELEASE}-metrics")
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    # Enabled but not asked for: nothing.
    assert not [o for o in template(helm_offline, pk, "--api-versions", "monitoring.coreos.com/v1")
                if o["kind"].endswith("Monitor")]


def test_dashboards_configmap_per_json_file(helm_offline, pk, tmp_path):
    chart = tmp_path / "kubetrain"
    shutil.copytree(pk.CHART, chart)
    dash = chart / "dashboards"
    for f in dash.glob("*.json"):
        f.unlink()
    assert not [o for o in template(helm_offline, pk, chart=str(chart)) if o["kind"] == "ConfigMap"]
    # The repository's dashboards (as `make` copies them), or two stand-ins.
    sources = sorted((p for p in os.scandir(os.path.join(pk.ROOT, "dashboards")) if p.name.endswith(".json")),
                     key=lambda p: p.name) if os.path.isdir(os.path.join(pk.ROOT, "dashboards")) else []
    files = {}
    for p in sources:
        files[p.name] = open(p.path).read()
    if len(files) < 2:
        files.update({"a_Test.json": json.dumps({"uid": "a", "title": "A"}, indent=2),
                      "b.json": json.dumps({"uid": "b", "panels": []}, indent=2)})
    for name, text in files.items():
        (dash / name).write_text(text)
    cms = [o for o in template(helm_offline, pk, chart=str(chart)) if o["kind"] == "ConfigMap"]
    assert len(cms) == len(files)
    names = [cm["metadata"]["name"] for cm in cms]
    assert len(set(names)) == len(names), names  # one installable object per dashboard
    got = {}
    for cm in cms:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == pk.NAMESPACE
        (name, text), = cm["data"].items()
        got[name] = text
    assert {n: json.loads(t) for n, t in got.items()} == {n: json.loads(t) for n, t in files.items()}
    off = template(helm_offline, pk, "--set", "monitoring.grafanaDashboard.enabled=false", chart=str(chart))
    assert not [o for o in off if o["kind"] == "ConfigMap"]


# --- against the test API server ----------------------------------------------------------------

def test_template_apply_dry_run_server(helm, kube_cluster, pk):
    k = kube_cluster
    manifest = helm.run("template", RELEASE, pk.CHART, "-n", pk.NAMESPACE).stdout
    pk.ensure_namespace(k, pk.NAMESPACE)   # namespaced objects need it even in a dry run
    out = k.run("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    assert f"deployment.apps/{RELEASE} created (server dry run)" in out, out
    assert "customresourcedefinition.apiextensions.k8s.io/trainingjobs.kubetrain.io created (server dry run)" in out


def test_install_without_monitoring_crds(helm, kube_cluster, pk):
    k = kube_cluster
    proc = helm.run("install", RELEASE, pk.CHART, "-n", pk.NAMESPACE, "--create-namespace",
                    "--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true")
    assert "STATUS: deployed" in proc.stdout, proc.stdout
    assert "kind: TrainingJob" in proc.stdout and "no monitors were created" in proc.stdout, proc.stdout
    manifest = helm.run("get", "manifest", RELEASE, "-n", pk.NAMESPACE).stdout
    assert "kind: ServiceMonitor" not in manifest and "kind: PodMonitor" not in manifest
    k.run("wait", "--for=condition=Established", f"crd/{pk.CRD_NAME}", "--timeout=60s")
    for what in ("deployment", "serviceaccount", "service", "role", "rolebinding"):
        k.run("get", what, "-n", pk.NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name")
    assert k.json("get", "serviceaccount", RELEASE, "-n", pk.NAMESPACE)["metadata"]["name"] == RELEASE
    # The NOTES.txt sample is ready to apply.
    notes = helm.run("get", "notes", RELEASE, "-n", pk.NAMESPACE).stdout
    sample = notes.split("<<'YAML'", 1)[1].split("\n", 1)[1].split("\nYAML\n", 1)[0]
    pk.wait_for(lambda: k.run("get", "trainingjobs", "-A", check=False).returncode == 0, 30, "TrainingJob discovery")
    k.run("apply", "--dry-run=server", "-n", "default", "-f", "-", input=sample)


@pytest.fixture(scope="module")
def sa_kubeconfig(kube_cluster, pk, tmp_path_factory):
    """A kubeconfig with a TokenRequest token of the chart's ServiceAccount."""
    k = kube_cluster
    token = k.run("create", "token", RELEASE, "-n", pk.NAMESPACE, "--duration=1h").stdout.strip()
    assert token.count(".") == 2, "not a JWT"
    admin = k.json("config", "view", "--raw", "--minify")
    cluster = admin["clusters"][0]["cluster"]
    assert cluster["server"].startswith("https://127.0.0.1:"), cluster["server"]
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "operator",
           "clusters": [{"name": "test", "cluster": {"server": cluster["server"],
                                                     "certificate-authority-data":
                                                         cluster["certificate-authority-data"]}}],
           "users": [{"name": "operator", "user": {"token": token}}],
           "contexts": [{"name": "operator", "context": {"cluster": "test", "user": "operator"}}]}
    path = tmp_path_factory.mktemp("sa") / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    env = dict(k.env, KUBECONFIG=str(path))
    return str(path), pk.Kubectl(k.binary, env)


def test_token_request_authenticates_as_the_service_account(sa_kubeconfig, pk):
    _, sa = sa_kubeconfig
    who = sa.json("auth", "whoami")
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{pk.NAMESPACE}:{RELEASE}"


def _start(args, log_path, env=None):
    log = open(log_path, "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)   # its own session: only what this test started
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_operator_with_the_charts_rbac_runs_a_job_to_success(sa_kubeconfig, kube_cluster, pk, tmp_path):
    for b in ("kubetrain-operator", "kubetrain-ps", "kubetrain-worker"):
        if not os.access(os.path.join(pk.BIN, b), os.X_OK):
            pytest.fail(f"{pk.BIN}/{b} missing: run `make build` first")
    path, sa = sa_kubeconfig
    k = kube_cluster
    env = {key: v for key, v in k.env.items() if key != "KUBECONFIG"}
    agent = _start(["python3", os.path.join(pk.ROOT, "tests", "cluster", "node_agent.py"),
                    "--kubeconfig", k.env["KUBECONFIG"], "--bin-dir", pk.BIN,
                    "--state-dir", str(tmp_path / "agent")], tmp_path / "agent.log", env=k.env)
    operator = _start([os.path.join(pk.BIN, "kubetrain-operator"), "--kubeconfig", path,
                       "--leader_elect", f"--leader_election_namespace={pk.NAMESPACE}",
                       "--metrics_address=127.0.0.1:0", "--health_address=127.0.0.1:0"],
                      tmp_path / "operator.log", env=env)

    def logs():
        return "\n".join(f"--- {n} (tail)\n" + (tmp_path / n).read_text()[-3000:]
                         for n in ("operator.log", "agent.log"))
    try:
        job = pk.small_job(JOB)
        k.run("apply", "-n", "default", "-f", "-", input=json.dumps(job))
        deadline = time.time() + 240
        st = {}
        while time.time() < deadline:
            assert operator.poll() is None, f"operator exited {operator.returncode}\n{logs()}"
            st = k.json("get", "tj", JOB, "-n", "default").get("status", {})
            if st.get("state") in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        assert st.get("state") == "Succeeded", f"status: {json.dumps(st)[:2000]}\n{logs()}"
        # It took the Lease in the chart's namespace, and its events were allowed.
        lease = k.json("get", "lease", "kubetrain-operator", "-n", pk.NAMESPACE)
        assert lease["spec"].get("holderIdentity"), lease
        events = k.json("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={JOB}")
        assert events["items"], "no Events for the job: was events/create refused?"
        text = (tmp_path / "operator.log").read_text()
        assert "403" not in text and "orbidden" not in text, text[-3000:]
    finally:
        _stop(operator)
        _stop(agent)
    # The chart grants nothing beyond the operator's verbs.
    for args in (("delete", "nodes", "x"), ("get", "secret", "x", "-n", "default"),
                 ("create", "namespace", "x"),
                 ("patch", "tj", JOB, "-n", "default", "--type=merge", "-p", '{"spec":{"suspend":true}}'),
                 ("delete", "lease", "kubetrain-operator", "-n", pk.NAMESPACE)):
        proc = sa.run(*args, check=False)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), (args, proc.stdout, proc.stderr)


def test_monitors_rendered_once_the_monitoring_api_is_served(helm, kube_cluster, pk, tmp_path):
    """With (stand-in) prometheus-operator CRDs the same release renders both monitors."""
    k = kube_cluster
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors")):
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": f"{plural}.monitoring.coreos.com"},
               "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                        "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": kind + "List"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "schema": {"openAPIV3Schema": {"type": "object",
                                                                     "x-kubernetes-preserve-unknown-fields": True}}}]}}
        k.run("apply", "-f", "-", input=json.dumps(crd))
        k.run("wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", "--timeout=60s")
    pk.wait_for(lambda: k.run("get", "servicemonitors,podmonitors", "-A", check=False).returncode == 0, 30,
                "monitoring API in discovery")
    helm.run("upgrade", RELEASE, pk.CHART, "-n", pk.NAMESPACE, "--reuse-values")
    k.run("get", "servicemonitor", RELEASE, "-n", pk.NAMESPACE)
    k.run("get", "podmonitor", f"{RELEASE}-jobs", "-n", pk.NAMESPACE)


def test_uninstall_keeps_the_crd_and_jobs(helm, kube_cluster, pk):
    k = kube_cluster
    helm.run("uninstall", RELEASE, "-n", pk.NAMESPACE)
    assert k.run("get", "deployment", RELEASE, "-n", pk.NAMESPACE, check=False).returncode != 0
    k.run("get", "crd", pk.CRD_NAME)
    k.run("get", "tj", JOB, "-n", "default")
