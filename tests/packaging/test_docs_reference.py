"""The docs cannot drift from the code (docs/development.md, "The docs cannot drift").

- The field reference (docs/reference/trainingjob.md) against the CRD's OpenAPI
  schema (deploy/crd/kubetrain.io_trainingjobs.yaml), both ways, and against the
  keys the C++ parser reads (core/*.cc), both ways.
- The metrics reference (docs/monitoring.md) against the metric names the code
  registers (core/, ps/, worker/, operator/, cli/), both ways.
- Every relative link of README.md and docs/ resolves: the file exists and a
  #fragment names one of its headings.

What is left out, on purpose: the internals of a replica's `template` (Kubernetes'
own PodTemplateSpec; the CRD lists a few of its fields only to hang CEL rules on
them) and of `metadata` (ObjectMeta). Both are documented as a whole. Under a
mapping the CRD keeps open (x-kubernetes-preserve-unknown-fields: layers, columns,
embeddings, the wide part, status.progress, status.result) a documented field need
not be in the schema; under `spec` the parser must know it.

Pure Python, no cluster: `python3 -m pytest -q tests/packaging/test_docs_reference.py`.
"""
import glob
import os
import re

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CRD = os.path.join(ROOT, "deploy", "crd", "kubetrain.io_trainingjobs.yaml")
REFERENCE = os.path.join(ROOT, "docs", "reference", "trainingjob.md")
MONITORING = os.path.join(ROOT, "docs", "monitoring.md")

# Paths whose children are Kubernetes' own types, documented as a whole.
KUBERNETES_OWN = ("spec.replicaSpecs.*.template.", "metadata.")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _prose_lines(path):
    """(line number, line) of a Markdown file, each line of a ``` code fence (its fence
    lines included) given as "": code is neither a heading, a table nor a link."""
    in_fence = False
    for n, line in enumerate(_read(path).split("\n"), 1):
        fence = line.startswith("```")
        yield n, "" if fence or in_fence else line
        if fence:
            in_fence = not in_fence


# ---------------------------------------------------------------- the CRD


def crd_fields():
    """(paths, open_paths): every field of the CRD's schema as a dotted path
    ("spec.training.model.layers[].units", map values as "*"), and the paths whose
    node keeps unknown fields or is a free map."""
    doc = yaml.safe_load(_read(CRD))
    (version,) = [v for v in doc["spec"]["versions"] if v.get("storage")]
    paths, open_paths = set(), set()

    def walk(node, path):
        if path:
            paths.add(path)
        if node.get("x-kubernetes-preserve-unknown-fields"):
            open_paths.add(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}" if path else key)
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")
        extra = node.get("additionalProperties")
        if extra is not None:
            open_paths.add(path)
            if isinstance(extra, dict):
                walk(extra, path + ".*")

    walk(version["schema"]["openAPIV3Schema"], "")
    return paths, open_paths


# ---------------------------------------------------------------- the reference


def _normalise(name):
    name = re.sub(r"\[[a-z]*\]", "[]", name)  # [i] -> []
    return re.sub(r"<[^>]+>", "*", name)  # <type> -> *


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def documented_fields(path=REFERENCE):
    """{field path: line number} of every row of every table whose first header
    cell is "Field", the row's names (backticked, several per row allowed: `a` /
    `b`) relative to the path in the nearest heading above (its first backticked
    span; "Top level" is the root)."""
    fields, errors = {}, []
    section = None
    in_table = False
    is_field_table = False
    for n, line in _prose_lines(path):
        m = re.match(r"^#{1,6} (.*)", line)
        if m:
            spans = re.findall(r"`([^`]+)`", m.group(1))
            if m.group(1).strip() == "Top level":
                section = ""
            elif spans and re.fullmatch(r"[A-Za-z][\w.\[\]<>*]*", spans[0]):
                section = _normalise(spans[0])
            else:
                section = None
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table:
            in_table = True
            is_field_table = _cells(line)[0] == "Field"
            if is_field_table and section is None:
                errors.append(f"{path}:{n}: a field table under a heading that names no path")
            continue
        if not is_field_table or re.fullmatch(r"[|\-: ]+", line.strip()) or section is None:
            continue
        for name in re.findall(r"`([^`]+)`", _cells(line)[0]):
            full = _normalise(name) if section == "" else f"{section}.{_normalise(name)}"
            fields[full] = n
    assert not errors, "\n".join(errors)
    return fields


def _ancestors(path):
    parts = re.split(r"\.|(?=\[\])", path)
    return [re.sub(r"\.\[\]", "[]", ".".join(parts[:i])) for i in range(1, len(parts))]


def _kubernetes_own(path):
    return any(path.startswith(p) for p in KUBERNETES_OWN)


def test_reference_parses():
    fields = documented_fields()
    for must in ("apiVersion", "spec.replicaSpecs.*.replicas", "spec.training.optimizer.learningRate",
                 "spec.training.model.layers[].units", "status.conditions[].type"):
        assert must in fields, f"{must} not found: the reference's tables no longer parse"


def test_every_crd_field_is_documented():
    paths, _ = crd_fields()
    documented = documented_fields()
    covered = set(documented)
    for p in documented:
        covered.update(_ancestors(p))
    missing = []
    for p in sorted(paths):
        if _kubernetes_own(p) or p in covered:
            continue
        # A list's items or a map's values are documented with the list or map.
        if (p.endswith("[]") and p[:-2] in covered) or (p.endswith(".*") and p[:-2] in covered):
            continue
        missing.append(p)
    assert not missing, (
        "in the CRD's schema but not in a field table of docs/reference/trainingjob.md: "
        + ", ".join(missing))


