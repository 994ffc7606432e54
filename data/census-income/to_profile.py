#!/usr/bin/env python3
"""Writes adult.{data,test}.profile.csv.gz: the Census Income records with the 8
categorical columns folded into one multi-valued column, `profile`, a bag of
"column=value" tokens joined by "|" (e.g. "workclass=Private|education=Bachelors|
...|native-country=United-States"; a missing "?" value leaves its token out, so a
record has 5 to 8 tokens). The 5 numeric columns and the label are kept as they are
(fnlwgt dropped). examples/census-income-profile.yaml embeds the bag with one table
and a combiner (sum, mean or sqrtn), as TensorFlow's
embedding_column(categorical_column_with_hash_bucket(...)) does for a
variable-length feature. Deterministic (gzip mtime 0), so
tests/integration/test_multivalued.py checks the committed files against it.

  python3 data/census-income/to_profile.py [out_dir]
"""
import gzip
import os
import sys

import to_libsvm  # the same directory: its column list and its reader of the UCI files

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = [name for name, _ in to_libsvm.COLUMNS]
NUMERIC = [name for name, vocab in to_libsvm.COLUMNS if vocab is None]
CATEGORICAL = [name for name, vocab in to_libsvm.COLUMNS if isinstance(vocab, list)]


def records(name):
    for fields in to_libsvm.records(name):
        yield dict(zip(NAMES + ["income"], fields))


def to_line(r):
    profile = "|".join(f"{c}={r[c]}" for c in CATEGORICAL if r[c] != "?")
    return ",".join([r[c] for c in NUMERIC] + [profile, r["income"].rstrip(".")]) + "\n"


def main(out_dir):
    for name in ("adult.data", "adult.test"):
        text = ",".join(NUMERIC + ["profile", "income"]) + "\n"
        text += "".join(to_line(r) for r in records(name))
        with open(os.path.join(out_dir, name + ".profile.csv.gz"), "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                gz.write(text.encode())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
