#include "core/model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/hash.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kubetrain {
namespace {

using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

// Hand-rolled uniform in [0, 1): std::uniform_real_distribution's output is
// implementation-defined, which would break cross-platform determinism.
double Uniform01(std::mt19937_64* rng) { return static_cast<double>((*rng)() >> 11) * 0x1.0p-53; }

// Adds the bias row to every row of z.
void AddBias(const std::vector<float>& bias, RowMatrix* z) {
  z->rowwise() += ConstRowVectorMap(bias.data(), z->cols());
}

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

Model::Model(ModelSpec spec) : spec_(std::move(spec)) {}

void Model::SetThreads(int threads) {
  if (threads <= 1) {
    pool_.reset();
  } else if (this->threads() != threads) {
    pool_ = std::make_shared<ThreadPool>(threads);
  }
}

absl::StatusOr<Model> Model::Create(const ModelSpec& spec) {
  Model m(spec);
  auto dense = [](int units, Activation a) {
    LayerSpec l;
    l.type = LayerType::kDense;
    l.units = units;
    l.activation = a;
    return l;
  };
  std::vector<LayerSpec> layers;
  const bool has_sparse =
      !spec.sparse_inputs.empty() || !spec.embeddings.empty() || !spec.wide.empty();
  if (spec.type == "softmax" || spec.type == "mlp") {
    if (spec.type == "softmax" && !spec.hidden_units.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model type \"softmax\" takes no hidden_units, got [",
                       absl::StrJoin(spec.hidden_units, ","), "]"));
    }
    if (spec.type == "mlp" && spec.hidden_units.empty()) {
      return absl::InvalidArgumentError("model type \"mlp\" needs at least one hidden_units entry");
    }
    for (size_t i = 0; i < spec.hidden_units.size(); ++i) {
      if (spec.hidden_units[i] <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("model type \"mlp\": hidden_units[", i,
                                                       "] is ", spec.hidden_units[i],
                                                       ", must be > 0"));
      }
      layers.push_back(dense(spec.hidden_units[i], Activation::kRelu));
    }
    if (spec.input_dim <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_dim is ", spec.input_dim, ", must be > 0"));
    }
    if (spec.num_classes < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_classes is ", spec.num_classes, ", must be >= 2"));
    }
    if (spec.head != HeadType::kSoftmax) {
      return absl::InvalidArgumentError(
          absl::StrCat("model type \"", spec.type, "\" has a softmax head, got ",
                       HeadTypeName(spec.head), " (use a layer list)"));
    }
    layers.push_back(dense(spec.num_classes, Activation::kLinear));
    m.input_shape_ = {spec.input_dim};
  } else if (spec.type == "layers") {
    if (spec.layers.empty()) return absl::InvalidArgumentError("layers: needs at least one layer");
    layers = spec.layers;
    m.input_shape_ = spec.input_shape.empty() ? Shape{spec.input_dim} : spec.input_shape;
    if (m.input_shape_.size() != 1 && m.input_shape_.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the input shape must be [d] or [h, w, c], got ", ShapeString(m.input_shape_)));
    }
    for (int d : m.input_shape_) {
      // A sparse model's deep tower may take only embeddings.
      if (d < 0 || (d == 0 && !has_sparse)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the input shape must be positive, got ", ShapeString(m.input_shape_)));
      }
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model type \"", spec.type, "\" (expected \"softmax\", \"mlp\" or \"layers\")"));
  }

  std::vector<VariableSpec> table_vars;  // appended after the layers' variables
  if (has_sparse) {
    if (spec.type != "layers") {
      return absl::InvalidArgumentError("embeddings and wide need a layer list (model.layers)");
    }
    if (m.input_shape_.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("embeddings and wide need a 1-D input, got ", ShapeString(m.input_shape_)));
    }
    for (size_t i = 0; i < spec.sparse_inputs.size(); ++i) {
      const SparseInput& in = spec.sparse_inputs[i];
      if ((in.vocab < 1 && !in.dynamic) || in.slots < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("column '", in.column, "': a looked-up column needs ids and slots"));
      }
      m.slot_offset_.push_back(m.id_slots_);
      m.id_slots_ += in.slots;
    }
    m.dense_dim_ = m.input_shape_[0];
    int64_t deep = m.dense_dim_;
    auto input_of = [&](const std::string& column,
                        const std::string& field) -> absl::StatusOr<int> {
      const int k = m.SparseInputIndex(column);
      if (k < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": '", column, "' is not a categorical column of the dataset"));
      }
      return k;
    };
    // A table over input k: fixed [vocab, cols], or dynamic (rows 0).
    auto table_over = [&](int k, std::string name, int64_t cols, int64_t max_rows) {
      const SparseInput& in = spec.sparse_inputs[k];
      VariableSpec v{std::move(name), in.dynamic ? 0 : in.vocab, cols};
      v.table = true;
      v.dynamic = in.dynamic;
      v.max_rows = in.dynamic ? max_rows : 0;
      return v;
    };
    for (size_t e = 0; e < spec.embeddings.size(); ++e) {
      const EmbeddingSpec& emb = spec.embeddings[e];
      const std::string field = absl::StrCat("embeddings[", e, "]");
      auto k = input_of(emb.column, field + ".column");
      if (!k.ok()) return k.status();
      if (emb.dim <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".dim: must be > 0, got ", emb.dim));
      }
      if (emb.max_rows < 0 || (emb.max_rows > 0 && !spec.sparse_inputs[*k].dynamic)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".maxRows: ",
            emb.max_rows < 0 ? absl::StrCat("must be >= 1, got ", emb.max_rows)
                             : absl::StrCat("only applies to a dynamic column; '", emb.column,
                                            "' has a vocabulary or hash buckets")));
      }
      table_vars.push_back(table_over(*k, "embedding." + emb.column, emb.dim, emb.max_rows));
      m.table_uses_.push_back({{*k}, static_cast<int>(e), 0});
      deep += emb.dim;
    }
    if (!spec.wide.empty() && spec.head != HeadType::kWideAndDeep) {
      return absl::InvalidArgumentError(
          absl::StrCat("wide: needs head wideAndDeep, got ", HeadTypeName(spec.head)));
    }
    if (spec.head == HeadType::kWideAndDeep && spec.wide.empty()) {
      return absl::InvalidArgumentError(
          "head wideAndDeep needs a wide part (model.wide.columns or model.wide.crossed)");
    }
    bool wide_dynamic = false;
    for (size_t c = 0; c < spec.wide.columns.size(); ++c) {
      auto k = input_of(spec.wide.columns[c], absl::StrCat("wide.columns[", c, "]"));
      if (!k.ok()) return k.status();
      VariableSpec v = table_over(*k, "wide." + spec.wide.columns[c], 1, spec.wide.max_rows);
      v.wide = true;
      wide_dynamic = wide_dynamic || v.dynamic;
      table_vars.push_back(v);
      m.table_uses_.push_back({{*k}, -1, 0});
    }
    if (spec.wide.max_rows < 0 || (spec.wide.max_rows > 0 && !wide_dynamic)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wide.maxRows: ", spec.wide.max_rows < 0
                                ? absl::StrCat("must be >= 1, got ", spec.wide.max_rows)
                                : "only applies to wide.columns that are dynamic, and none is"));
    }
    for (size_t c = 0; c < spec.wide.crossed.size(); ++c) {
      const CrossedSpec& x = spec.wide.crossed[c];
      const std::string field = absl::StrCat("wide.crossed[", c, "]");
      if (x.columns.size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".columns: a crossed column needs 2 or more columns, got ", x.columns.size()));
      }
      if (x.hash_buckets <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".hashBuckets: must be > 0, got ", x.hash_buckets));
      }
      TableUse use;
      use.buckets = x.hash_buckets;
      for (size_t j = 0; j < x.columns.size(); ++j) {
        auto k = input_of(x.columns[j], absl::StrCat(field, ".columns[", j, "]"));
        if (!k.ok()) return k.status();
        if (spec.sparse_inputs[*k].weighted) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".columns[", j, "]: '", x.columns[j],
                           "' is a weighted column (a libsvm dataset's features), which "
                           "cannot be crossed"));
        }
        use.inputs.push_back(*k);
      }
      VariableSpec v{"wide." + x.name(), x.hash_buckets, 1};
      v.table = v.wide = true;
      table_vars.push_back(v);
      m.table_uses_.push_back(use);
    }
    if (deep == 0) {
      return absl::InvalidArgumentError(
          "the deep tower has no input (no dense features, no embeddings)");
    }
    m.input_shape_ = {static_cast<int>(deep)};
  } else if (spec.head == HeadType::kWideAndDeep) {
    return absl::InvalidArgumentError(
        "head wideAndDeep needs a wide part (model.wide.columns or model.wide.crossed)");
  }

  const bool legacy = spec.type != "layers";
  Shape shape = m.input_shape_;
  for (size_t i = 0; i < layers.size(); ++i) {
    Op op;
    op.layer = layers[i];
    op.in = shape;
    auto out = OutputShape(op.layer, shape);
    if (!out.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("layers[", i, "]: ", out.status().message()));
    }
    op.out = *out;
    if (op.in.size() == 3 &&
        (op.layer.type == LayerType::kConv2D || op.layer.type == LayerType::kMaxPool2D ||
         op.layer.type == LayerType::kAvgPool2D)) {
      op.window = MakeWindowGeometry(op.layer, op.in);
    }
    if (HasVariables(op.layer.type)) {
      const std::string prefix =
          legacy ? absl::StrCat("dense", i, "/") : absl::StrCat("layers.", i, ".");
      const int64_t out_channels =
          op.layer.type == LayerType::kDense ? op.layer.units : op.layer.filters;
      const int64_t rows = op.layer.type == LayerType::kDense ? op.in[0] : op.window.patch_size();
      op.kernel = static_cast<int>(m.variables_.size());
      m.variables_.push_back({prefix + "kernel", rows, out_channels});
      op.bias = static_cast<int>(m.variables_.size());
      m.variables_.push_back({prefix + "bias", 1, out_channels});
    }
    shape = op.out;
    m.ops_.push_back(std::move(op));
  }
  if (!legacy) {
    const std::string last = absl::StrCat("layers[", layers.size() - 1, "]: ");
    const LayerSpec& tail = layers.back();
    if (tail.type != LayerType::kDense || tail.activation != Activation::kLinear) {
      return absl::InvalidArgumentError(
          absl::StrCat(last, "the last layer must be a dense layer with activation linear (the ",
                       HeadTypeName(spec.head), " head applies its own function), got ",
                       LayerTypeName(tail.type),
                       tail.type == LayerType::kDense
                           ? absl::StrCat(" with activation ", ActivationName(tail.activation))
                           : ""));
    }
    int want = 1;
    std::string why = "one output";
    if (spec.head == HeadType::kSoftmax) {
      if (spec.num_classes < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the softmax head needs >= 2 classes, the labels have ", spec.num_classes));
      }
      want = spec.num_classes;
      why = absl::StrCat("one unit per class of the labels (", spec.num_classes, ")");
    } else if ((spec.head == HeadType::kSigmoid || spec.head == HeadType::kWideAndDeep) &&
               spec.num_classes != 2) {
      return absl::InvalidArgumentError(absl::StrCat("the ", HeadTypeName(spec.head),
                                                     " head needs binary labels (2 classes), the "
                                                     "labels have ",
                                                     spec.num_classes));
    }
    if (tail.units != want) {
      return absl::InvalidArgumentError(absl::StrCat(last, "dense has ", tail.units, " units, the ",
                                                     HeadTypeName(spec.head), " head needs ", want,
                                                     ": ", why));
    }
  }
  for (VariableSpec& v : table_vars) {
    m.tables_.push_back(static_cast<int>(m.variables_.size()));
    m.variables_.push_back(std::move(v));
  }
  if (spec.head == HeadType::kWideAndDeep) {
    m.wide_bias_ = static_cast<int>(m.variables_.size());
    m.variables_.push_back({"wide.bias", 1, 1});
  }
  return m;
}

