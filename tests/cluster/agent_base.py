"""What every part of the test node agent shares (node_agent.py): its log, the kubelet-like
constants, and a small client of the API server configured from a kubeconfig."""
import base64, http.client, json, os, re, ssl, sys, threading, time, urllib.parse

BACKOFF_START, BACKOFF_CAP, GRACE_CAP, HEARTBEAT = 1.0, 10.0, 5.0, 10.0
# Grace periods up to Kubernetes' default are cut to GRACE_CAP (tests stay fast); a longer one
# was asked for on purpose (e.g. PS pods that may hold parameters they could not save) and is
# honoured, as the kubelet would.
DEFAULT_GRACE = 30
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_TOKEN_SECONDS, SA_RETRY = 3607, 2.0  # the kubelet's token lifetime; retry a missing ServiceAccount
WATCH_TIMEOUT = 60
# Volumes written from an API object: kind -> (resource, the field naming the object).
API_VOLUMES = {"configMap": ("configmaps", "name"), "secret": ("secrets", "secretName")}


def log(msg):
    print(f"node-agent {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def now_rfc3339():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- kubeconfig: JSON or the block-style YAML subset kubeconfigs use ---------------------
def parse_yaml(text):
    lines = [(len(l) - len(l.lstrip(" ")), l.strip()) for l in text.splitlines()
             if l.strip() and not l.strip().startswith("#")]

    def scalar(v):
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            return v[1:-1]
        return {"true": True, "false": False, "null": None, "~": None, "{}": {}, "[]": []}.get(v, v)

    def is_item(s):
        return s == "-" or s.startswith("- ")

    def block(i, ind):
        if not is_item(lines[i][1]):
            return mapping(i, ind)
        out = []
        while i < len(lines) and lines[i][0] == ind and is_item(lines[i][1]):
            rest = lines[i][1][1:].strip()
            if not rest:
                i += 1
                v, i = block(i, lines[i][0]) if i < len(lines) and lines[i][0] > ind else (None, i)
            elif re.match(r"[^\s\"']+:(\s|$)", rest):
                lines[i] = (ind + 2, rest)
                v, i = mapping(i, ind + 2)
            else:
                v, i = scalar(rest), i + 1
            out.append(v)
        return out, i

    def mapping(i, ind):
        out = {}
        while i < len(lines) and lines[i][0] == ind and not is_item(lines[i][1]):
            key, _, rest = lines[i][1].partition(":")
            i += 1
            if rest.strip():
                out[key.strip()] = scalar(rest)
            elif i < len(lines) and (lines[i][0] > ind or (lines[i][0] == ind and is_item(lines[i][1]))):
                out[key.strip()], i = block(i, lines[i][0])
            else:
                out[key.strip()] = None
        return out, i

    return block(0, lines[0][0])[0] if lines else {}


def load_kubeconfig(path, state_dir):
    text = open(path).read()
    cfg = json.loads(text) if text.lstrip().startswith("{") else parse_yaml(text)
    named = lambda kind, name: next((x.get(kind[:-1]) or {} for x in cfg.get(kind) or []
                                     if x.get("name") == name), {})
    ctx = named("contexts", cfg.get("current-context")) or (cfg["contexts"][0]["context"])
    cluster, user = named("clusters", ctx.get("cluster")), named("users", ctx.get("user"))
    url = urllib.parse.urlsplit(cluster["server"])
    if url.hostname is None or not url.hostname.startswith(("127.", "localhost")):
        raise SystemExit(f"refusing non-loopback API server {cluster['server']}")
    tls, ca_pem = ssl.create_default_context(), None
    if cluster.get("insecure-skip-tls-verify"):
        tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        tls.load_verify_locations(cadata=ca_pem)
    elif cluster.get("certificate-authority"):
        tls.load_verify_locations(cafile=cluster["certificate-authority"])
        ca_pem = open(cluster["certificate-authority"]).read()
    cert, key = user.get("client-certificate"), user.get("client-key")
    for field, fname in (("client-certificate-data", "client.crt"), ("client-key-data", "client.key")):
        if user.get(field):
            p = os.path.join(state_dir, fname)
            with open(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(base64.b64decode(user[field]))
            cert, key = (p, key) if fname == "client.crt" else (cert, p)
    if cert:
        tls.load_cert_chain(cert, key)
    return url.hostname, url.port or 443, tls, user.get("token"), ca_pem


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    def __init__(self, kubeconfig, state_dir):
        self.kubeconfig, self.state_dir, self.mtime, self.lock = kubeconfig, state_dir, None, threading.Lock()

    def load(self):
        with self.lock:  # (re)load the kubeconfig when it changes, e.g. the test cluster was restarted
            mtime = os.stat(self.kubeconfig).st_mtime_ns
            if mtime != self.mtime:
                self.host, self.port, self.tls, self.token, self.ca_pem = load_kubeconfig(self.kubeconfig,
                                                                                          self.state_dir)
                if self.mtime is not None:
                    log(f"reloaded {self.kubeconfig}")
                self.mtime = mtime
        return self

    def open(self, method, path, body=None, ctype="application/json", timeout=30):
        self.load()
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls, timeout=timeout)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = ctype
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=headers)
        return conn, conn.getresponse()

    def __call__(self, method, path, body=None, ctype="application/json"):
        conn, resp = self.open(method, path, body, ctype)
        try:
            data = resp.read().decode()
            if resp.status >= 300:
                raise ApiError(resp.status, data)
            return json.loads(data) if data else {}
        finally:
            conn.close()
