"""Container images: does each runtime stage install what its binaries link?

No Docker engine is needed. For every binary in bin/ (`make build`):

  ldd bin/<binary>      -> the shared libraries it loads
  dpkg -S <library>     -> the Debian package that ships each one

and each package must be either installed by the `apt-get install` of the LAST
stage of the Dockerfile that ships the binary (docker/Dockerfile.runtime or
docker/Dockerfile.operator), or already part of debian:bookworm-slim.

What bookworm-slim holds is derived, not guessed: the image is a debootstrap
"minbase" (the packages with Essential: yes or Priority: required, plus apt),
so the base set is that set closed over Depends/Pre-Depends, computed from
this (Debian 12) machine's dpkg database. On bookworm that closure has libc6,
libgcc-s1, libstdc++6 and zlib1g, but not e.g. libssl3.

Also checked: numeric USER, a builder stage that runs `make build`, a runtime
stage FROM debian:bookworm-slim, the operator's ENTRYPOINT, the data set in the
runtime image, and that every binary in bin/ is shipped by some image.
"""

import os
import re
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "bin")
DOCKER = os.path.join(ROOT, "docker")
DOCKERFILES = {
    "runtime": os.path.join(DOCKER, "Dockerfile.runtime"),
    "operator": os.path.join(DOCKER, "Dockerfile.operator"),
}
SHIPPED_BINARIES = ["kubetrain", "kubetrain-ps", "kubetrain-worker", "kubetrain-operator"]
# Packages debootstrap --variant=minbase adds besides Essential/required ones
# (the Docker debian images keep apt).
MINBASE_EXTRA = ["apt"]


# --------------------------------------------------------------------------
# Dockerfile parsing


def parse_dockerfile(path):
    """Returns a list of stages; each stage is a list of (INSTRUCTION, args).

    Handles backslash continuations and comment lines inside them (Docker
    drops those), which is all our Dockerfiles use."""
    with open(path) as f:
        lines = f.read().splitlines()
    instructions = []
    current = None
    for line in lines:
        stripped = line.strip()
        if current is None:
            if not stripped or stripped.startswith("#"):
                continue
            current = ""
        elif stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        word, _, args = current.strip().partition(" ")
        instructions.append((word.upper(), args.strip()))
        current = None
    assert current is None, f"{path}: the last instruction ends with a continuation"
    stages = []
    for word, args in instructions:
        if word == "FROM":
            stages.append([])
        if not stages:
            if word == "ARG":  # ARG before the first FROM is allowed
                continue
            raise AssertionError(f"{path}: {word} before the first FROM")
        stages[-1].append((word, args))
    return stages


def stage_from(stage):
    """(image, alias) of a stage's FROM."""
    words = [w for w in stage[0][1].split() if not w.startswith("--")]
    alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
    return words[0], alias


def apt_installed(stage):
    """The package names given to `apt-get install` in the stage's RUNs."""
    packages = []
    for word, args in stage:
        if word != "RUN":
            continue
        # Split the shell command into simple commands at && ; || |.
        for command in re.split(r"&&|\|\||;|\|", args):
            tokens = shlex.split(command)
            tokens = [t for t in tokens if not re.match(r"^[A-Z_]+=", t)]  # env assignments
            if len(tokens) >= 2 and os.path.basename(tokens[0]) in ("apt-get", "apt") and "install" in tokens:
                after = tokens[tokens.index("install") + 1:]
                packages += [t.split("=")[0] for t in after if not t.startswith("-")]
    return packages


def copied_binaries(stage):
    """Binary names the stage puts into /usr/local/bin/: COPY into the directory (the
    sources' names), COPY to a file there (the runtime image's CPU-level dispatcher,
    docker/cpu-dispatch.sh, as kubetrain) and `ln -s` names made there."""
    names = []
    for word, args in stage:
        if word == "COPY":
            words = [w for w in args.split() if not w.startswith("--")]
            *sources, dest = words
            if dest.rstrip("/") == "/usr/local/bin":
                names += [os.path.basename(s) for s in sources]
            elif os.path.dirname(dest) == "/usr/local/bin":
                names.append(os.path.basename(dest))
        elif word == "RUN":
            for command in re.split(r"&&|\|\||;", args):
                tokens = shlex.split(command)
                if len(tokens) == 4 and tokens[:2] == ["ln", "-s"] and \
                        os.path.dirname(tokens[3]) == "/usr/local/bin":
                    names.append(os.path.basename(tokens[3]))
    return names