bool Model::has_dropout() const {
  return std::any_of(ops_.begin(), ops_.end(),
                     [](const Op& op) { return op.layer.type == LayerType::kDropout; });
}

std::string Model::Summary() const {
  if (spec_.type != "layers") {
    std::vector<int> dims;
    dims.push_back(spec_.input_dim);
    dims.insert(dims.end(), spec_.hidden_units.begin(), spec_.hidden_units.end());
    dims.push_back(spec_.num_classes);
    return absl::StrCat(spec_.type, " ", absl::StrJoin(dims, "-"));
  }
  std::vector<std::string> parts = {ShapeString(input_shape_)};
  for (const Op& op : ops_) {
    const LayerSpec& l = op.layer;
    switch (l.type) {
      case LayerType::kDense:
        parts.push_back(absl::StrCat("dense(", l.units,
                                     l.activation == Activation::kLinear
                                         ? ""
                                         : absl::StrCat(",", ActivationName(l.activation)),
                                     ")"));
        break;
      case LayerType::kConv2D:
        parts.push_back(absl::StrCat("conv2d(", l.filters, ",", l.kernel, "x", l.kernel,
                                     l.stride != 1 ? absl::StrCat("/", l.stride) : "",
                                     l.activation == Activation::kLinear
                                         ? ""
                                         : absl::StrCat(",", ActivationName(l.activation)),
                                     ")"));
        break;
      case LayerType::kMaxPool2D:
      case LayerType::kAvgPool2D:
        parts.push_back(absl::StrCat(LayerTypeName(l.type), "(", l.kernel, ")"));
        break;
      case LayerType::kFlatten:
        parts.push_back("flatten");
        break;
      case LayerType::kDropout:
        parts.push_back(absl::StrCat("dropout(", l.rate, ")"));
        break;
    }
  }
  parts.push_back(HeadTypeName(spec_.head));
  for (const EmbeddingSpec& e : spec_.embeddings) {
    parts.push_back(
        absl::StrCat("embedding(", e.column, ",", e.dim, ",", CombinerName(e.combiner), ")"));
  }
  if (!spec_.wide.empty()) {
    parts.push_back(
        absl::StrCat("wide(", spec_.wide.columns.size() + spec_.wide.crossed.size(), " columns)"));
  }
  return absl::StrCat("layers ", absl::StrJoin(parts, " "));
}

