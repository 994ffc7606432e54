"""How the test node agent (node_agent.py) starts a container: its environment ($(VAR)
expansion, fieldRef, ConfigMap/Secret refs), then a host process or a chroot into its image's
root filesystem (image_rootfs.py), in private mount + PID namespaces inside the pod's network
namespace; and how it reaps one."""
import ctypes, os, shlex, shutil, signal, subprocess, time

import image_rootfs
from agent_base import BACKOFF_CAP, BACKOFF_START, log, now_rfc3339


# --- Kubernetes $(VAR) expansion (third_party/forked/golang/expansion) --------------------
def expand(s, env):
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                out.append("$"); i += 2; continue
            if s[i + 1] == "(":
                j = s.find(")", i + 2)
                if j != -1:
                    name = s[i + 2:j]
                    out.append(env[name] if name in env else s[i:j + 1]); i = j + 1; continue
        out.append(s[i]); i += 1
    return "".join(out)


_prctl, _agent_pid = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()


def set_pdeathsig():  # runs in the child between fork and exec: no imports, no dlopen here
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the agent (even on SIGKILL)
    if os.getppid() != _agent_pid:
        os._exit(137)


class Container:
    def __init__(self, spec):
        self.spec, self.name = spec, spec["name"]
        self.proc = self.started_at = self.state = self.last_state = None
        self.rootfs = None  # image_rootfs.Rootfs while it runs from its image
        self.restarts, self.backoff, self.next_start, self.done = 0, BACKOFF_START, 0.0, False


class PodRun:
    def __init__(self, pod, ip, pod_dir):
        self.pod, self.uid, self.ip, self.dir = pod, pod["metadata"]["uid"], ip, pod_dir
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.containers = [Container(c) for c in pod["spec"]["containers"]]
        self.mounts = None  # [(src, dst, readOnly)] once volumes are ready
        self.start_time, self.phase, self.conds, self.sent = now_rfc3339(), "Pending", {}, None
        self.kill_deadline = None  # set when terminating
        self.waiting = None  # (reason, message) while the containers cannot be created yet
        self.sa_dir, self.sa_refresh_at, self.sa_retry_at = None, 0.0, 0.0
        self.killed = self.vanished = False


