"""The pod volumes of the test node agent (node_agent.py), written as the kubelet writes them:
ConfigMap and Secret (items, file modes, fsGroup, read-only), emptyDir, hostPath, the downward
API, and the ServiceAccount token (--service-account-tokens)."""
import base64, os, re, time

from agent_base import API_VOLUMES, SA_MOUNT, SA_RETRY, SA_TOKEN_SECONDS, ApiError, log


class PodVolumes:
    """Mixed into node_agent.Agent: uses its api, net, node and state."""

    def setup_volumes(self, run):
        """Writes the pod's volumes into its dir; returns False to retry later (e.g. ConfigMap missing)."""
        vols, read_only = {}, set()
        for v in run.pod["spec"].get("volumes") or []:
            err, kind = None, next((k for k in API_VOLUMES if k in v), None)
            if "hostPath" in v:
                err = self.host_path(v["hostPath"])
                vols[v["name"]] = v["hostPath"]["path"]
            else:
                d = vols[v["name"]] = os.path.join(run.dir, "volumes", v["name"])
                os.makedirs(d, exist_ok=True)
                if "emptyDir" in v:
                    os.chmod(d, 0o777)  # as the kubelet: writable by the container's user
                elif kind:
                    err = self.write_api_volume(run, kind, v[kind], d)
                    read_only.add(v["name"])
                else:
                    log(f"warning: pod {run.key}: volume {v['name']} type {sorted(set(v) - {'name'})} unsupported; using an empty dir")
            if err:
                why = ("ContainerCreating", f"MountVolume.SetUp failed for volume {v['name']!r}: {err}")
                if run.waiting != why:
                    log(f"pod {run.key}: {why[1]}; waiting")
                run.waiting = why
                return False
        if self.sa_tokens and run.pod["spec"].get("automountServiceAccountToken") is not False:
            if time.time() < run.sa_retry_at or not self.write_sa_token(run):
                return False
        run.mounts, run.waiting = {}, None
        for c in run.containers:
            ms = []
            if run.sa_dir and not any(m.get("mountPath", "").rstrip("/") == SA_MOUNT
                                      for m in c.spec.get("volumeMounts") or []):
                ms.append((run.sa_dir, SA_MOUNT, True))
            for m in c.spec.get("volumeMounts") or []:
                if m["name"] not in vols:
                    log(f"warning: pod {run.key}: volumeMount {m['name']} has no volume; skipped")
                    continue
                ms.append((os.path.join(vols[m["name"]], m.get("subPath", "")).rstrip("/"), m["mountPath"],
                           m.get("readOnly", False) or m["name"] in read_only))
            run.mounts[c.name] = ms
        return True

    def write_api_volume(self, run, kind, src, d):
        """A configMap or secret volume, as the kubelet writes it into D: the object's keys (or only
        its `items`, key -> path), each file mode `mode`, else `defaultMode`, else 0644, owned by root,
        and with the pod's fsGroup as group plus group read (the kubelet's SetVolumeOwnership). The
        kubelet mounts them read-only (setup_volumes). Returns why it cannot be written yet, or None
        (also when it is optional and missing)."""
        ns, plural, name_field = run.pod["metadata"]["namespace"], *API_VOLUMES[kind]
        name = src.get(name_field, "")
        try:
            obj = self.api("GET", f"/api/v1/namespaces/{ns}/{plural}/{name}")
        except ApiError as e:
            if e.status == 404:  # the kubelet's words
                return None if src.get("optional") else f'{kind.lower()} "{name}" not found'
            return f"{plural} {ns}/{name}: {e}"
        if kind == "configMap":
            data = {k: val.encode() for k, val in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(val) for k, val in (obj.get("binaryData") or {}).items()})
        else:
            data = {k: base64.b64decode(val) for k, val in (obj.get("data") or {}).items()}
        items = src.get("items") or [{"key": k, "path": k} for k in sorted(data)]
        missing = [it["key"] for it in items if it["key"] not in data]
        if missing and not src.get("optional"):
            return f"{plural} {ns}/{name} has no key {missing[0]!r}"
        fs_group = (run.pod["spec"].get("securityContext") or {}).get("fsGroup")
        for it in items:
            if it["key"] not in data:
                continue
            p = os.path.join(d, it["path"])
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(data[it["key"]])
            mode = it.get("mode", src.get("defaultMode", 0o644))
            if fs_group is not None:
                os.chown(p, 0, fs_group)
                mode |= 0o440
            os.chmod(p, mode)
        return None

    @staticmethod
    def host_path(hp):
        """The kubelet's hostPath type checks; None when the path is usable."""
        path, typ = hp.get("path", ""), hp.get("type") or ""
        if not os.path.isabs(path):
            return f"hostPath {path!r} is not an absolute path"
        if typ == "DirectoryOrCreate":
            os.makedirs(path, mode=0o755, exist_ok=True)
        elif typ == "FileOrCreate" and not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        if typ in ("Directory", "DirectoryOrCreate") and not os.path.isdir(path):
            return f"hostPath type check failed: {path} is not a directory"
        if typ in ("File", "FileOrCreate") and not os.path.isfile(path):
            return f"hostPath type check failed: {path} is not a file"
        return None

    def write_sa_token(self, run):
        """TokenRequest for the pod's ServiceAccount (bound to the pod), written with ca.crt and
        namespace into the pod's serviceaccount dir. False (pod waits, status says why) on failure."""
        md = run.pod["metadata"]
        ns, sa = md["namespace"], run.pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": SA_TOKEN_SECONDS}}
        if run.pod["spec"].get("serviceAccountName") == sa:
            # Bound to the pod, as the kubelet's. (The API server refuses the binding when the pod
            # names no ServiceAccount: this cluster runs without the ServiceAccount admission plugin.)
            body["spec"]["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}
        try:
            tr = self.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body)
            token = tr["status"]["token"]
        except Exception as e:
            run.sa_retry_at = time.time() + SA_RETRY
            if isinstance(e, ApiError) and e.status == 404:
                why = ("CreateContainerConfigError", f'serviceaccount "{sa}" not found in namespace "{ns}"; '
                       "waiting for it (the service account token cannot be created)")
            else:
                why = ("CreateContainerConfigError", f"requesting a token for serviceaccount {ns}/{sa}: {e}")
            if run.waiting != why:
                log(f"pod {run.key}: {why[1]}; retrying every {SA_RETRY:g}s")
            run.waiting = why
            return False
        d = os.path.join(run.dir, "serviceaccount")
        os.makedirs(d, exist_ok=True)
        for name, data in (("token", token), ("ca.crt", self.api.ca_pem or ""), ("namespace", ns)):
            tmp = os.path.join(d, f".{name}.tmp")
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w") as f:
                f.write(data)
            os.replace(tmp, os.path.join(d, name))  # atomic: a running container may be reading it
        if run.sa_dir is None:
            log(f"pod {run.key}: token of serviceaccount {ns}/{sa} mounted at {SA_MOUNT}")
        run.sa_dir, run.waiting = d, None
        run.sa_refresh_at = time.time() + SA_TOKEN_SECONDS * 0.8  # the kubelet renews at 80% of the TTL
        return True

    def field(self, run, path):
        md = run.pod["metadata"]
        vals = {"status.podIP": run.ip, "status.podIPs": run.ip, "status.hostIP": self.net.host_ip,
                "metadata.name": md["name"], "metadata.namespace": md["namespace"], "metadata.uid": md["uid"],
                "spec.nodeName": self.node, "spec.serviceAccountName": run.pod["spec"].get("serviceAccountName", "")}
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        return (md.get(m[1]) or {}).get(m[2], "") if m else vals.get(path)