@pytest.fixture(scope="module", params=sorted(DOCKERFILES))
def image(request):
    path = DOCKERFILES[request.param]
    assert os.path.isfile(path), f"missing {path}"
    return request.param, path, parse_dockerfile(path)


# --------------------------------------------------------------------------
# Debian package database


def dpkg_status():
    """{package: fields} for every installed package (arch qualifiers dropped)."""
    fmt = "${db:Status-Abbrev}\t${Package}\t${Essential}\t${Priority}\t${Pre-Depends}\t${Depends}\t${Provides}\n"
    out = subprocess.run(["dpkg-query", "-W", "-f=" + fmt], check=True, capture_output=True, text=True).stdout
    db = {}
    for line in out.splitlines():
        status, name, essential, priority, predeps, deps, provides = (line.split("\t") + [""] * 7)[:7]
        if not status.startswith("ii"):
            continue
        db[name] = {
            "essential": essential == "yes",
            "priority": priority,
            "depends": ", ".join(x for x in (predeps, deps) if x),
            "provides": provides,
        }
    return db


def _dep_names(field):
    """[[alternative, ...], ...] from a Depends field, versions/arches dropped."""
    groups = []
    for group in field.split(","):
        alts = [re.sub(r"\s*\(.*?\)|:\S+|\s*\[.*?\]", "", a).strip() for a in group.split("|")]
        alts = [a for a in alts if a]
        if alts:
            groups.append(alts)
    return groups


