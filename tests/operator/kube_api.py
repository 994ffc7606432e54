"""A tiny HTTPS client for the test API server (bearer token from the
kubeconfig up.sh writes), for tests that send many requests: one kubectl
process per request would be the bottleneck."""
import base64
import json
import ssl
import tempfile
import urllib.error
import urllib.request

import yaml


class KubeApi:
    def __init__(self, kubeconfig_path):
        with open(kubeconfig_path) as f:
            cfg = yaml.safe_load(f)
        cluster = cfg["clusters"][0]["cluster"]
        self.server = cluster["server"].rstrip("/")
        self.token = cfg["users"][0]["user"]["token"]
        ca = tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False)
        ca.write(base64.b64decode(cluster["certificate-authority-data"]))
        ca.close()
        self.ctx = ssl.create_default_context(cafile=ca.name)

    def send(self, method, path, body=None, content_type="application/json"):
        """(HTTP status, raw response body); an error status is returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("User-Agent", "kubetrain-tests")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def request(self, method, path, body=None, content_type="application/json"):
        code, raw = self.send(method, path, body, content_type)
        if code >= 400:
            raise AssertionError(f"{method} {path}: {code} {raw[:500]!r}")
        return raw.decode() if path.startswith("/metrics") else json.loads(raw or b"{}")

    def get(self, path):
        return self.request("GET", path)

    def merge_patch(self, path, patch):
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def metrics(self):
        return self.request("GET", "/metrics")


def request_counts(metrics_text, metric="apiserver_request_total", with_code=False):
    """{(verb, resource, subresource): count} summed over the other labels
    ((verb, resource, subresource, code) with with_code)."""
    out = {}
    for line in metrics_text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        labels_part, value = line.rsplit(" ", 1)
        labels = {}
        for item in labels_part[len(metric) + 1:-1].split('",'):
            if "=" in item:
                k, v = item.split("=", 1)
                labels[k] = v.strip('"')
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        if with_code:
            key += (labels.get("code", ""),)
        out[key] = out.get(key, 0) + float(value)
    return out


def delta(after, before):
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
