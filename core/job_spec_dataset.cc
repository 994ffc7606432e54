// spec.training.dataset: IDX, CSV with columns, libsvm; and what the model takes from it.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_spec.h"
#include "core/job_spec_fields.h"
#include "core/yaml_limits.h"

namespace kubetrain {
namespace spec_internal {
namespace {

// A categorical column's separator and maxValues (a multi-valued column).
absl::Status ParseMultiValued(const Fields& f, ColumnSpec* out) {
  if (!f.Has("separator")) {
    if (f.Has("maxValues")) {
      return FieldError(f.PathOf("maxValues"),
                        "only applies to a multi-valued column (set separator, e.g. \"|\")");
    }
    return absl::OkStatus();
  }
  std::string sep;
  KT_RETURN_IF_ERROR(ReadString(f, "separator", &sep));
  if (sep.size() != 1 || sep == "\"" || sep == "\n" || sep == "\r" || sep == " ") {
    return FieldError(
        f.PathOf("separator"),
        absl::StrCat("must be one character (not a quote, space or newline), got ", Quote(sep)));
  }
  out->separator = sep[0];
  if (!f.Has("maxValues")) {
    return FieldError(f.PathOf("maxValues"),
                      "required with separator: the most values one field may hold (the model "
                      "looks up that many ids per example)");
  }
  KT_RETURN_IF_ERROR(ReadInt32(f, "maxValues", &out->max_values));
  return CheckRange(f.PathOf("maxValues"), out->max_values, 1, 1024);
}

// One entry of spec.training.dataset.columns.
absl::Status ParseColumn(const YAML::Node& node, const std::string& path, ColumnSpec* out) {
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(node, path, {}, &f));
  if (!f.Has("name")) return FieldError(path + ".name", "required");
  KT_RETURN_IF_ERROR(ReadString(f, "name", &out->name));
  if (out->name.empty()) return FieldError(path + ".name", "must not be empty");
  if (!f.Has("type")) return FieldError(path + ".type", "required");
  std::string type;
  KT_RETURN_IF_ERROR(ReadString(f, "type", &type));
  KT_RETURN_IF_ERROR(
      CheckOneOf(path + ".type", type, {"numeric", "categorical", "label", "ignore"}));
  std::vector<std::string> known = {"name", "type"};
  if (type == "numeric") {
    out->type = ColumnType::kNumeric;
    known.insert(known.end(), {"normalize", "missing"});
  } else if (type == "categorical") {
    out->type = ColumnType::kCategorical;
    known.insert(known.end(),
                 {"vocabulary", "hashBuckets", "dynamic", "missing", "separator", "maxValues"});
  } else if (type == "label") {
    out->type = ColumnType::kLabel;
    known.insert(known.end(), {"classes", "numClasses"});
  } else {
    out->type = ColumnType::kIgnore;
  }
  KT_RETURN_IF_ERROR(Fields::Read(node, path, known, &f));
  KT_RETURN_IF_ERROR(ReadBool(f, "normalize", &out->normalize));
  if (f.Has("missing")) {
    KT_RETURN_IF_ERROR(ReadString(f, "missing", &out->missing));
    if (out->type == ColumnType::kNumeric) {
      KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("missing"), out->missing, {"mean", "zero", "error"}));
    } else {
      KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("missing"), out->missing, {"zeros", "error"}));
    }
  }
  if (out->type == ColumnType::kCategorical) {
    KT_RETURN_IF_ERROR(ReadStringList(f, "vocabulary", &out->vocabulary));
    KT_RETURN_IF_ERROR(ReadInt32(f, "hashBuckets", &out->hash_buckets));
    KT_RETURN_IF_ERROR(ReadBool(f, "dynamic", &out->dynamic));
    if (f.Has("vocabulary") + f.Has("hashBuckets") + out->dynamic != 1) {
      return FieldError(path,
                        "a categorical column needs exactly one of vocabulary, hashBuckets or "
                        "dynamic: true");
    }
    KT_RETURN_IF_ERROR(ParseMultiValued(f, out));
    if (f.Has("hashBuckets")) {
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("hashBuckets"), out->hash_buckets, 1, 1 << 20));
    } else if (f.Has("vocabulary")) {
      if (out->vocabulary.empty()) return FieldError(f.PathOf("vocabulary"), "must not be empty");
      std::set<std::string> seen;
      for (size_t i = 0; i < out->vocabulary.size(); ++i) {
        if (!seen.insert(out->vocabulary[i]).second) {
          return FieldError(absl::StrCat(f.PathOf("vocabulary"), "[", i, "]"),
                            absl::StrCat("duplicate value ", Quote(out->vocabulary[i])));
        }
      }
    }
  }
  if (out->type == ColumnType::kLabel) {
    if (f.Has("classes") && f.Has("numClasses")) {
      return FieldError(f.PathOf("numClasses"), "cannot be set together with classes");
    }
    if (const YAML::Node* n = f.Get("classes")) {
      const std::string cpath = f.PathOf("classes");
      if (n->IsSequence()) {
        for (size_t i = 0; i < n->size(); ++i) {
          std::string v;
          KT_RETURN_IF_ERROR(ToString((*n)[i], absl::StrCat(cpath, "[", i, "]"), &v));
          out->classes.emplace_back(v, static_cast<int>(i));
        }
      } else if (n->IsMap()) {
        for (auto it = n->begin(); it != n->end(); ++it) {
          const std::string key = it->first.Scalar();
          int index;
          KT_RETURN_IF_ERROR(ToInt32(it->second, Join(cpath, key), &index));
          KT_RETURN_IF_ERROR(CheckRange(Join(cpath, key), index, 0, 65535));
          out->classes.emplace_back(key, index);
        }
      } else {
        return TypeError(cpath, "a list of values or a mapping value -> class index", *n);
      }
      std::set<std::string> seen;
      for (const auto& [value, index] : out->classes) {
        if (!seen.insert(value).second) {
          return FieldError(cpath, absl::StrCat("duplicate value ", Quote(value)));
        }
      }
      if (out->classes.size() < 2 && n->IsSequence()) {
        return FieldError(cpath, "needs at least 2 classes");
      }
    }
    if (f.Has("numClasses")) {
      KT_RETURN_IF_ERROR(ReadInt32(f, "numClasses", &out->num_classes));
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("numClasses"), out->num_classes, 2, 65536));
    }
  }
  return absl::OkStatus();
}

