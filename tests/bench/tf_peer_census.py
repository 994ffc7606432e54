"""The Census wide & deep job (examples/census-income-wide-deep.yaml) mapped to a plan for the
TensorFlow side of tests/bench/tf_peer: plain Python (no numpy), run by tf_peer.py.

Like tf_peer.plan_from_job for the MLP, this refuses every field it does not map (or know to be
without effect on what is trained), so a new hyper-parameter in the example is never silently left
out of the TensorFlow side. The TensorFlow task reads the CSV files itself (tf_peer_census_data.py)
and builds the model (tf_peer_census_v1.py) from this plan."""
import os

# Fields the mapping reads, per section of spec.training; anything else stops the bench.
MODEL_FIELDS = {"type", "layers", "head", "embeddings", "wide"}
LAYER_FIELDS = {"type", "units", "activation"}
EMBEDDING_FIELDS = {"column", "dim", "combiner"}
WIDE_FIELDS = {"columns", "crossed", "optimizer"}
CROSSED_FIELDS = {"columns", "hashBuckets"}
DATASET_FIELDS = {"format", "name", "trainFiles", "path", "testFiles", "testPath", "commentPrefix",
                  "missingValues", "onBadRecord", "header", "delimiter", "columns"}
COLUMN_FIELDS = {"numeric": {"name", "type", "normalize", "missing"},
                 "categorical": {"name", "type", "vocabulary", "hashBuckets", "missing"},
                 "label": {"name", "type", "classes", "numClasses"},
                 "ignore": {"name", "type"}}
# kubetrain's defaults for what the example leaves out (core/job_spec.h OptimizerSpec).
ADAM_DEFAULTS = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}
ADAGRAD_DEFAULTS = {"initialAccumulator": 0.1, "epsilon": 1e-7}


def _refuse_unknown(section, allowed, where):
    unknown = set(section) - set(allowed)
    if unknown:
        raise ValueError(f"{where}: fields with no TensorFlow mapping here: {sorted(unknown)}")


def _optimizer(spec, kind, defaults, where):
    spec = dict(spec or {})
    _refuse_unknown(spec, {"type", "learningRate", *defaults}, where)
    if spec.get("type") != kind:
        raise ValueError(f"{where}: type {spec.get('type')!r}: only {kind} is mapped here")
    return {"type": kind, "learning_rate": spec.get("learningRate", 0.01),
            **{k: spec.get(k, v) for k, v in defaults.items()}}


def _columns(dataset, looked_up):
    out = []
    for c in dataset["columns"]:
        kind = c.get("type", "numeric")
        if kind not in COLUMN_FIELDS:
            raise ValueError(f"column {c.get('name')!r}: type {kind!r} is not mapped")
        _refuse_unknown(c, COLUMN_FIELDS[kind], f"dataset.columns[{c['name']}]")
        col = {"name": c["name"], "type": kind}
        if kind == "numeric":
            col["normalize"] = bool(c.get("normalize", False))
            col["missing"] = c.get("missing", "mean")
            if col["missing"] not in ("mean", "zero"):
                raise ValueError(f"column {c['name']!r}: missing {col['missing']!r} is not mapped")
        elif kind == "categorical":
            if c["name"] not in looked_up:
                # kubetrain would make it a one-hot block of dense features: not mapped here.
                raise ValueError(f"column {c['name']!r}: a categorical column no embedding or wide "
                                 "column looks up is not mapped")
            if c.get("missing", "zeros") != "zeros":
                raise ValueError(f"column {c['name']!r}: missing {c['missing']!r} is not mapped")
            if "vocabulary" in c:
                col["vocabulary"] = list(c["vocabulary"])
            else:
                col["hash_buckets"] = int(c["hashBuckets"])
        elif kind == "label":
            if "classes" not in c:
                raise ValueError(f"column {c['name']!r}: only a label with classes is mapped")
            col["classes"] = dict(c["classes"])
            if sorted(set(col["classes"].values())) != [0, 1]:
                raise ValueError(f"column {c['name']!r}: the wideAndDeep head needs classes 0 and 1")
        out.append(col)
    return out


