#!/usr/bin/env python3
"""Writes adult.{data,test}.libsvm.gz: the Census Income CSV files in LIBSVM
format (examples/census-income-libsvm.yaml), the way LIBSVM's "a9a" set was
made: every categorical value one-hot (vocabularies from adult.names, a
missing "?" sets none), the 5 numeric columns scaled to [0, 1] with the
training file's min and max (fnlwgt left out), labels +1 (>50K) / -1, indices
1-based and ascending, zero features omitted. Deterministic (gzip mtime 0), so
tests/integration/test_libsvm.py can check the committed files against it.

  python3 data/census-income/to_libsvm.py [out_dir]
"""
import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
COLUMNS = [  # (name, vocabulary or None for numeric, or "ignore")
    ("age", None),
    ("workclass", ["Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                   "State-gov", "Without-pay", "Never-worked"]),
    ("fnlwgt", "ignore"),
    ("education", ["Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                   "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th",
                   "Doctorate", "5th-6th", "Preschool"]),
    ("education-num", None),
    ("marital-status", ["Married-civ-spouse", "Divorced", "Never-married", "Separated",
                        "Widowed", "Married-spouse-absent", "Married-AF-spouse"]),
    ("occupation", ["Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                    "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                    "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                    "Armed-Forces"]),
    ("relationship", ["Wife", "Own-child", "Husband", "Not-in-family", "Other-relative",
                      "Unmarried"]),
    ("race", ["White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"]),
    ("sex", ["Female", "Male"]),
    ("capital-gain", None),
    ("capital-loss", None),
    ("hours-per-week", None),
    ("native-country", ["United-States", "Cambodia", "England", "Puerto-Rico", "Canada",
                        "Germany", "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece",
                        "South", "China", "Cuba", "Iran", "Honduras", "Philippines", "Italy",
                        "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal", "Ireland", "France",
                        "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
                        "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia",
                        "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"]),
]
NUM_FEATURES = sum(1 if v is None else (0 if v == "ignore" else len(v)) for _, v in COLUMNS)


def records(name):
    for line in gzip.open(os.path.join(HERE, name + ".gz"), "rt"):
        line = line.strip()
        if not line or line.startswith("|"):
            continue
        fields = [f.strip() for f in line.split(",")]
        assert len(fields) == len(COLUMNS) + 1, line
        yield fields


def scale(train):
    lo, hi = {}, {}
    for fields in train:
        for i, (_, vocab) in enumerate(COLUMNS):
            if vocab is None:
                v = float(fields[i])
                lo[i] = min(lo.get(i, v), v)
                hi[i] = max(hi.get(i, v), v)
    return lo, hi


def to_line(fields, lo, hi):
    out, index = [], 1
    for i, (_, vocab) in enumerate(COLUMNS):
        if vocab == "ignore":
            continue
        if vocab is None:
            v = (float(fields[i]) - lo[i]) / (hi[i] - lo[i])
            if v != 0:
                out.append(f"{index}:{v:.6g}")
            index += 1
        else:
            if fields[i] in vocab:
                out.append(f"{index + vocab.index(fields[i])}:1")
            index += len(vocab)
    label = "+1" if fields[-1].rstrip(".") == ">50K" else "-1"
    return " ".join([label] + out) + "\n"


def main(out_dir):
    lo, hi = scale(records("adult.data"))
    for name in ("adult.data", "adult.test"):
        text = "".join(to_line(f, lo, hi) for f in records(name))
        with open(os.path.join(out_dir, name + ".libsvm.gz"), "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                gz.write(text.encode())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