std::string DatasetKeyFormats(const std::string& key) {
  static const auto* formats =
      new std::map<std::string, std::string>{{"trainFiles", "csv or libsvm"},
                                             {"testPath", "csv or libsvm"},
                                             {"testFiles", "csv or libsvm"},
                                             {"onBadRecord", "csv or libsvm"},
                                             {"header", "csv"},
                                             {"delimiter", "csv"},
                                             {"commentPrefix", "csv"},
                                             {"missingValues", "csv"},
                                             {"columns", "csv"},
                                             {"numFeatures", "libsvm"},
                                             {"indexBase", "libsvm"},
                                             {"labels", "libsvm"},
                                             {"numClasses", "libsvm"},
                                             {"weightedColumn", "libsvm"}};
  auto it = formats->find(key);
  return it == formats->end() ? "" : it->second;
}

// format libsvm's own fields (core/libsvm.h).
absl::Status ParseLibsvmFields(const Fields& f, TabularSpec* t) {
  t->libsvm = true;
  if (!f.Has("numFeatures")) {
    return FieldError(f.PathOf("numFeatures"),
                      "required for format libsvm (the model's input width: the largest feature "
                      "index, plus 1 with indexBase 0)");
  }
  KT_RETURN_IF_ERROR(ReadInt64(f, "numFeatures", &t->num_features));
  KT_RETURN_IF_ERROR(
      CheckRange(f.PathOf("numFeatures"), t->num_features, int64_t{1}, int64_t{1} << 24));
  KT_RETURN_IF_ERROR(ReadInt32(f, "indexBase", &t->index_base));
  if (t->index_base != 0 && t->index_base != 1) {
    return FieldError(f.PathOf("indexBase"), absl::StrCat("must be 0 or 1, got ", t->index_base));
  }
  std::string labels = "binary";
  KT_RETURN_IF_ERROR(ReadString(f, "labels", &labels));
  KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("labels"), labels, {"binary", "classes", "regression"}));
  t->libsvm_labels = labels == "binary"    ? LibsvmLabels::kBinary
                     : labels == "classes" ? LibsvmLabels::kClasses
                                           : LibsvmLabels::kRegression;
  if (t->libsvm_labels == LibsvmLabels::kClasses) {
    if (!f.Has("numClasses"))
      return FieldError(f.PathOf("numClasses"), "required for labels classes");
    KT_RETURN_IF_ERROR(ReadInt32(f, "numClasses", &t->libsvm_classes));
    KT_RETURN_IF_ERROR(CheckRange(f.PathOf("numClasses"), t->libsvm_classes, 2, 65536));
  } else if (f.Has("numClasses")) {
    return FieldError(f.PathOf("numClasses"),
                      absl::StrCat("only applies to labels classes, but labels is ", labels));
  }
  Fields w;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(f, "weightedColumn", {"name", "maxValues"}, &w, &present));
  if (!present) return absl::OkStatus();
  if (!w.Has("name")) return FieldError(w.PathOf("name"), "required");
  KT_RETURN_IF_ERROR(ReadString(w, "name", &t->weighted_column));
  if (t->weighted_column.empty()) return FieldError(w.PathOf("name"), "must not be empty");
  if (!w.Has("maxValues")) {
    return FieldError(w.PathOf("maxValues"),
                      "required: the most features one record may have (the model looks up that "
                      "many ids per example)");
  }
  KT_RETURN_IF_ERROR(ReadInt32(w, "maxValues", &t->weighted_max_values));
  return CheckRange(w.PathOf("maxValues"), t->weighted_max_values, 1, 65536);
}

}  // namespace