def plan_from_census_job(job, target_steps, root):
    """The TensorFlow side's plan for a wideAndDeep TrainingJob over a CSV dataset (a parsed YAML
    mapping); target_steps as `kubetrain validate` reports them; root: where relative data paths
    start (the repository root, as for `kubetrain run`)."""
    spec = job["spec"]
    training = spec["training"]
    replicas = spec["replicaSpecs"]
    workers = replicas["Worker"].get("replicas", 1)
    model = training["model"]
    _refuse_unknown(model, MODEL_FIELDS, "model")
    if model.get("type", "layers") != "layers" or model.get("head") != "wideAndDeep":
        raise ValueError("only a layer list with head wideAndDeep is mapped here")
    layers = []
    for i, layer in enumerate(model["layers"]):
        _refuse_unknown(layer, LAYER_FIELDS, f"model.layers[{i}]")
        activation = layer.get("activation", "linear")
        if layer.get("type") != "dense" or activation not in ("relu", "linear"):
            raise ValueError(f"model.layers[{i}]: only dense layers with relu or linear are mapped")
        layers.append({"units": int(layer["units"]), "activation": activation})
    embeddings = []
    for i, e in enumerate(model.get("embeddings", [])):
        _refuse_unknown(e, EMBEDDING_FIELDS, f"model.embeddings[{i}]")
        if e.get("combiner", "mean") != "mean":
            raise ValueError(f"model.embeddings[{i}]: combiner {e['combiner']!r}: only mean is mapped")
        embeddings.append({"column": e["column"], "dim": int(e["dim"])})
    wide = model["wide"]
    _refuse_unknown(wide, WIDE_FIELDS, "model.wide")
    crossed = []
    for i, x in enumerate(wide.get("crossed", [])):
        _refuse_unknown(x, CROSSED_FIELDS, f"model.wide.crossed[{i}]")
        crossed.append({"columns": list(x["columns"]), "hash_buckets": int(x["hashBuckets"])})
    dataset = training["dataset"]
    _refuse_unknown(dataset, DATASET_FIELDS, "dataset")
    if dataset.get("format") != "csv" or dataset.get("onBadRecord", "fail") != "fail":
        raise ValueError("only format csv with onBadRecord fail is mapped")
    looked_up = {e["column"] for e in embeddings} | set(wide.get("columns", []))
    looked_up |= {c for x in crossed for c in x["columns"]}
    files = {key: [os.path.join(root, p) for p in (dataset[key] if key.endswith("Files") else [dataset[key]])]
             for key in ("trainFiles", "path", "testFiles", "testPath") if key in dataset}
    mode = training.get("mode", "sync")
    return {
        "name": job["metadata"]["name"],
        "example": "census",
        "mode": mode,
        "replicas_to_aggregate": training.get("replicasToAggregate", workers) if mode == "sync" else 1,
        "max_staleness": training.get("maxStaleness"),
        "ps": replicas["PS"].get("replicas", 1),
        "workers": workers,
        "data": {
            "train_files": files.get("trainFiles", files.get("path")),
            "test_files": files.get("testFiles", files.get("testPath")),
            "comment_prefix": dataset.get("commentPrefix", ""),
            "missing_values": list(dataset.get("missingValues", ["?", ""])),
            "header": bool(dataset.get("header", False)),
            "delimiter": dataset.get("delimiter", ","),
            "columns": _columns(dataset, looked_up),
        },
        "model": {"layers": layers, "embeddings": embeddings,
                  "wide": {"columns": list(wide.get("columns", [])), "crossed": crossed}},
        "optimizer": _optimizer(training.get("optimizer"), "adam", ADAM_DEFAULTS, "optimizer"),
        "wide_optimizer": (_optimizer(wide["optimizer"], "adagrad", ADAGRAD_DEFAULTS, "model.wide.optimizer")
                           if "optimizer" in wide else None),
        "batch_size": training.get("batchSize", 100),
        "target_steps": target_steps,
        "seed": training.get("seed", 1),
        "eval_every_steps": training.get("evaluation", {}).get("everySteps", 0),
    }
