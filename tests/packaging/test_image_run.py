"""The images `make images` built (docker/build-images.sh, buildah), run as a node would.

Each image is mounted from buildah's local storage (`buildah from` + `buildah mount`) and
commands run inside its root filesystem with tests/cluster/image_rootfs.py: private mount
and PID namespaces, `chroot --userspec` as the image's USER, the root remounted read-only
(what the chart's readOnlyRootFilesystem asks). Checked:

- the images' USER is 65532:65532, and every shipped binary starts (`--help`) inside its
  image that way; the harness itself is checked too (uid 65532, a write to / fails);
- the runtime image trains the sync example (one epoch) to the same test accuracy as
  `kubetrain run` on the host, with only a writable work dir mounted (as an emptyDir);
- a deliberately broken Dockerfile fails the build path of `make images` with buildah's
  error shown.

Needs root and buildah, and `make images` first (the images must exist: a missing one
fails, naming the command).
"""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
import image_rootfs  # noqa: E402

BIN = os.path.join(ROOT, "bin")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


IMAGES = image_rootfs.images_env()
RUNTIME, OPERATOR = IMAGES["KUBETRAIN_RUNTIME_IMAGE"], IMAGES["KUBETRAIN_OPERATOR_IMAGE"]
SHIPPED = [(RUNTIME, "kubetrain"), (RUNTIME, "kubetrain-ps"), (RUNTIME, "kubetrain-worker"),
           (OPERATOR, "kubetrain-operator")]


def skip_in_fast_mode():
    if os.environ.get("KUBETRAIN_E2E_IMAGES", "1") == "0":
        pytest.skip("KUBETRAIN_E2E_IMAGES=0 (make test E2E_IMAGES=0): the no-image fast mode was asked for")


# Upper bounds of the images' sizes (decimal MB, uncompressed as buildah stores them): the
# runtime image is what every node pulls for every job, the operator's what its Deployment pulls.
SIZE_LIMIT_MB = {RUNTIME: 400, OPERATOR: 150}


@pytest.mark.parametrize("image", [RUNTIME, OPERATOR])
def test_image_size_is_bounded(image):
    skip_in_fast_mode()
    if not image_rootfs.image_exists(image):
        pytest.fail(f"image {image} is not in buildah's local storage: run `make images`")
    mb = image_rootfs.image_size(image) / 1e6
    print(f"\n{image}: {mb:.1f} MB (limit {SIZE_LIMIT_MB[image]} MB)")
    assert mb <= SIZE_LIMIT_MB[image], f"{image} is {mb:.1f} MB, over its {SIZE_LIMIT_MB[image]} MB bound"


@pytest.fixture(scope="module")
def roots():
    """One mounted working container per image, shared by the module's tests."""
    skip_in_fast_mode()
    if os.geteuid() != 0:
        pytest.fail("needs root (buildah mount, chroot)")
    opened = {}
    for image in (RUNTIME, OPERATOR):
        if not image_rootfs.image_exists(image):
            pytest.fail(f"image {image} is not in buildah's local storage: run `make images`")
        opened[image] = image_rootfs.Rootfs(image)
    yield opened
    for r in opened.values():
        r.close()


def run_in(rootfs, tmp_path, argv, binds=(), timeout=60, read_only=True):
    uid, gid = rootfs.user()
    target = tmp_path / f"root-{abs(hash(tuple(argv))) % 10**8}"
    cmd = image_rootfs.run_argv(rootfs, str(target), list(binds), argv, read_only=read_only, uid=uid, gid=gid)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("image", [RUNTIME, OPERATOR])
def test_image_user_is_nonroot_and_root_is_read_only(roots, tmp_path, image):
    r = roots[image]
    assert r.user() == (65532, 65532), f"{image}: USER is {r.config.get('User')!r}, want 65532:65532"
    proc = run_in(r, tmp_path, ["/bin/sh", "-c", "id -u; id -g; touch /probe && echo WROTE"])
    out = proc.stdout + proc.stderr
    assert proc.stdout.split()[:2] == ["65532", "65532"], out
    assert "WROTE" not in out and "Read-only file system" in out, out