const std::vector<std::string>& DatasetKeys() {
  static const auto* keys = new std::vector<std::string>{
      "name",        "path",          "format",        "trainFiles",    "testPath",
      "testFiles",   "header",        "delimiter",     "commentPrefix", "missingValues",
      "onBadRecord", "columns",       "numFeatures",   "indexBase",     "labels",
      "numClasses",  "shuffleBuffer", "weightedColumn"};
  return *keys;
}

absl::Status ParseDatasetFields(const Fields& f, TrainingSpec* out) {
  KT_RETURN_IF_ERROR(ReadString(f, "format", &out->dataset_format));
  KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("format"), out->dataset_format, {"idx", "csv", "libsvm"}));
  for (const std::string& key : DatasetKeys()) {
    const std::string formats = DatasetKeyFormats(key);
    if (f.Has(key) && !formats.empty() &&
        !absl::StrContains(absl::StrCat(" ", formats, " "),
                           absl::StrCat(" ", out->dataset_format, " "))) {
      return FieldError(f.PathOf(key), absl::StrCat("only applies to format ", formats));
    }
  }
  KT_RETURN_IF_ERROR(ReadInt64(f, "shuffleBuffer", &out->shuffle_buffer));
  KT_RETURN_IF_ERROR(
      CheckRange(f.PathOf("shuffleBuffer"), out->shuffle_buffer, int64_t{1}, int64_t{1} << 26));
  if (out->dataset_format == "idx") {
    KT_RETURN_IF_ERROR(ReadString(f, "name", &out->dataset_name));
    KT_RETURN_IF_ERROR(ReadString(f, "path", &out->dataset_path));
    // The default path holds Fashion-MNIST; another dataset must say where it is.
    if (!f.Has("path") && out->dataset_name != "fashion-mnist") {
      return FieldError(f.PathOf("path"),
                        absl::StrCat("required for dataset ", Quote(out->dataset_name)));
    }
    return absl::OkStatus();
  }
  TabularSpec& t = out->tabular;
  out->dataset_name = "";
  KT_RETURN_IF_ERROR(ReadString(f, "name", &out->dataset_name));
  auto files = [&](const char* one, const char* list, std::vector<std::string>* v,
                   std::string* key) {
    if (f.Has(one) == f.Has(list)) {
      return FieldError(f.PathOf(list),
                        absl::StrCat("format ", out->dataset_format, " needs exactly one of ", one,
                                     " (a file or glob) or ", list));
    }
    *key = f.Has(one) ? one : list;
    if (f.Has(one)) {
      std::string p;
      KT_RETURN_IF_ERROR(ReadString(f, one, &p));
      if (p.empty()) return FieldError(f.PathOf(one), "must not be empty");
      *v = {p};
      return absl::OkStatus();
    }
    KT_RETURN_IF_ERROR(ReadStringList(f, list, v));
    if (v->empty()) return FieldError(f.PathOf(list), "must not be empty");
    for (size_t i = 0; i < v->size(); ++i) {
      if ((*v)[i].empty())
        return FieldError(absl::StrCat(f.PathOf(list), "[", i, "]"), "must not be empty");
    }
    return absl::OkStatus();
  };
  KT_RETURN_IF_ERROR(files("path", "trainFiles", &t.train_files, &t.train_files_key));
  KT_RETURN_IF_ERROR(files("testPath", "testFiles", &t.test_files, &t.test_files_key));
  std::string on_bad = "fail";
  KT_RETURN_IF_ERROR(ReadString(f, "onBadRecord", &on_bad));
  KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("onBadRecord"), on_bad, {"fail", "skip"}));
  t.skip_bad_records = on_bad == "skip";
  if (out->dataset_format == "libsvm") return ParseLibsvmFields(f, &t);
  KT_RETURN_IF_ERROR(ReadBool(f, "header", &t.header));
  if (f.Has("delimiter")) {
    std::string d;
    KT_RETURN_IF_ERROR(ReadString(f, "delimiter", &d));
    if (d.size() != 1 || d == "\"" || d == "\n" || d == "\r") {
      return FieldError(
          f.PathOf("delimiter"),
          absl::StrCat("must be one character (not a quote or newline), got ", Quote(d)));
    }
    t.delimiter = d[0];
  }
  KT_RETURN_IF_ERROR(ReadString(f, "commentPrefix", &t.comment_prefix));
  KT_RETURN_IF_ERROR(ReadStringList(f, "missingValues", &t.missing_values));
  const YAML::Node* cols = f.Get("columns");
  const std::string cpath = f.PathOf("columns");
  if (cols == nullptr) return FieldError(cpath, "required for format csv");
  if (!cols->IsSequence()) return TypeError(cpath, "a list of columns", *cols);
  std::set<std::string> names;
  int labels = 0;
  for (size_t i = 0; i < cols->size(); ++i) {
    ColumnSpec c;
    const std::string path = absl::StrCat(cpath, "[", i, "]");
    KT_RETURN_IF_ERROR(ParseColumn((*cols)[i], path, &c));
    if (!names.insert(c.name).second) {
      return FieldError(path + ".name", absl::StrCat("duplicate column name ", Quote(c.name)));
    }
    if (c.separator != 0 && c.separator == t.delimiter) {
      return FieldError(path + ".separator",
                        absl::StrCat("must differ from the dataset's delimiter ",
                                     Quote(std::string(1, t.delimiter))));
    }
    if (c.type == ColumnType::kLabel && ++labels > 1) {
      return FieldError(path + ".type", "only one column can be the label");
    }
    t.columns.push_back(std::move(c));
  }
  if (labels == 0) return FieldError(cpath, "needs a column of type label");
  // A dynamic column is an id, never a feature, but an input all the same.
  const int64_t dim = FeatureDim(t);
  const int64_t inputs = dim + std::count_if(t.columns.begin(), t.columns.end(),
                                             [](const ColumnSpec& c) { return c.dynamic; });
  if (inputs < 1 || dim > (int64_t{1} << 24)) {
    return FieldError(
        cpath, absl::StrCat("the columns give ", dim, " features, must be in [1, 16777216]"));
  }
  return absl::OkStatus();
}

