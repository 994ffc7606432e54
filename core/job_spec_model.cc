// spec.training.model: a built-in model or a layer list, embeddings and the wide part.
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

namespace kubetrain {
namespace spec_internal {
namespace {

// One entry of spec.training.model.layers; fields depend on its type.
absl::Status ParseLayer(const YAML::Node& node, const std::string& path, LayerSpec* out) {
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(node, path, {}, &f));
  std::string type;
  if (!f.Has("type")) return FieldError(path + ".type", "required");
  KT_RETURN_IF_ERROR(ReadString(f, "type", &type));
  const std::vector<std::string> types = {"dense",     "conv2d",  "maxpool2d",
                                          "avgpool2d", "flatten", "dropout"};
  KT_RETURN_IF_ERROR(CheckOneOf(path + ".type", type, types));
  out->type = *LayerTypeFromName(type);
  std::vector<std::string> known = {"type"};
  switch (out->type) {
    case LayerType::kDense:
      known.insert(known.end(), {"units", "activation"});
      break;
    case LayerType::kConv2D:
      known.insert(known.end(), {"filters", "kernel", "stride", "padding", "activation"});
      break;
    case LayerType::kMaxPool2D:
    case LayerType::kAvgPool2D:
      known.insert(known.end(), {"size", "stride"});
      break;
    case LayerType::kFlatten:
      break;
    case LayerType::kDropout:
      known.push_back("rate");
      break;
  }
  KT_RETURN_IF_ERROR(Fields::Read(node, path, known, &f));
  auto required_int = [&](const std::string& key, int* v) -> absl::Status {
    if (!f.Has(key)) return FieldError(f.PathOf(key), absl::StrCat("required for ", type));
    KT_RETURN_IF_ERROR(ReadInt32(f, key, v));
    return CheckRange(f.PathOf(key), *v, 1, kMaxHiddenUnits);
  };
  if (f.Has("activation")) {
    std::string a;
    KT_RETURN_IF_ERROR(ReadString(f, "activation", &a));
    KT_RETURN_IF_ERROR(
        CheckOneOf(f.PathOf("activation"), a, {"relu", "tanh", "sigmoid", "linear"}));
    out->activation = *ActivationFromName(a);
  }
  switch (out->type) {
    case LayerType::kDense:
      return required_int("units", &out->units);
    case LayerType::kConv2D: {
      KT_RETURN_IF_ERROR(required_int("filters", &out->filters));
      KT_RETURN_IF_ERROR(required_int("kernel", &out->kernel));
      out->stride = 1;
      KT_RETURN_IF_ERROR(ReadInt32(f, "stride", &out->stride));
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("stride"), out->stride, 1, kMaxHiddenUnits));
      std::string padding = "valid";
      KT_RETURN_IF_ERROR(ReadString(f, "padding", &padding));
      KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("padding"), padding, {"same", "valid"}));
      out->same_padding = padding == "same";
      return absl::OkStatus();
    }
    case LayerType::kMaxPool2D:
    case LayerType::kAvgPool2D:
      out->kernel = 2;
      KT_RETURN_IF_ERROR(ReadInt32(f, "size", &out->kernel));
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("size"), out->kernel, 1, kMaxHiddenUnits));
      out->stride = out->kernel;
      KT_RETURN_IF_ERROR(ReadInt32(f, "stride", &out->stride));
      return CheckRange(f.PathOf("stride"), out->stride, 1, kMaxHiddenUnits);
    case LayerType::kFlatten:
      return absl::OkStatus();
    case LayerType::kDropout:
      if (!f.Has("rate")) return FieldError(f.PathOf("rate"), "required for dropout");
      KT_RETURN_IF_ERROR(ReadDouble(f, "rate", &out->rate));
      if (!(out->rate >= 0 && out->rate < 1)) {
        return FieldError(f.PathOf("rate"), absl::StrCat("must be in [0, 1), got ", out->rate));
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// A table's maxRows (dynamic columns; checked against the column in
// Model::Create and against the batch in ValidateTraining).
absl::Status ReadMaxRows(const Fields& f, int64_t* out) {
  if (!f.Has("maxRows")) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadInt64(f, "maxRows", out));
  if (*out >= 1) return absl::OkStatus();
  return FieldError(f.PathOf("maxRows"), absl::StrCat("must be >= 1, got ", *out));
}