class ContainerRunner:
    """Mixed into node_agent.Agent: uses its net, bin_dir, path, hosts_path and state."""

    def start(self, run, c):
        spec, md = c.spec, run.pod["metadata"]
        env = {}
        for e in spec.get("env") or []:
            if "valueFrom" in e:
                ref = e["valueFrom"].get("fieldRef")
                val = self.field(run, ref["fieldPath"]) if ref else None
                if val is None:
                    log(f"warning: pod {run.key} container {c.name}: env {e['name']}: unsupported valueFrom {e['valueFrom']}; skipped")
                    continue
                env[e["name"]] = val
            else:
                env[e["name"]] = expand(e.get("value", ""), env)
        if self.sa_tokens:  # what the kubelet sets for in-cluster clients (here: the real API server)
            host, port = self.net.api_endpoint(self.api.load().host, self.api.port)
            env.setdefault("KUBERNETES_SERVICE_HOST", host)
            env.setdefault("KUBERNETES_SERVICE_PORT", str(port))
        term_file = os.path.join(run.dir, f"{c.name}.termination-log")
        open(term_file, "w").close()
        os.chmod(term_file, 0o666)  # as the kubelet's: writable by a non-root container user
        c.log_path = os.path.join(self.state, "logs", f"{md['namespace']}_{md['name']}_{c.name}.log")
        c.started_at, c.term_file = now_rfc3339(), term_file
        term_path = spec.get("terminationMessagePath") or "/dev/termination-log"
        binds = list(run.mounts[c.name]) + [(self.hosts_path, "/etc/hosts", False), (term_file, term_path, False)]
        if self.net.resolv_conf:
            binds.append((self.net.resolv_conf, "/etc/resolv.conf", True))
        image = spec.get("image") or ""
        mode = "image" if not self.host_binaries and image and image_rootfs.image_exists(image) else "host"
        argv = []
        try:
            if mode == "image":
                err, argv, popen = self.from_image(run, c, image, env, binds)
            else:
                err, argv, popen = self.from_host(run, c, env, binds)
            if err is None:
                with open(c.log_path, "ab") as logf:
                    c.proc = subprocess.Popen(
                        self.net.enter_argv(run.uid) + popen["argv"], stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                        env=popen["env"], cwd=popen["cwd"], start_new_session=True, preexec_fn=set_pdeathsig)
        except (OSError, RuntimeError, ValueError) as e:
            err = f"starting container {c.name} ({mode}): {e}"
        if err:
            self.release_rootfs(c)
            log(f"pod {run.key} container {c.name} failed to start: {err}")
            with open(c.log_path, "a") as f:
                f.write(f"node-agent: {err}\n")
            c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": err,
                                      "startedAt": c.started_at, "finishedAt": now_rfc3339()}}
            self.after_exit(run, c, 128)
            return
        c.state = {"running": {"startedAt": c.started_at}}
        c.run_since, self.hosts_dirty = time.time(), True
        log(f"started {run.key} container {c.name} pid {c.proc.pid} ip {run.ip}"
            f"{' image ' + image if c.rootfs else ''}: {shlex.join(argv)}")

    def from_host(self, run, c, env, binds):
        """A plain process of this machine: command[0] from --bin-dir, then PATH; the binds on the
        host's own root inside the container's mount namespace. Returns (err, argv, popen)."""
        spec, md = c.spec, run.pod["metadata"]
        argv = [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        if not spec.get("command"):
            return "container has no command (no image in local storage to take one from; set command)", argv, None
        if "/" in argv[0]:
            exe = argv[0]
        else:
            cand = os.path.join(self.bin_dir, argv[0])
            exe = cand if os.access(cand, os.X_OK) and os.path.isfile(cand) else shutil.which(argv[0], path=self.path)
            if not exe:
                return f"executable {argv[0]!r} not found in {self.bin_dir} or PATH", argv, None
        script = []
        for src, dst, ro in binds:
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)  # mount points must exist on the host
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not os.path.exists(dst):
                    open(dst, "a").close()
            sq, dq = shlex.quote(src), shlex.quote(dst)
            script.append(f"mount --bind {sq} {dq}" + (f" && mount -o remount,bind,ro {dq}" if ro else "")
                          + f" || {{ echo 'node-agent: cannot bind-mount {sq} on {dq}' >&2; exit 128; }}")
        script.append('"$@"\nexit $?')  # sh stays pid 1: when it exits, the kernel kills the rest
        cwd = spec.get("workingDir") or run.dir
        os.makedirs(cwd, exist_ok=True)
        return None, argv, {
            "argv": ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--propagation",
                     "private", "--", "/bin/sh", "-c", "\n".join(script), "sh", exe] + argv[1:],
            "env": {"PATH": self.path, "HOSTNAME": md["name"], "HOME": "/root", **env}, "cwd": cwd}

    def from_image(self, run, c, image, env, binds):
        """The container's image, as a kubelet would run it: command/args over the image's
        ENTRYPOINT/CMD, the image's Env under the pod's, runAsUser/runAsGroup (else the image's
        USER), fsGroup/supplementalGroups, readOnlyRootFilesystem, runAsNonRoot. Returns
        (err, argv, popen); c.rootfs holds the mounted working container until reap."""
        spec, md = c.spec, run.pod["metadata"]
        rootfs = c.rootfs = image_rootfs.Rootfs(
            image, name=f"kubetrain-{self.node}-{run.uid[:8]}-{c.name}-{c.restarts}")
        cfg = rootfs.config
        img_env = dict(e.partition("=")[::2] for e in cfg.get("Env") or [])
        env = {**img_env, "HOSTNAME": md["name"], "HOME": "/", **env}
        command, args = spec.get("command"), spec.get("args")
        if command:
            argv = command + (args or [])
        else:  # the Kubernetes rules: args alone replace CMD, keeping ENTRYPOINT
            argv = (cfg.get("Entrypoint") or []) + (args if args is not None else (cfg.get("Cmd") or []))
        argv = [expand(a, env) for a in argv]
        if not argv:
            return f"image {image} has no ENTRYPOINT/CMD and the container no command", argv, None
        path = env.get("PATH") or image_rootfs.DEFAULT_PATH
        if not self.in_image(rootfs, argv[0], path):
            return f"executable {argv[0]!r} not found in image {image} (PATH {path})", argv, None
        sc = {**(run.pod["spec"].get("securityContext") or {}), **(spec.get("securityContext") or {})}
        img_uid, img_gid = rootfs.user()
        uid = sc.get("runAsUser", img_uid)
        gid = sc.get("runAsGroup", img_gid)
        if sc.get("runAsNonRoot") and uid == 0:
            return (f"container has runAsNonRoot and image {image} will run as root (uid 0)"
                    " (CreateContainerConfigError)"), argv, None
        groups = [g for g in [sc.get("fsGroup")] + list(sc.get("supplementalGroups") or []) if g is not None]
        read_only = bool((spec.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        workdir = spec.get("workingDir") or cfg.get("WorkingDir") or "/"
        target = os.path.join(run.dir, f"root-{c.name}")
        popen_argv = image_rootfs.run_argv(rootfs, target, binds, argv, read_only=read_only, uid=uid, gid=gid,
                                           groups=groups, workdir=workdir, env_path=path)
        host_env = {k: v for k, v in env.items() if k != "PATH"}
        host_env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # the host's sh, mount and chroot
        return None, argv, {"argv": popen_argv, "env": host_env, "cwd": run.dir}

    @staticmethod
    def in_image(rootfs, name, path):
        """Whether NAME resolves to an executable inside the image (absolute, or on PATH)."""
        cands = [name] if "/" in name else [os.path.join(d, name) for d in path.split(":") if d]
        for cand in cands:
            p = rootfs.resolve(cand)  # its symlinks inside the image, not on the host
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return True
        return False

    def release_rootfs(self, c):
        if c.rootfs is not None:
            c.rootfs.close()
            c.rootfs = None

    def reap(self, run, c):
        code = c.proc.returncode
        code = 128 - code if code < 0 else code
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)  # the container's other processes go with it
        except OSError:
            pass
        msg = b""
        try:
            with open(c.term_file, "rb") as f:
                f.seek(max(0, os.path.getsize(c.term_file) - 4096))
                msg = f.read()
        except OSError:
            pass
        if not msg and code and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with open(c.log_path, "rb") as f:
                msg = b"".join(f.readlines()[-80:])[-2048:]
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": c.started_at, "finishedAt": now_rfc3339(), "containerID": f"kubetrain-agent://{c.proc.pid}"}
        if msg:
            term["message"] = msg.decode(errors="replace")
        c.state = {"terminated": term}
        log(f"pod {run.key} container {c.name} pid {c.proc.pid} exited {code}")
        self.release_rootfs(c)
        c.proc, self.hosts_dirty = None, True
        if time.time() - c.run_since >= BACKOFF_CAP:
            c.backoff = BACKOFF_START
        self.after_exit(run, c, code)