absl::Status ParseDataset(const Fields& training, TrainingSpec* out) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(training, "dataset", DatasetKeys(), &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ParseDatasetFields(f, out));
  // Model files record the section, so eval reads data exactly as training did.
  YAML::Emitter emitter;
  emitter << *training.Get("dataset");
  out->dataset_yaml = emitter.good() ? emitter.c_str() : "";
  return absl::OkStatus();
}

// A libsvm dataset's weightedColumn, as the embeddings and wide columns that
// name it (`uses`: column, field) look it up: ids the feature indices,
// weights their values.
absl::Status ConnectWeightedColumn(const std::vector<std::pair<std::string, std::string>>& uses,
                                   TrainingSpec* t) {
  const TabularSpec& d = t->tabular;
  const std::string wpath = "spec.training.dataset.weightedColumn";
  for (const auto& [name, field] : uses) {
    if (d.weighted_column.empty()) {
      return FieldError(field, absl::StrCat("a libsvm dataset's features are looked up as one "
                                            "weighted column: set ",
                                            wpath, " (e.g. {name: ", name, ", maxValues: 64})"));
    }
    if (name != d.weighted_column) {
      return FieldError(field, absl::StrCat("no column ", Quote(name), "; the libsvm dataset's ",
                                            "weighted column is ", Quote(d.weighted_column)));
    }
    if (absl::StrContains(field, ".crossed[")) {
      return FieldError(field, "a weighted column (a libsvm dataset's features) cannot be crossed");
    }
  }
  if (d.weighted_column.empty()) return absl::OkStatus();
  if (uses.empty()) {
    return FieldError(wpath, absl::StrCat("no spec.training.model.embeddings or model.wide ",
                                          "looks up ", Quote(d.weighted_column)));
  }
  SparseInput in{d.weighted_column, d.num_features, d.weighted_max_values, false};
  in.weighted = true;
  t->model.sparse_inputs.push_back(in);
  return absl::OkStatus();
}