// model.embeddings and model.wide (the columns are checked against the
// dataset in ConnectModelToDataset).
absl::Status ParseSparseFeatures(const Fields& f, ModelSpec* out,
                                 std::optional<OptimizerSpec>* wide_optimizer) {
  if (const YAML::Node* n = f.Get("embeddings")) {
    const std::string path = f.PathOf("embeddings");
    if (!n->IsSequence()) return TypeError(path, "a list of embeddings", *n);
    for (size_t i = 0; i < n->size(); ++i) {
      const std::string epath = absl::StrCat(path, "[", i, "]");
      Fields e;
      KT_RETURN_IF_ERROR(
          Fields::Read((*n)[i], epath, {"column", "dim", "combiner", "maxRows"}, &e));
      EmbeddingSpec emb;
      if (!e.Has("column")) return FieldError(e.PathOf("column"), "required");
      KT_RETURN_IF_ERROR(ReadString(e, "column", &emb.column));
      if (!e.Has("dim")) return FieldError(e.PathOf("dim"), "required");
      KT_RETURN_IF_ERROR(ReadInt32(e, "dim", &emb.dim));
      KT_RETURN_IF_ERROR(CheckRange(e.PathOf("dim"), emb.dim, 1, kMaxHiddenUnits));
      std::string combiner = "mean";
      KT_RETURN_IF_ERROR(ReadString(e, "combiner", &combiner));
      KT_RETURN_IF_ERROR(CheckOneOf(e.PathOf("combiner"), combiner, {"sum", "mean", "sqrtn"}));
      emb.combiner = *CombinerFromName(combiner);
      KT_RETURN_IF_ERROR(ReadMaxRows(e, &emb.max_rows));
      for (const EmbeddingSpec& other : out->embeddings) {
        if (other.column == emb.column) {
          return FieldError(e.PathOf("column"),
                            absl::StrCat("column ", Quote(emb.column), " is embedded twice"));
        }
      }
      out->embeddings.push_back(emb);
    }
  }
  Fields w;
  bool present;
  KT_RETURN_IF_ERROR(
      ReadSection(f, "wide", {"columns", "crossed", "optimizer", "maxRows"}, &w, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadStringList(w, "columns", &out->wide.columns));
  KT_RETURN_IF_ERROR(ReadMaxRows(w, &out->wide.max_rows));
  for (size_t i = 0; i < out->wide.columns.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (out->wide.columns[i] == out->wide.columns[j]) {
        return FieldError(absl::StrCat(w.PathOf("columns"), "[", i, "]"),
                          absl::StrCat("duplicate column ", Quote(out->wide.columns[i])));
      }
    }
  }
  if (const YAML::Node* n = w.Get("crossed")) {
    const std::string path = w.PathOf("crossed");
    if (!n->IsSequence()) return TypeError(path, "a list of crossed columns", *n);
    for (size_t i = 0; i < n->size(); ++i) {
      const std::string cpath = absl::StrCat(path, "[", i, "]");
      Fields c;
      KT_RETURN_IF_ERROR(Fields::Read((*n)[i], cpath, {"columns", "hashBuckets"}, &c));
      CrossedSpec x;
      if (!c.Has("columns")) return FieldError(c.PathOf("columns"), "required");
      KT_RETURN_IF_ERROR(ReadStringList(c, "columns", &x.columns));
      if (x.columns.size() < 2) {
        return FieldError(
            c.PathOf("columns"),
            absl::StrCat("a crossed column needs 2 or more columns, got ", x.columns.size()));
      }
      if (!c.Has("hashBuckets")) return FieldError(c.PathOf("hashBuckets"), "required");
      int64_t buckets = 0;
      KT_RETURN_IF_ERROR(ReadInt64(c, "hashBuckets", &buckets));
      KT_RETURN_IF_ERROR(CheckRange<int64_t>(c.PathOf("hashBuckets"), buckets, 1, 1 << 24));
      x.hash_buckets = buckets;
      out->wide.crossed.push_back(x);
    }
  }
  if (out->wide.empty()) {
    return FieldError(w.path(), "needs columns or crossed (the wide part's sparse columns)");
  }
  if (w.Has("optimizer")) {
    OptimizerSpec opt;
    KT_RETURN_IF_ERROR(ParseOptimizer(w, &opt));
    *wide_optimizer = opt;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseModel(const Fields& training, ModelSpec* out,
                        std::optional<OptimizerSpec>* wide_optimizer) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(training, "model",
                                 {"type", "hiddenUnits", "layers", "head", "embeddings", "wide"},
                                 &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadString(f, "type", &out->type));
  if (const YAML::Node* n = f.Get("hiddenUnits")) {
    std::string path = f.PathOf("hiddenUnits");
    if (!n->IsSequence()) return TypeError(path, "a list of integers", *n);
    out->hidden_units.clear();
    for (size_t i = 0; i < n->size(); ++i) {
      int units;
      KT_RETURN_IF_ERROR(ToInt32((*n)[i], absl::StrCat(path, "[", i, "]"), &units));
      out->hidden_units.push_back(units);
    }
  }
  if (const YAML::Node* n = f.Get("layers")) {
    const std::string path = f.PathOf("layers");
    if (f.Has("type") && out->type != "layers") {
      return FieldError(path, absl::StrCat("cannot be set with type ", Quote(out->type),
                                           " (a layer list is type \"layers\"; omit type)"));
    }
    if (!n->IsSequence()) return TypeError(path, "a list of layers", *n);
    if (n->size() == 0) return FieldError(path, "needs at least one layer");
    out->type = "layers";
    out->layers.clear();
    for (size_t i = 0; i < n->size(); ++i) {
      LayerSpec layer;
      KT_RETURN_IF_ERROR(ParseLayer((*n)[i], absl::StrCat(path, "[", i, "]"), &layer));
      out->layers.push_back(layer);
    }
  }
  if (f.Has("head")) {
    std::string head;
    KT_RETURN_IF_ERROR(ReadString(f, "head", &head));
    KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("head"), head,
                                  {"softmax", "sigmoid", "meanSquaredError", "wideAndDeep"}));
    out->head = *HeadTypeFromName(head);
    if (out->type != "layers") {
      return FieldError(f.PathOf("head"), "only applies to a layer list (model.layers)");
    }
  }
  if ((f.Has("embeddings") || f.Has("wide")) && out->type != "layers") {
    return FieldError(f.PathOf(f.Has("embeddings") ? "embeddings" : "wide"),
                      "only applies to a layer list (model.layers)");
  }
  KT_RETURN_IF_ERROR(ParseSparseFeatures(f, out, wide_optimizer));
  if (out->head == HeadType::kWideAndDeep && out->wide.empty()) {
    return FieldError(f.PathOf("wide"), "required for head wideAndDeep");
  }
  if (!out->wide.empty() && out->head != HeadType::kWideAndDeep) {
    return FieldError(f.PathOf("head"), absl::StrCat("must be wideAndDeep with a wide part, got ",
                                                     HeadTypeName(out->head)));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const ModelSpec& model) {
  const std::string path = "spec.training.model";
  KT_RETURN_IF_ERROR(CheckOneOf(path + ".type", model.type, {"softmax", "mlp", "layers"}));
  const std::string units_path = path + ".hiddenUnits";
  if (model.type == "softmax" && !model.hidden_units.empty()) {
    return FieldError(units_path, "must be empty for type softmax (a single 784 -> 10 layer)");
  }
  if (model.type == "mlp" && model.hidden_units.empty()) {
    return FieldError(units_path, "required for type mlp (at least one hidden layer)");
  }
  if (model.type == "layers" && !model.hidden_units.empty()) {
    return FieldError(units_path, "only applies to type mlp (use dense layers in model.layers)");
  }
  if (model.type == "layers" && model.layers.empty()) {
    return FieldError(path + ".layers", "required for type layers");
  }
  for (size_t i = 0; i < model.hidden_units.size(); ++i) {
    KT_RETURN_IF_ERROR(CheckRange(absl::StrCat(units_path, "[", i, "]"), model.hidden_units[i], 1,
                                  kMaxHiddenUnits));
  }
  // The model library is the authority on what it can build; its errors on
  // a layer start with "layers[i]: " and become that field's path.
  absl::StatusOr<Model> created = Model::Create(model);
  if (!created.ok()) {
    const absl::string_view message = created.status().message();
    if (absl::StartsWith(message, "layers") || absl::StartsWith(message, "embeddings[") ||
        absl::StartsWith(message, "wide")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".", message));
    }
    return FieldError(path, message);
  }
  return absl::OkStatus();
}