def test_every_documented_field_is_in_the_crd():
    paths, open_paths = crd_fields()
    unknown = []
    for p, line in sorted(documented_fields().items()):
        if p in paths or _kubernetes_own(p):
            continue
        if any(a in open_paths for a in _ancestors(p)):
            continue  # the CRD keeps that mapping open; the parser check covers spec
        unknown.append(f"{p} (docs/reference/trainingjob.md:{line})")
    assert not unknown, "documented but not in the CRD's schema: " + ", ".join(unknown)


# ---------------------------------------------------------------- the parser


def _parser_sources():
    files = [f for f in sorted(glob.glob(os.path.join(ROOT, "core", "*.cc"))) if not f.endswith("_test.cc")]
    return {f: re.sub(r"//[^\n]*", "", _read(f)) for f in files}


def parser_keys():
    """(known, read): the keys of the parser's known-key lists (the braced string
    lists handed to Fields::Read / ReadSection / a `known` vector / a *Keys()
    table), and those plus every key it reads (ReadX(f, "key"), .Get("key"),
    .Has("key"), .PathOf("key"))."""
    known, read = set(), set()
    for text in _parser_sources().values():
        for statement in text.split(";"):
            if not re.search(r"Fields::Read|ReadSection|\bknown\b|Keys\(\)", statement):
                continue
            if "CheckOneOf" in statement:
                continue
            for lst in re.findall(r"\{\s*(\"[A-Za-z]\w*\"(?:\s*,\s*\"[A-Za-z]\w*\")*)\s*,?\s*\}", statement):
                known.update(re.findall(r"\"(\w+)\"", lst))
            known.update(re.findall(r"\bknown\.push_back\(\s*\"(\w+)\"\s*\)", statement))
        read.update(re.findall(r"\bRead\w*\(\s*\w+\s*,\s*\"(\w+)\"", text))
        read.update(re.findall(r"\.(?:Get|Has|PathOf)\(\s*\"(\w+)\"\s*\)", text))
    read |= known
    return known, read


def _components(path):
    return [c for c in re.split(r"[.\[\]]+", path) if c and c != "*"]


def test_parser_keys_are_found():
    known, _ = parser_keys()
    # If the extraction finds little, the parser's shape changed: fix the regexes.
    for must in ("replicaSpecs", "learningRate", "shuffleBuffer", "units", "hashBuckets", "rate", "maxRows"):
        assert must in known, f"{must} not found in core/*.cc's known-key lists: update parser_keys()"
    assert len(known) > 80, sorted(known)


def test_every_documented_spec_field_is_read_by_the_parser():
    _, read = parser_keys()
    missing = []
    for p, line in sorted(documented_fields().items()):
        if p.startswith("status.") or p.startswith("spec.replicaSpecs.*.template."):
            continue
        for c in _components(p):
            if c not in read:
                missing.append(f"{p} ({c!r}; docs/reference/trainingjob.md:{line})")
                break
    assert not missing, "documented but not read by the parser (core/*.cc): " + ", ".join(missing)


def test_every_key_the_parser_knows_is_documented():
    known, _ = parser_keys()
    documented = set()
    for p in documented_fields():
        documented.update(_components(p))
    missing = sorted(known - documented)
    assert not missing, (
        "keys in the parser's known-key lists (core/*.cc) that no field table of "
        "docs/reference/trainingjob.md documents: " + ", ".join(missing))


# ---------------------------------------------------------------- metrics


def code_metrics():
    """{metric: file} of every "kubetrain_..." string literal in the shipped code."""
    found = {}
    for d in ("core", "ps", "worker", "operator", "cli"):
        for f in sorted(glob.glob(os.path.join(ROOT, d, "**", "*.*"), recursive=True)):
            if not f.endswith((".cc", ".h")) or f.endswith("_test.cc") or "testing" in os.path.basename(f):
                continue
            for name in re.findall(r"\"(kubetrain_[a-z0-9_]*[a-z0-9])\"", _read(f)):
                found.setdefault(name, os.path.relpath(f, ROOT))
    return found


def documented_metrics(path=MONITORING):
    """{metric: line} from the first cells of the tables whose header starts with "metric"."""
    found = {}
    in_table = is_metric_table = False
    for n, line in _prose_lines(path):
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table:
            in_table = True
            is_metric_table = _cells(line)[0] == "metric"
            continue
        if is_metric_table:
            for name in re.findall(r"`(kubetrain_\w+)", _cells(line)[0]):
                found[name] = n
    return found


def test_every_metric_in_the_code_is_documented():
    code = code_metrics()
    assert len(code) > 40, sorted(code)
    missing = [f"{m} ({f})" for m, f in sorted(code.items()) if m not in documented_metrics()]
    assert not missing, "registered in the code but not in docs/monitoring.md's metric tables: " + ", ".join(missing)


def test_every_documented_metric_is_in_the_code():
    code = code_metrics()
    unknown = [f"{m} (docs/monitoring.md:{n})" for m, n in sorted(documented_metrics().items()) if m not in code]
    assert not unknown, "in docs/monitoring.md but registered nowhere in the code: " + ", ".join(unknown)


# ---------------------------------------------------------------- links


def _slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for _, line in _prose_lines(path):
        m = re.match(r"^#{1,6} (.*)", line)
        if m:
            s = _slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_relative_links_resolve():
    files = [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    broken = []
    for f in files:
        for n, line in _prose_lines(f):
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
                if re.match(r"[a-z]+:", target):
                    continue
                file_part, _, fragment = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), file_part)) if file_part else f
                where = f"{os.path.relpath(f, ROOT)}:{n}: {target}"
                if not os.path.exists(dest):
                    broken.append(f"{where} (no such file)")
                elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                    broken.append(f"{where} (no heading #{fragment} in {os.path.relpath(dest, ROOT)})")
    assert not broken, "broken links:\n" + "\n".join(broken)