// The model's input shape and classes come from the dataset: IDX images are
// [28, 28, 1] with 10 classes.
// CSV records are [features] with the label column's classes.
absl::Status ConnectModelToDataset(TrainingSpec* t) {
  const std::string mpath = "spec.training.model";
  // Every column an embedding or the wide part names must be a categorical
  // column of the dataset; those columns are read as ids.
  std::vector<std::pair<std::string, std::string>> looked_up;  // column, field
  for (size_t i = 0; i < t->model.embeddings.size(); ++i) {
    looked_up.emplace_back(t->model.embeddings[i].column,
                           absl::StrCat(mpath, ".embeddings[", i, "].column"));
  }
  for (size_t i = 0; i < t->model.wide.columns.size(); ++i) {
    looked_up.emplace_back(t->model.wide.columns[i], absl::StrCat(mpath, ".wide.columns[", i, "]"));
  }
  for (size_t i = 0; i < t->model.wide.crossed.size(); ++i) {
    for (size_t j = 0; j < t->model.wide.crossed[i].columns.size(); ++j) {
      looked_up.emplace_back(t->model.wide.crossed[i].columns[j],
                             absl::StrCat(mpath, ".wide.crossed[", i, "].columns[", j, "]"));
    }
  }
  // A libsvm dataset has one column to look up, its weightedColumn.
  std::vector<std::pair<std::string, std::string>> weighted_uses;
  if (t->tabular.libsvm) weighted_uses.swap(looked_up);
  if (!looked_up.empty() && t->dataset_format != "csv") {
    return FieldError(looked_up[0].second,
                      "embeddings and wide need a csv dataset, or a libsvm dataset's "
                      "weightedColumn");
  }
  for (const auto& [name, field] : looked_up) {
    auto col = std::find_if(t->tabular.columns.begin(), t->tabular.columns.end(),
                            [&](const ColumnSpec& c) { return c.name == name; });
    if (col == t->tabular.columns.end()) {
      return FieldError(
          field, absl::StrCat("no column ", Quote(name), " in spec.training.dataset.columns"));
    }
    if (col->type != ColumnType::kCategorical) {
      return FieldError(field, absl::StrCat("column ", Quote(name), " is ",
                                            col->type == ColumnType::kNumeric ? "numeric"
                                            : col->type == ColumnType::kLabel ? "the label"
                                                                              : "ignored",
                                            "; embeddings and wide columns must be categorical"));
    }
    col->as_ids = true;
  }
  t->model.sparse_inputs.clear();
  for (size_t i = 0; i < t->tabular.columns.size(); ++i) {
    const ColumnSpec& c = t->tabular.columns[i];
    if (c.dynamic && !c.as_ids) {
      return FieldError(
          absl::StrCat("spec.training.dataset.columns[", i, "].dynamic"),
          absl::StrCat("column ", Quote(c.name),
                       " has no vocabulary to one-hot encode: a dynamic column must be looked up "
                       "by spec.training.model.embeddings or model.wide"));
    }
    if (!c.as_ids) continue;
    SparseInput in{c.name, 0, c.max_values, c.dynamic};
    if (!c.dynamic) {
      in.vocab = c.hash_buckets > 0 ? c.hash_buckets : static_cast<int64_t>(c.vocabulary.size());
    }
    t->model.sparse_inputs.push_back(in);
  }
  if (t->tabular.libsvm) KT_RETURN_IF_ERROR(ConnectWeightedColumn(weighted_uses, t));
  if (t->dataset_format != "idx") {
    const int64_t dim = FeatureDim(t->tabular);
    t->model.input_dim = static_cast<int>(dim);
    t->model.input_shape = {static_cast<int>(dim)};
    const int classes = LabelClasses(t->tabular);
    t->model.num_classes = classes;
    const std::string path = "spec.training.model";
    if (classes == 0 && t->model.head != HeadType::kMeanSquaredError) {
      return FieldError(
          t->model.type == "layers" ? path + ".head" : path + ".type",
          absl::StrCat(t->tabular.libsvm ? "the labels are numbers (labels: regression)"
                                         : "the label column is a number (no classes or "
                                           "numClasses)",
                       ": regression needs a layer list with head "
                       "meanSquaredError"));
    }
    if (classes > 0 && t->model.head == HeadType::kMeanSquaredError) {
      return FieldError(path + ".head",
                        t->tabular.libsvm
                            ? "meanSquaredError needs numeric labels (labels: regression)"
                            : "meanSquaredError needs a numeric label (a label column without "
                              "classes or numClasses)");
    }
    return absl::OkStatus();
  }
  if (t->model.type == "layers" && t->model.input_shape.empty()) {
    t->model.input_shape = {28, 28, 1};
  }
  return absl::OkStatus();
}

}  // namespace spec_internal

using namespace spec_internal;  // NOLINT(build/namespaces): this section's helpers

absl::Status ParseDatasetSection(const std::string& yaml_text, TrainingSpec* out) {
  // The section comes from a model file, which anyone may hand to eval.
  if (absl::Status status = CheckAliasExpansion(yaml_text); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.training.dataset: ", status.message()));
  }
  YAML::Node node;
  try {
    node = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec.training.dataset: ", e.what()));
  }
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(node, "spec.training.dataset", DatasetKeys(), &f));
  KT_RETURN_IF_ERROR(ParseDatasetFields(f, out));
  out->dataset_yaml = yaml_text;
  return absl::OkStatus();
}

}  // namespace kubetrain