std::vector<float> Model::InitialValue(int index, uint64_t seed) const {
  if (index < 0 || index >= static_cast<int>(variables_.size())) return {};
  const VariableSpec& var = variables_[index];
  std::vector<float> value(var.num_elements(), 0.0f);
  if (var.table && !var.wide) {
    // Embeddings: uniform in +-1/sqrt(dim); the wide part's weights are zero.
    const double limit = 1.0 / std::sqrt(static_cast<double>(var.cols));
    std::mt19937_64 rng(SplitMix64(seed ^ SplitMix64(Fnv1a64(var.name))));
    for (float& v : value) v = static_cast<float>((2.0 * Uniform01(&rng) - 1.0) * limit);
    return value;
  }
  const Op* owner = nullptr;
  for (const Op& op : ops_) {
    if (op.kernel == index) owner = &op;
  }
  // Biases are zero, and so is the softmax shorthand's kernel (as in the seed model).
  if (owner == nullptr || spec_.type == "softmax") return value;

  double fan_in = static_cast<double>(var.rows);
  double fan_out = static_cast<double>(var.cols);
  if (owner->layer.type == LayerType::kConv2D) {
    fan_out *= static_cast<double>(owner->layer.kernel) * owner->layer.kernel;
  }
  const bool he = spec_.type == "layers" && owner->layer.activation == Activation::kRelu;
  const double limit = he ? std::sqrt(6.0 / fan_in) : std::sqrt(6.0 / (fan_in + fan_out));
  std::mt19937_64 rng(SplitMix64(seed ^ SplitMix64(Fnv1a64(var.name))));
  for (float& v : value) {
    v = static_cast<float>((2.0 * Uniform01(&rng) - 1.0) * limit);
  }
  return value;
}