def bookworm_slim_base():
    """Packages a debian:bookworm-slim image already holds (see module doc)."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("needs a Debian system (dpkg-query)")
    with open("/etc/os-release") as f:
        os_release = f.read()
    if 'VERSION_CODENAME=bookworm' not in os_release:
        pytest.skip("the base set is derived from this machine's dpkg database: needs Debian 12 (bookworm)")
    db = dpkg_status()
    providers = {}
    for name, info in db.items():
        for alts in _dep_names(info["provides"]):
            providers.setdefault(alts[0], name)
    roots = [n for n, i in db.items() if i["essential"] or i["priority"] == "required"] + MINBASE_EXTRA
    base, todo = set(), [r for r in roots if r in db]
    while todo:
        name = todo.pop()
        if name in base:
            continue
        base.add(name)
        for alts in _dep_names(db[name]["depends"]):
            for alt in alts:  # the first alternative that is installed (as apt would pick it)
                real = alt if alt in db else providers.get(alt)
                if real:
                    todo.append(real)
                    break
    # Sanity: the closure must have reached the C runtime.
    for must in ("libc6", "libgcc-s1", "libstdc++6"):
        assert must in base, f"derived bookworm-slim base set lacks {must}: dpkg database unexpected"
    return base


@pytest.fixture(scope="module")
def slim_base():
    return bookworm_slim_base()


# --------------------------------------------------------------------------
# ldd + dpkg -S


def binary_path(name):
    path = os.path.join(BIN, name)
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: run `make build` first (the image test inspects the built binaries)")
    return path


def ldd_libraries(path):
    """{soname or path: resolved path} of every library the binary loads."""
    res = subprocess.run(["ldd", path], capture_output=True, text=True)
    assert res.returncode == 0, f"ldd {path} failed: {res.stdout}{res.stderr}"
    libs = {}
    for line in res.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            pytest.fail(f"ldd {path}: {line} (the library is missing on this machine too)")
        m = re.match(r"^(\S+) => (\S+) \(0x", line)
        if m:
            libs[m.group(1)] = m.group(2)
            continue
        m = re.match(r"^(/\S+) \(0x", line)  # the dynamic loader
        if m:
            libs[m.group(1)] = m.group(1)
    # linux-vdso.so.1 has no "=> path" and no file: skipped above.
    return libs


_dpkg_cache = {}


def dpkg_owner(path):
    """The package that ships `path`. Tries the path as ldd printed it, its
    /usr-merged twin (bookworm's packages ship some libraries in /lib, most in
    /usr/lib, while ldd prints either) and the resolved real file."""
    if path in _dpkg_cache:
        return _dpkg_cache[path]
    candidates = [path]
    if path.startswith("/usr/"):
        candidates.append(path[len("/usr"):])
    else:
        candidates.append("/usr" + path)
    real = os.path.realpath(path)
    candidates += [real, real[len("/usr"):] if real.startswith("/usr/") else "/usr" + real]
    owner = None
    for c in candidates:
        res = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if res.returncode == 0:
            # "libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6"; diversions print other lines.
            for line in res.stdout.splitlines():
                if line.startswith("diversion "):
                    continue
                owner = line.split(": ", 1)[0].split(",")[0].strip().split(":")[0]
                break
        if owner:
            break
    _dpkg_cache[path] = owner
    return owner


# --------------------------------------------------------------------------
# Tests


def test_every_binary_is_shipped_by_an_image():
    shipped = {}
    for kind, path in DOCKERFILES.items():
        for name in copied_binaries(parse_dockerfile(path)[-1]):
            shipped.setdefault(name, []).append(kind)
    for name in SHIPPED_BINARIES:
        binary_path(name)
    # Everything `make build` puts in bin/ must ship somewhere.
    for name in sorted(set(SHIPPED_BINARIES) | set(os.listdir(BIN))):
        assert name in shipped, f"bin/{name} is not copied to /usr/local/bin by any of {sorted(DOCKERFILES.values())}"
    assert sorted(shipped.get("kubetrain-operator", [])) == ["operator"]
    for name in ("kubetrain", "kubetrain-ps", "kubetrain-worker"):
        assert shipped.get(name) == ["runtime"], f"{name} should ship in the runtime image, got {shipped.get(name)}"


def test_runtime_stage_has_every_linked_library(image, slim_base):
    kind, dockerfile, stages = image
    runtime = stages[-1]
    installed = set(apt_installed(runtime))
    assert installed, f"{dockerfile}: the last stage installs no packages"
    binaries = copied_binaries(runtime)
    assert binaries, f"{dockerfile}: the last stage copies no binary to /usr/local/bin"
    missing, needed = [], set()
    for name in binaries:
        path = binary_path(name)
        for lib, resolved in sorted(ldd_libraries(path).items()):
            pkg = dpkg_owner(resolved)
            if pkg is None:
                missing.append(f"{name}: {lib} ({resolved}) belongs to no Debian package (dpkg -S)")
                continue
            needed.add(pkg)
            if pkg not in installed and pkg not in slim_base:
                missing.append(f"{name}: {lib} ({resolved}) is in package {pkg}, which the runtime stage of "
                               f"{os.path.relpath(dockerfile, ROOT)} does not install and debian:bookworm-slim lacks")
    assert not missing, "missing runtime packages:\n  " + "\n  ".join(missing)
    # The other direction, so the lists stay minimal: every installed library
    # package is needed by some shipped binary (data packages excepted).
    extra = sorted(p for p in installed if p.startswith("lib") and p not in needed)
    assert not extra, f"{dockerfile}: installs {extra}, which no shipped binary links"
    # ... and no package the base image already has is listed.
    redundant = sorted(installed & slim_base)
    assert not redundant, f"{dockerfile}: installs {redundant}, already in debian:bookworm-slim"


def test_builder_stage_runs_make_build(image):
    kind, dockerfile, stages = image
    assert len(stages) >= 2, f"{dockerfile}: expected a multi-stage build"
    builders = [s for s in stages[:-1] if stage_from(s)[0] == "debian:bookworm"]
    assert builders, f"{dockerfile}: no builder stage FROM debian:bookworm"
    runs = " ; ".join(a for s in builders for w, a in s if w == "RUN")
    assert re.search(r"\bmake deps\b", runs), f"{dockerfile}: the builder does not run `make deps`"
    assert re.search(r"\bmake build\b", runs), f"{dockerfile}: the builder does not run `make build`"
    runtime = stages[-1]
    aliases = {stage_from(s)[1] for s in builders}
    for word, args in runtime:
        if word == "COPY":
            m = re.search(r"--from=(\S+)", args)
            assert m and m.group(1) in aliases, f"{dockerfile}: runtime COPY not from the builder: {args}"


def test_runtime_stage_is_bookworm_slim_nonroot(image):
    kind, dockerfile, stages = image
    runtime = stages[-1]
    assert stage_from(runtime)[0] == "debian:bookworm-slim", f"{dockerfile}: last stage is not FROM debian:bookworm-slim"
    users = [a for w, a in runtime if w == "USER"]
    assert users, f"{dockerfile}: the runtime stage sets no USER"
    assert re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]), \
        f"{dockerfile}: USER {users[-1]} is not numeric (Kubernetes' runAsNonRoot needs a numeric UID)"


def test_operator_entrypoint():
    runtime = parse_dockerfile(DOCKERFILES["operator"])[-1]
    entry = [a for w, a in runtime if w == "ENTRYPOINT"]
    assert entry, "docker/Dockerfile.operator: no ENTRYPOINT"
    assert entry[-1].replace(" ", "") in ('["kubetrain-operator"]', '["/usr/local/bin/kubetrain-operator"]'), \
        f"docker/Dockerfile.operator: ENTRYPOINT {entry[-1]}"


def test_runtime_image_has_dataset_and_no_entrypoint():
    runtime = parse_dockerfile(DOCKERFILES["runtime"])[-1]
    assert "dataset-fashion-mnist" in apt_installed(runtime), \
        "docker/Dockerfile.runtime: the tasks read /usr/share/datasets/fashion-mnist: install dataset-fashion-mnist"
    assert not [a for w, a in runtime if w == "ENTRYPOINT"], \
        "docker/Dockerfile.runtime: no ENTRYPOINT (the operator sets command kubetrain-ps / kubetrain-worker)"


def test_dockerignore_keeps_build_outputs_out():
    path = os.path.join(ROOT, ".dockerignore")
    assert os.path.isfile(path), "missing .dockerignore"
    with open(path) as f:
        patterns = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    for want in (".git", "bazel-*", "bin/"):
        assert want in patterns, f".dockerignore lacks {want}"
    for must_keep in ("Makefile", "*", "docker", "docker/"):
        assert must_keep not in patterns, f".dockerignore excludes {must_keep}, which the build needs"


def test_workflow_takes_image_names_from_images_env():
    """docker/images.env is the one place image names/tags are set: the kind e2e workflow
    reads it, builds both Dockerfiles under those names, loads and installs exactly them."""
    with open(os.path.join(ROOT, ".github", "workflows", "e2e-kind.yaml")) as f:
        wf = f.read()
    env = {}
    with open(os.path.join(DOCKER, "images.env")) as f:
        for line in f:
            if "=" in line and not line.lstrip().startswith("#"):
                k, _, v = line.strip().partition("=")
                env[k] = v
    assert set(env) == {"KUBETRAIN_OPERATOR_IMAGE", "KUBETRAIN_RUNTIME_IMAGE"}, env
    assert "docker/images.env" in wf and '>> "$GITHUB_ENV"' in wf
    for name, dockerfile in (("KUBETRAIN_RUNTIME_IMAGE", "docker/Dockerfile.runtime"),
                             ("KUBETRAIN_OPERATOR_IMAGE", "docker/Dockerfile.operator")):
        assert f'-f {dockerfile} -t "${name}"' in wf, f"the workflow does not build {dockerfile} as ${name}"
    assert 'kind load docker-image "$KUBETRAIN_OPERATOR_IMAGE" "$KUBETRAIN_RUNTIME_IMAGE"' in wf
    for key, name in (("image", "KUBETRAIN_OPERATOR_IMAGE"), ("runtimeImage", "KUBETRAIN_RUNTIME_IMAGE")):
        assert f'{key}.repository="${{{name}%:*}}"' in wf and f'{key}.tag="${{{name}##*:}}"' in wf, key
    # No image name hard-coded anywhere else in the workflow.
    assert not re.search(r"kubetrain-(operator|runtime):", wf), "an image tag is hard-coded in e2e-kind.yaml"


def test_ci_cache_never_crosses_cpus():
    """.bazelrc compiles with -march=native, so an object in Bazel's disk cache only runs on a
    CPU like the one that built it: every key and restore key of the CI workflow's caches names
    the CPU (a hash of /proc/cpuinfo's vendor, family, model and flags), so a runner never
    restores objects with instructions it lacks."""
    import yaml
    with open(os.path.join(ROOT, ".bazelrc")) as f:
        if "-march=native" not in f.read():
            return  # a portable baseline: any runner may take any object
    with open(os.path.join(ROOT, ".github", "workflows", "ci.yaml")) as f:
        wf = yaml.safe_load(f)
    for job in wf["jobs"].values():
        steps = job.get("steps", [])
        caches = [s for s in steps if str(s.get("uses", "")).startswith("actions/cache")]
        if not caches:
            continue
        cpu = next((s for s in steps if s.get("id") == "cpu"), None)
        assert cpu, "no step `id: cpu` hashing the CPU for the cache keys (.bazelrc has -march=native)"
        assert "/proc/cpuinfo" in cpu["run"] and "flags" in cpu["run"], cpu
        assert steps.index(cpu) < min(steps.index(s) for s in caches), "the CPU hash comes after a cache"
        for s in caches:
            restore = [line.strip() for line in s["with"].get("restore-keys", "").splitlines()]
            keys = [s["with"]["key"], *filter(None, restore)]
            for key in keys:
                assert "${{ steps.cpu.outputs.hash }}" in key, f"cache key without the CPU: {key}"
