"""Running a command inside a container image's root filesystem without a container engine.

Used by the test node agent (pods from images) and tests/packaging (binaries inside their
images). An image in buildah's local storage is mounted as a working container
(`buildah from` + `buildah mount`); the command runs in private mount + PID namespaces
(unshare) under `chroot --userspec=UID:GID` into a bind mount of that root, remounted
read-only when asked, with /proc, a minimal /dev, and the given bind mounts (volumes,
/etc/hosts, the termination log). The working container's own writable layer holds the
mount points, so nothing is created on the host's root. Python 3.11 stdlib only; needs
root and buildah.
"""
import json
import os
import shlex
import subprocess

# Device nodes a container gets (as runc's default /dev), bound from the host.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGES_ENV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docker", "images.env")


def images_env():
    """docker/images.env as a dict: the one place the images' names and tags are set."""
    env = {}
    with open(IMAGES_ENV) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                k, _, v = line.partition("=")
                env[k] = v
    return env


def buildah(*args, check=True):
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"buildah {shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def image_exists(image):
    """True when IMAGE is in buildah's local storage (never pulls)."""
    try:
        return buildah("inspect", "--type", "image", image, check=False).returncode == 0
    except FileNotFoundError:  # no buildah: no local images
        return False


def image_size(image):
    """IMAGE's size in bytes as buildah stores it (the sum of its uncompressed layers; what
    `buildah images` shows, in decimal MB)."""
    manifest = json.loads(json.loads(buildah("inspect", "--type", "image", image).stdout)["Manifest"])
    return sum(layer["size"] for layer in manifest["layers"])


def image_config(image):
    """The image's OCI config (Env, User, WorkingDir, Entrypoint, Cmd, Labels)."""
    out = buildah("inspect", "--type", "image", image).stdout
    return (json.loads(out).get("OCIv1") or {}).get("config") or {}


class Rootfs:
    """A working container of IMAGE with its root filesystem mounted at .path (writable layer
    private to it). close() unmounts and removes it."""

    def __init__(self, image, name=None):
        self.image = image
        self.config = image_config(image)
        args = ["from", "--pull=never", "--quiet"] + (["--name", name] if name else []) + [image]
        if name:
            buildah("rm", name, check=False)  # a leftover of a crashed run
        self.container = buildah(*args).stdout.strip().splitlines()[-1]
        try:
            self.path = buildah("mount", self.container).stdout.strip()
        except Exception:
            buildah("rm", self.container, check=False)
            raise

    def close(self):
        buildah("umount", self.container, check=False)
        buildah("rm", self.container, check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def env_path(self):
        for e in self.config.get("Env") or []:
            if e.startswith("PATH="):
                return e[len("PATH="):]
        return DEFAULT_PATH

    def user(self):
        """(uid, gid) of the image's USER, numeric only ("65532:65532"); (0, 0) when unset."""
        u = self.config.get("User") or "0"
        uid, _, gid = u.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise ValueError(f"image {self.image}: USER {u!r} is not numeric")
        return int(uid), int(gid or 0)

    def resolve(self, path):
        """PATH (absolute, inside the image) as a host path under .path, its symlinks resolved
        inside the image (as runc's securejoin): Debian's /var/run -> /run must land on the
        image's /run, never the host's. Missing components are kept as they are."""
        parts, out, hops = [p for p in path.split("/") if p], [], 0
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                out = out[:-1]
                continue
            cur = os.path.join(self.path, *out, name)
            if os.path.islink(cur):
                hops += 1
                if hops > 40:
                    raise ValueError(f"image {self.image}: too many symlinks resolving {path}")
                target = os.readlink(cur)
                parts = [p for p in target.split("/") if p] + parts
                if target.startswith("/"):
                    out = []
                continue
            out.append(name)
        return os.path.join(self.path, *out)

    def prepare_mount_point(self, dst, is_dir):
        """Creates DST (a path inside the image) in the writable layer, so a bind mount can go
        there even when the root is later remounted read-only. Returns it relative to the root."""
        p = self.resolve(dst)
        if is_dir:
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if not os.path.lexists(p):
                open(p, "a").close()
        return "/" + os.path.relpath(p, self.path)


def chroot_script(rootfs, target, binds, *, read_only, uid, gid, groups=(), workdir="/", env_path=None):
    """The /bin/sh script (run by the host's sh inside `unshare --mount --pid --fork`) that
    assembles the root at TARGET (an empty host dir) and runs "$@" in it as UID:GID. The sh
    stays PID 1 of the namespace: when it exits, the kernel kills whatever is left.
    BINDS: [(host_src, container_dst, read_only)]; container paths are absolute."""
    q = shlex.quote
    r = q(target)
    fail = lambda what: f" || {{ echo 'node-agent: cannot {what}' >&2; exit 128; }}"
    lines = [f"mount --bind {q(rootfs.path)} {r}" + fail(f"bind-mount the image root on {target}")]
    lines.append(f"mount -t proc proc {r}/proc" + fail("mount /proc"))
    lines.append(f"mount -t tmpfs -o mode=755,nosuid tmpfs {r}/dev" + fail("mount /dev"))
    for d in DEVICES:
        lines.append(f"touch {r}/dev/{d} && mount --bind /dev/{d} {r}/dev/{d}" + fail(f"bind /dev/{d}"))
    lines.append(f"ln -s /proc/self/fd {r}/dev/fd && mkdir -p {r}/dev/shm {r}/dev/pts"
                 f" && mount -t tmpfs -o mode=1777,nosuid,nodev shm {r}/dev/shm" + fail("set up /dev"))
    for src, dst, ro in binds:
        d = q(os.path.join(target, dst.lstrip("/")))
        if dst.startswith("/dev/"):  # on the tmpfs just made: the mount point must be made there
            lines.append(f"mkdir -p $(dirname {d}) && : >>{d}" if not os.path.isdir(src) else f"mkdir -p {d}")
        lines.append(f"mount --bind {q(src)} {d}" + (f" && mount -o remount,bind,ro {d}" if ro else "")
                     + fail(f"bind-mount {src} on {dst}"))
    if read_only:
        lines.append(f"mount -o remount,bind,ro {r}" + fail("remount the root read-only"))
    spec = f"{uid}:{gid}"
    grp = f" --groups={','.join(str(g) for g in groups)}" if groups else ""
    path = env_path or rootfs.env_path()
    lines.append(f"chroot --userspec={spec}{grp} {r} /usr/bin/env -C {q(workdir)} PATH={q(path)} \"$@\"")
    lines.append("exit $?")
    return "\n".join(lines)


def prepare_binds(rootfs, binds):
    """Mount points for BINDS in the image's writable layer (not for /dev/..., made at run time);
    returns BINDS with each destination resolved inside the image."""
    out = []
    for src, dst, ro in binds:
        if not dst.startswith("/dev/"):
            dst = rootfs.prepare_mount_point(dst, os.path.isdir(src))
        out.append((src, dst, ro))
    return out


def run_argv(rootfs, target, binds, argv, **kw):
    """argv for subprocess: run ARGV inside ROOTFS (see chroot_script) in new mount+PID namespaces."""
    binds = prepare_binds(rootfs, binds)
    os.makedirs(target, exist_ok=True)
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", chroot_script(rootfs, target, binds, **kw), "sh", *argv]