void Model::InitialRow(int index, uint64_t seed, int64_t id, float* out) const {
  if (index < 0 || index >= static_cast<int>(variables_.size())) return;
  InitialTableRow(variables_[index], seed, id, out);
}

void InitialTableRow(const VariableSpec& var, uint64_t seed, int64_t id, float* out) {
  if (!var.table || var.wide) {
    std::fill_n(out, var.cols, 0.0f);
    return;
  }
  const double limit = 1.0 / std::sqrt(static_cast<double>(var.cols));
  const uint64_t key =
      SplitMix64(SplitMix64(seed ^ SplitMix64(Fnv1a64(var.name))) ^ static_cast<uint64_t>(id));
  for (int64_t k = 0; k < var.cols; ++k) {
    // key + k: k steps of SplitMix64's stream from key.
    const double u =
        static_cast<double>(SplitMix64(key + static_cast<uint64_t>(k)) >> 11) * 0x1.0p-53;
    out[k] = static_cast<float>((2.0 * u - 1.0) * limit);
  }
}

Params Model::InitialParams(uint64_t seed) const {
  Params params;
  params.reserve(variables_.size());
  for (int i = 0; i < static_cast<int>(variables_.size()); ++i) {
    params.push_back(InitialValue(i, seed));
  }
  return params;
}