@pytest.mark.parametrize("image,binary", SHIPPED, ids=[b for _, b in SHIPPED])
def test_binary_starts_in_its_image(roots, tmp_path, image, binary):
    proc = run_in(roots[image], tmp_path, [binary, "--help"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{binary} --help in {image} exited {proc.returncode}:\n{out}"
    assert "usage" in out.lower(), out


def one_epoch_of_the_sync_example():
    with open(os.path.join(ROOT, "examples", "fashion-mnist-sync.yaml")) as f:
        text = f.read()
    short, n = re.subn(r"(?m)^(\s+)epochs: \d+$", r"\1epochs: 1", text)
    assert n == 1, "examples/fashion-mnist-sync.yaml has no `epochs:` line to shorten"
    return short


@pytest.fixture(scope="module")
def host_summary(tmp_path_factory):
    """The summary of one epoch of the sync example run by the host's bin/kubetrain."""
    host_dir = tmp_path_factory.mktemp("host")
    (host_dir / "job.yaml").write_text(one_epoch_of_the_sync_example())
    host = subprocess.run([os.path.join(BIN, "kubetrain"), "run", str(host_dir / "job.yaml"), "--quiet",
                           "--summary_json", str(host_dir / "summary.json")],
                          capture_output=True, text=True, timeout=600)
    assert host.returncode == 0, host.stdout + host.stderr
    return json.loads((host_dir / "summary.json").read_text())


def test_runtime_image_trains_like_the_host(roots, tmp_path, host_summary):
    spec = one_epoch_of_the_sync_example()
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    (pod_dir / "job.yaml").write_text(spec)
    os.chmod(pod_dir, 0o777)  # the emptyDir the pod writes its summary to, as uid 65532

    pod = run_in(roots[RUNTIME], tmp_path, ["kubetrain", "run", "/work/job.yaml", "--quiet",
                                            "--summary_json", "/work/summary.json"],
                 binds=[(str(pod_dir), "/work", False)], timeout=600)
    assert pod.returncode == 0, f"kubetrain run in {RUNTIME} exited {pod.returncode}:\n{pod.stdout}{pod.stderr}"

    h = host_summary
    p = json.loads((pod_dir / "summary.json").read_text())
    # Same spec, same seed; the image's binaries are built per x86-64 level rather than
    # -march=native, so allow a small difference.
    assert p["test_accuracy"] > 0.75, p
    assert abs(p["test_accuracy"] - h["test_accuracy"]) <= 0.01, (h, p)
    for k in ("global_step", "target_steps"):
        if k in h:
            assert p.get(k) == h[k], (k, h, p)
    print(f"\ntest accuracy: host {h['test_accuracy']:.4f}, {RUNTIME} {p['test_accuracy']:.4f}")


# The runtime image holds one build per x86-64 level and runs the highest the CPU has
# (docker/cpu-dispatch.sh; its choices on fake CPUs: test_cpu_dispatch.py).
LEVEL_FLAGS = [("x86-64-v2", "cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3"),
               ("x86-64-v3", "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"),
               ("x86-64-v4", "avx512f avx512bw avx512cd avx512dq avx512vl")]


def host_levels():
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    levels = []
    for level, needed in LEVEL_FLAGS:
        if not set(needed.split()) <= set(flags):
            break
        levels.append(level)
    return levels


def test_runtime_image_runs_the_highest_cpu_level(roots, tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("one build on this architecture")
    levels = host_levels()
    proc = run_in(roots[RUNTIME], tmp_path, ["/bin/sh", "-c",
                                             "ls /usr/local/lib/kubetrain/*/ && kubetrain-ps --help"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for level, _ in LEVEL_FLAGS:  # every level's three binaries are in the image
        assert f"/usr/local/lib/kubetrain/{level}/:\nkubetrain\nkubetrain-ps\nkubetrain-worker\n" in \
            proc.stdout, proc.stdout
    assert f"kubetrain-ps: running the {levels[-1]} build (CPU levels: {' '.join(levels)})" in \
        proc.stderr, proc.stderr


@pytest.mark.parametrize("level", [level for level, _ in LEVEL_FLAGS])
def test_every_cpu_level_trains_like_the_host(roots, tmp_path, level, host_summary):
    """Each level's build, chosen with KUBETRAIN_CPU_LEVEL, trains one epoch of the sync
    example to the host build's accuracy (float results differ slightly between levels:
    FMA, vector widths)."""
    if level not in host_levels():
        pytest.skip(f"this CPU lacks {level}")
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    (pod_dir / "job.yaml").write_text(one_epoch_of_the_sync_example())
    os.chmod(pod_dir, 0o777)
    pod = run_in(roots[RUNTIME], tmp_path, ["env", f"KUBETRAIN_CPU_LEVEL={level}", "kubetrain", "run",
                                            "/work/job.yaml", "--quiet", "--summary_json",
                                            "/work/summary.json"],
                 binds=[(str(pod_dir), "/work", False)], timeout=600)
    assert pod.returncode == 0, f"{level}: exited {pod.returncode}:\n{pod.stdout}{pod.stderr}"
    assert f"kubetrain: running the {level} build" in pod.stderr, pod.stderr
    p = json.loads((pod_dir / "summary.json").read_text())
    assert abs(p["test_accuracy"] - host_summary["test_accuracy"]) <= 0.01, (level, host_summary, p)
    assert p["global_step"] == host_summary["global_step"], (level, host_summary, p)
    print(f"\n{level}: test accuracy {p['test_accuracy']:.4f} (host {host_summary['test_accuracy']:.4f}), "
          f"{p['examples_per_second']:.0f} examples/s")


def test_broken_dockerfile_fails_with_buildahs_error(tmp_path):
    skip_in_fast_mode()
    broken = os.path.relpath(os.path.join(FIXTURES, "Dockerfile.broken"), ROOT)
    proc = subprocess.run([os.path.join(ROOT, "docker", "build-images.sh"), "--only",
                           f"{broken}=kubetrain-broken-fixture:test"],
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, KUBETRAIN_CACHE=os.environ.get(
                              "KUBETRAIN_CACHE", os.path.expanduser("~/.cache/kubetrain"))))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    err = proc.stderr
    assert f"buildah bud -f {broken} failed" in err, err
    # buildah's own words: the step and the missing source.
    assert "no-such-file-in-the-context" in err and re.search(r"no such file or directory", err, re.I), err
    assert not image_rootfs.image_exists("kubetrain-broken-fixture:test")