// A dynamic table's bound per PS task, ceil(maxRows / PS tasks), must hold
// the distinct ids one batch can look up in it: they may all live on one
// task, and a bound below them would evict rows of the very step that
// uses them.
absl::Status ValidateMaxRows(const TrainingJob& job) {
  const TrainingSpec& t = job.training;
  const int num_ps = std::max(1, job.num_ps());
  auto check = [&](const std::string& column, int64_t max_rows,
                   const std::string& field) -> absl::Status {
    if (max_rows <= 0) return absl::OkStatus();
    for (const SparseInput& in : t.model.sparse_inputs) {
      if (in.column != column || !in.dynamic) continue;
      const int64_t batch_ids = int64_t{t.batch_size} * in.slots;
      const int64_t per_task = (max_rows + num_ps - 1) / num_ps;
      if (per_task >= batch_ids) return absl::OkStatus();
      return FieldError(
          field,
          absl::StrCat(max_rows, " rows over ", num_ps, " PS task", num_ps > 1 ? "s" : "",
                       " is at most ", per_task, " per task, fewer than the ", batch_ids,
                       " distinct ids one batch can look up in it (batchSize ", t.batch_size, " x ",
                       in.slots, " per example), which may all live on one task; use at least ",
                       (batch_ids - 1) * num_ps + 1, " or a smaller batchSize"));
    }
    return absl::OkStatus();
  };
  const std::string path = "spec.training.model";
  for (size_t i = 0; i < t.model.embeddings.size(); ++i) {
    KT_RETURN_IF_ERROR(check(t.model.embeddings[i].column, t.model.embeddings[i].max_rows,
                             absl::StrCat(path, ".embeddings[", i, "].maxRows")));
  }
  for (const std::string& column : t.model.wide.columns) {
    KT_RETURN_IF_ERROR(check(column, t.model.wide.max_rows, path + ".wide.maxRows"));
  }
  return absl::OkStatus();
}

}  // namespace spec_internal

}  // namespace kubetrain