RowMatrix Model::Forward(const Params& params, const float* x, int64_t rows, uint64_t dropout_seed,
                         Cache* cache, const LayerHooks* hooks) const {
  const int batch = static_cast<int>(rows);
  RowMatrix current, col;
  std::vector<int32_t> argmax;
  if (cache != nullptr) {
    cache->out.assign(ops_.size(), RowMatrix());
    cache->aux.assign(ops_.size(), RowMatrix());
    cache->argmax.assign(ops_.size(), {});
  }
  const float* in = x;
  ThreadPool* pool = pool_.get();
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    size_t end = i + 1;
    if (!Serial(pool) && PerImage(op.layer.type)) {
      while (end < ops_.size() && PerImage(ops_[end].layer.type)) ++end;
    }
    if (end - i >= 2) {
      if (hooks != nullptr) {
        for (size_t k = i; k < end; ++k) {
          if (ops_[k].kernel < 0) continue;
          hooks->Await(ops_[k].kernel);
          hooks->Await(ops_[k].bias);
        }
      }
      in = ForwardImages(params, in, batch, i, end, cache, &current);
      i = end - 1;
      continue;
    }
    RowMatrix out;
    RowMatrix* aux = cache != nullptr ? &cache->aux[i] : &col;
    if (hooks != nullptr && op.kernel >= 0) {
      hooks->Await(op.kernel);
      hooks->Await(op.bias);
    }
    const int64_t in_dim = NumElements(op.in);
    switch (op.layer.type) {
      case LayerType::kDense: {
        const VariableSpec& kv = variables_[op.kernel];
        ConstMatrixMap input(in, batch, in_dim);
        ConstMatrixMap kernel(params[op.kernel].data(), kv.rows, kv.cols);
        out.resize(batch, kv.cols);
        SplitProduct(pool, out, input, kernel);
        AddBias(params[op.bias], &out);
        ApplyActivation(op.layer.activation, &out, pool);
        break;
      }
      case LayerType::kConv2D:
        ConvForward(op.window, in, batch, params[op.kernel].data(), params[op.bias].data(),
                    op.layer.filters, aux, &out, pool);
        ApplyActivation(op.layer.activation, &out, pool);
        break;
      case LayerType::kMaxPool2D:
        MaxPoolForward(op.window, in, batch, &out, cache != nullptr ? &cache->argmax[i] : &argmax,
                       pool);
        break;
      case LayerType::kAvgPool2D:
        AvgPoolForward(op.window, in, batch, &out, pool);
        break;
      case LayerType::kFlatten:
        out = ConstMatrixMap(in, batch, in_dim);
        break;
      case LayerType::kDropout:
        out = ConstMatrixMap(in, batch, in_dim);
        if (cache != nullptr && op.layer.rate > 0) {
          // Inverted dropout: kept units are scaled by 1/(1-rate), so
          // evaluation (no dropout) needs no rescaling.
          std::mt19937_64 rng(SplitMix64(dropout_seed ^ SplitMix64(i + 1)));
          const float keep_scale = static_cast<float>(1.0 / (1.0 - op.layer.rate));
          aux->resize(batch, in_dim);
          for (int64_t k = 0; k < aux->size(); ++k) {
            aux->data()[k] = Uniform01(&rng) < op.layer.rate ? 0.0f : keep_scale;
          }
          // The mask's numbers stay one serial stream (fixed by the seed
          // alone, whatever the thread count); only the multiply is split.
          MultiplyInPlace(&out, *aux, pool);
        }
        break;
    }
    if (cache != nullptr) {
      cache->out[i] = std::move(out);
      in = cache->out[i].data();
    } else {
      current = std::move(out);
      in = current.data();
    }
  }
  if (cache != nullptr) return cache->out.back();
  return current;
}

