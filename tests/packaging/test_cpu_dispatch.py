"""docker/cpu-dispatch.sh, the runtime image's kubetrain / kubetrain-ps / kubetrain-worker:
it runs the build of the highest x86-64 level the CPU supports, on the host with a fake
/proc/cpuinfo and a fake /usr/local/lib/kubetrain (the image itself: test_image_run.py)."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DISPATCH = os.path.join(ROOT, "docker", "cpu-dispatch.sh")

V2 = "fpu sse sse2 ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm"
V3 = V2 + " avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
V4 = V3 + " avx512f avx512bw avx512cd avx512dq avx512vl"
LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")


@pytest.fixture
def image(tmp_path):
    """A fake lib dir with one build per level, each binary printing its level and args, and
    bin/ with the dispatcher under the three names the image gives it."""
    lib = tmp_path / "lib"
    for level in LEVELS:
        (lib / level).mkdir(parents=True)
        for name in ("kubetrain", "kubetrain-ps", "kubetrain-worker"):
            p = lib / level / name
            p.write_text(f'#!/bin/sh\necho "{level} {name} quiet=$KUBETRAIN_CPU_LEVEL_QUIET $*"\n')
            p.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("kubetrain", "kubetrain-ps", "kubetrain-worker"):
        os.symlink(DISPATCH, bin_dir / name)
    return tmp_path


def run(image, name, flags, *args, **env):
    cpuinfo = image / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    e = {k: v for k, v in os.environ.items() if not k.startswith("KUBETRAIN_")}
    e.update(KUBETRAIN_LIB_DIR=str(image / "lib"), KUBETRAIN_CPUINFO=str(cpuinfo), **env)
    return subprocess.run([str(image / "bin" / name), *args], capture_output=True, text=True, env=e,
                          timeout=30)


@pytest.mark.parametrize("flags,level", [(V2, "x86-64-v2"), (V3, "x86-64-v3"), (V4, "x86-64-v4")])
@pytest.mark.parametrize("name", ["kubetrain", "kubetrain-ps", "kubetrain-worker"])
def test_runs_the_highest_level_the_cpu_has(image, flags, level, name):
    proc = run(image, name, flags, "--config=/etc/kubetrain/job.yaml", "two words")
    assert proc.returncode == 0, proc.stderr
    # Its own name, the arguments unchanged, and the tasks it starts told not to say it again.
    assert proc.stdout == f"{level} {name} quiet=1 --config=/etc/kubetrain/job.yaml two words\n"
    assert proc.stderr == f"{name}: running the {level} build (CPU levels: " + \
        " ".join(LEVELS[:LEVELS.index(level) + 1]) + ")\n"


def test_a_level_is_chosen_only_among_those_the_image_has(image):
    for missing in ("x86-64-v4", "x86-64-v3"):
        for f in (image / "lib" / missing).iterdir():
            f.unlink()
        (image / "lib" / missing).rmdir()
    proc = run(image, "kubetrain", V4)
    assert proc.returncode == 0 and proc.stdout.startswith("x86-64-v2 "), proc.stdout + proc.stderr


def test_cpu_without_v2_is_refused_with_a_reason(image):
    proc = run(image, "kubetrain-ps", "fpu sse sse2")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "kubetrain-ps: this CPU lacks x86-64-v2 (SSE4.2, POPCNT)" in proc.stderr


def test_a_level_can_be_asked_for_but_not_one_the_cpu_lacks(image):
    proc = run(image, "kubetrain", V4, KUBETRAIN_CPU_LEVEL="x86-64-v2")
    assert proc.returncode == 0 and proc.stdout.startswith("x86-64-v2 kubetrain "), proc.stderr
    proc = run(image, "kubetrain-worker", V3, KUBETRAIN_CPU_LEVEL="x86-64-v4")
    assert proc.returncode == 2 and proc.stdout == ""
    assert ("kubetrain-worker: KUBETRAIN_CPU_LEVEL=x86-64-v4: this CPU supports only: "
            "x86-64-v2 x86-64-v3") in proc.stderr


def test_quiet_when_started_by_a_dispatched_binary(image):
    proc = run(image, "kubetrain-ps", V3, KUBETRAIN_CPU_LEVEL_QUIET="1")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_one_build_for_other_architectures(image):
    for level in LEVELS:
        for f in (image / "lib" / level).iterdir():
            f.unlink()
        (image / "lib" / level).rmdir()
    (image / "lib" / "armv8-a").mkdir()
    p = image / "lib" / "armv8-a" / "kubetrain"
    p.write_text('#!/bin/sh\necho "armv8-a $*"\n')
    p.chmod(0o755)
    proc = run(image, "kubetrain", "fp asimd evtstrm aes", "run")
    assert proc.returncode == 0 and proc.stdout == "armv8-a run\n", proc.stderr
    assert "running the armv8-a build" in proc.stderr
