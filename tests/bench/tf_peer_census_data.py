"""The CSV features of a wide & deep job exactly as kubetrain computes them, in numpy, for the
TensorFlow side of tests/bench/tf_peer (--example census-wide-deep).

The C++ this mirrors: CsvParser / Scan / Encode (core/tabular.cc), Model::Lookups and CrossIds
(core/model_sparse.cc), Model::InitialValue (core/model.cc). Per record:
- dense: the numeric columns in column order, a missing value ("?") replaced by the training
  mean (missing "mean") or 0 ("zero"), then (x - mean) / stddev in float32 with the training set's
  mean and population stddev (summed in double in file order, rounded to float; 1 when 0);
- ids: per categorical column its vocabulary index, or FNV-1a 64 of the text mod hashBuckets;
  -1 when missing or out of the vocabulary (no row: an all-zero embedding, no wide weight);
- crossed ids: FNV-1a 64 over the member ids, each as 8 little-endian bytes, in the crossed
  column's order, mod its hashBuckets; -1 when a member has no id."""
import gzip
import math

import numpy as np

import tf_peer_replica

WHITESPACE = " \t\n\v\f\r"  # absl::StripAsciiWhitespace
FNV_OFFSET = np.uint64(14695981039346656037)
FNV_PRIME = np.uint64(1099511628211)


def _lines(paths):
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", newline="\n") as f:
            yield from ((path, i + 1, line.rstrip("\n")) for i, line in enumerate(f))


def read_records(data, paths):
    """The records of the files as (numbers, categories, label) per record, where numbers maps a
    numeric column to its float (None: missing) and categories a categorical column to its id."""
    columns = data["columns"]
    missing = set(data["missing_values"])
    out = []
    for path, number, line in _lines(paths):
        if number == 1:  # a file's first line
            header_pending = data["header"]
        if not line.strip(WHITESPACE):
            continue
        if data["comment_prefix"] and line.startswith(data["comment_prefix"]):
            continue
        if header_pending:
            header_pending = False
            continue
        if '"' in line:
            raise ValueError(f"{path}:{number}: quoted fields are not reproduced here")
        fields = [f.strip(WHITESPACE) for f in line.split(data["delimiter"])]
        if len(fields) != len(columns):
            raise ValueError(f"{path}:{number}: expected {len(columns)} fields, got {len(fields)}")
        numbers, ids, label = {}, {}, None
        for col, v in zip(columns, fields):
            kind, name = col["type"], col["name"]
            if kind == "numeric":
                numbers[name] = None if v in missing else float(v)
                if numbers[name] is not None and not math.isfinite(numbers[name]):
                    raise ValueError(f"{path}:{number}: column {name!r}: not a finite number")
            elif kind == "categorical":
                ids[name] = -1 if v in missing else category_id(col, v)
            elif kind == "label":
                if v not in col["classes"]:
                    raise ValueError(f"{path}:{number}: label {v!r} is not one of the classes")
                label = col["classes"][v]
        out.append((numbers, ids, label))
    return out


def category_id(col, value):
    if "hash_buckets" in col:
        return tf_peer_replica.fnv1a64(value) % col["hash_buckets"]
    vocabulary = col["vocabulary"]
    return vocabulary.index(value) if value in vocabulary else -1


def normalisation(data, records):
    """Per numeric column (mean, stddev) as float32, as Scan computes them over the training set."""
    stats = {}
    for col in data["columns"]:
        if col["type"] != "numeric":
            continue
        total = total_sq = 0.0
        n = 0
        for numbers, _, _ in records:
            v = numbers[col["name"]]
            if v is not None:
                total += v
                total_sq += v * v
                n += 1
        mean = total / n if n else 0.0
        var = max(0.0, total_sq / n - mean * mean) if n else 0.0
        stats[col["name"]] = (np.float32(mean), np.float32(math.sqrt(var)) if var > 0 else np.float32(1.0))
    return stats


def features(data, records, stats):
    """(dense float32 [n, numeric columns], ids int64 [n, categorical columns], labels int32 [n]),
    columns in file order."""
    numeric = [c for c in data["columns"] if c["type"] == "numeric"]
    categorical = [c["name"] for c in data["columns"] if c["type"] == "categorical"]
    dense = np.zeros((len(records), len(numeric)), dtype=np.float32)
    for j, col in enumerate(numeric):
        mean, std = stats[col["name"]]
        fill = np.float32(0) if col["missing"] == "zero" else mean
        values = np.array([fill if r[0][col["name"]] is None else np.float32(r[0][col["name"]])
                           for r in records], dtype=np.float32)
        dense[:, j] = (values - mean) / std if col["normalize"] else values
    ids = np.array([[r[1][name] for name in categorical] for r in records], dtype=np.int64)
    labels = np.array([r[2] for r in records], dtype=np.int32)
    return dense, ids.reshape(len(records), len(categorical)), labels


def crossed_ids(member_ids, buckets):
    """CrossIds for single-valued members: member_ids is a list of int64 [n] arrays (-1: none)."""
    h = np.full(len(member_ids[0]), FNV_OFFSET, dtype=np.uint64)
    for ids in member_ids:
        u = ids.astype(np.uint64)
        for b in range(8):
            h ^= (u >> np.uint64(8 * b)) & np.uint64(0xFF)
            h *= FNV_PRIME
    out = (h % np.uint64(buckets)).astype(np.int64)
    out[np.any(np.stack(member_ids) < 0, axis=0)] = -1
    return out


def load(data, crossed):
    """Training and test sets: dicts with dense, ids (by column name), crossed (list of [n]
    arrays in `crossed` order) and labels."""
    train_records = read_records(data, data["train_files"])
    stats = normalisation(data, train_records)
    test_records = read_records(data, data["test_files"])
    names = [c["name"] for c in data["columns"] if c["type"] == "categorical"]
    sets = []
    for records in (train_records, test_records):
        dense, ids, labels = features(data, records, stats)
        by_name = {name: ids[:, j] for j, name in enumerate(names)}
        sets.append({"dense": dense, "ids": by_name, "labels": labels,
                     "crossed": [crossed_ids([by_name[c] for c in x["columns"]], x["hash_buckets"])
                                 for x in crossed]})
    return sets[0], sets[1]


def vocab_size(col):
    return col["hash_buckets"] if "hash_buckets" in col else len(col["vocabulary"])


def initial_table(name, rows, dim, seed):
    """An embedding table's initial value (Model::InitialValue): uniform in +-1/sqrt(dim), drawn
    row-major from the generator keyed by (seed, table name)."""
    limit = 1.0 / math.sqrt(dim)
    rng = tf_peer_replica.Mt19937_64(
        tf_peer_replica.splitmix64(seed ^ tf_peer_replica.splitmix64(tf_peer_replica.fnv1a64(name))))
    uniform01 = (rng.draw(rows * dim) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return ((2.0 * uniform01 - 1.0) * limit).astype(np.float32).reshape(rows, dim)