float Model::LossAndGradients(const Params& params, const float* x, const int32_t* y, int batch,
                              Params* grads) const {
  Batch b;
  b.x = x;
  b.labels = y;
  b.size = batch;
  return LossAndGradients(params, b, 0, grads);
}

float Model::LossAndGradients(const Params& params, const Batch& data, uint64_t dropout_seed,
                              Params* grads) const {
  return LossAndGradients(params, data, dropout_seed, grads, nullptr);
}

float Model::LossAndGradients(const Params& params, const Batch& data, uint64_t dropout_seed,
                              Params* grads, const LayerHooks* hooks) const {
  assert(params.size() == variables_.size());
  grads->resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    (*grads)[i].resize(params[i].size());
  }
  const int batch = static_cast<int>(data.size);
  if (batch <= 0) {
    for (auto& g : *grads) std::fill(g.begin(), g.end(), 0.0f);
    if (hooks != nullptr) {
      for (int v : BackpropOrder()) hooks->Ready(v);
    }
    return 0.0f;
  }

  Cache cache;
  SparseBatch own_lookups;
  const SparseBatch* lookups = data.sparse;
  if (sparse() && lookups == nullptr) {
    own_lookups = Lookups(data.lookup_ids, batch, data.lookup_weights);
    lookups = &own_lookups;
  }
  RowMatrix deep;  // sparse: the deep tower's input
  RowMatrix logits =
      sparse() ? ForwardSparse(params, data.x, batch, *lookups, dropout_seed, &cache, &deep, hooks)
               : Forward(params, data.x, batch, dropout_seed, &cache, hooks);
  const float* input0 = sparse() ? deep.data() : data.x;

  // The head's loss; logits becomes d(loss)/d(logits).
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double loss = 0.0;
  switch (spec_.head) {
    case HeadType::kSoftmax:
      // Softmax cross-entropy with log-sum-exp.
      for (int r = 0; r < batch; ++r) {
        auto row = logits.row(r);
        const int label = data.labels[r];
        assert(label >= 0 && label < logits.cols());
        const float max = row.maxCoeff();
        const float shifted_label_logit = row(label) - max;
        row.array() = (row.array() - max).exp();
        const float sum = row.sum();
        // -log softmax[label] = log(sum exp(logit - max)) - (logit[label] - max);
        // never takes the log of an underflowed probability.
        loss += std::log(sum) - shifted_label_logit;
        row *= inv_batch / sum;
        row(label) -= inv_batch;
      }
      break;
    case HeadType::kSigmoid:
    case HeadType::kWideAndDeep:
      for (int r = 0; r < batch; ++r) {
        const double z = logits(r, 0);
        const double label = data.labels[r] == 1 ? 1.0 : 0.0;
        // -[y log p + (1-y) log(1-p)] = max(z,0) - z*y + log(1 + exp(-|z|)).
        loss += std::max(z, 0.0) - z * label + std::log1p(std::exp(-std::fabs(z)));
        logits(r, 0) = static_cast<float>((Sigmoid(z) - label) * inv_batch);
      }
      break;
    case HeadType::kMeanSquaredError:
      for (int r = 0; r < batch; ++r) {
        const double diff = static_cast<double>(logits(r, 0)) - data.targets[r];
        loss += diff * diff;
        logits(r, 0) = static_cast<float>(2.0 * diff * inv_batch);
      }
      break;
  }
  RowMatrix d_logits;
  if (sparse()) d_logits = logits;  // the wide part's gradient
  RowMatrix d = std::move(logits);

  // No input gradient is needed at or before the first layer with variables,
  // unless embeddings feed the input.
  int first_with_vars = static_cast<int>(ops_.size());
  for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
    if (ops_[i].kernel >= 0) {
      first_with_vars = i;
      break;
    }
  }
  const bool need_deep_grad = !spec_.embeddings.empty();
  ThreadPool* pool = pool_.get();
  if (need_deep_grad) first_with_vars = 0;
  for (int i = static_cast<int>(ops_.size()) - 1; i >= 0 && i >= first_with_vars; --i) {
    const Op& op = ops_[i];
    if (!Serial(pool) && PerImage(op.layer.type)) {
      // The run of image-by-image layers down from here, as one job.
      int first = i;
      while (first > first_with_vars && PerImage(ops_[first - 1].layer.type)) --first;
      d = BackwardImages(params, cache, first, i, first > first_with_vars || need_deep_grad,
                         std::move(d), grads);
      // The run's gradients are final and its kernels read for the last time.
      for (int k = i; hooks != nullptr && k >= first; --k) {
        if (ops_[k].kernel < 0) continue;
        hooks->Ready(ops_[k].kernel);
        hooks->Ready(ops_[k].bias);
      }
      i = first;
      continue;
    }
    const float* in = i == 0 ? input0 : cache.out[i - 1].data();
    const bool need_input_grad = i > first_with_vars || need_deep_grad;
    RowMatrix din;
    switch (op.layer.type) {
      case LayerType::kDense: {
        ActivationGradient(op.layer.activation, cache.out[i], &d, pool);
        const VariableSpec& kv = variables_[op.kernel];
        ConstMatrixMap input(in, batch, kv.rows);
        MatrixMap dkernel((*grads)[op.kernel].data(), kv.rows, kv.cols);
        // Each element of dW a whole sum over the batch.
        SplitProduct(pool, dkernel, input.transpose(), d);
        ColumnSums(d.data(), d.rows(), kv.cols, (*grads)[op.bias].data(), pool);
        if (need_input_grad) {
          ConstMatrixMap kernel(params[op.kernel].data(), kv.rows, kv.cols);
          din.resize(batch, kv.rows);
          SplitProduct(pool, din, d, kernel.transpose());
        }
        break;
      }
      case LayerType::kConv2D:
        ActivationGradient(op.layer.activation, cache.out[i], &d, pool);
        ConvBackward(op.window, cache.aux[i], d, params[op.kernel].data(), op.layer.filters, batch,
                     (*grads)[op.kernel].data(), (*grads)[op.bias].data(),
                     need_input_grad ? &din : nullptr, pool);
        break;
      case LayerType::kMaxPool2D:
        MaxPoolBackward(op.window, d, cache.argmax[i], &din, pool);
        break;
      case LayerType::kAvgPool2D:
        AvgPoolBackward(op.window, d, &din, pool);
        break;
      case LayerType::kFlatten:
        din = std::move(d);  // same layout
        break;
      case LayerType::kDropout:
        din = std::move(d);
        if (cache.aux[i].size() > 0) MultiplyInPlace(&din, cache.aux[i], pool);
        break;
    }
    d = std::move(din);
    // This layer's gradients are final and its kernel read for the last time.
    if (hooks != nullptr && op.kernel >= 0) {
      hooks->Ready(op.kernel);
      hooks->Ready(op.bias);
    }
  }
  if (sparse()) SparseBackward(params, *lookups, d, d_logits, grads, hooks);
  return static_cast<float>(loss / batch);
}

}  // namespace kubetrain
