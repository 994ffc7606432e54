#include "core/model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

// GCC 12.2 (GCC bug 105593) reports false "__Y is used uninitialized"
// warnings inside its own AVX-512 intrinsics (_mm512_undefined_ps) whenever
// Eigen vectorizes with -march=native; they are noise, not bugs here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <eigen3/Eigen/Dense>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kubetrain {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;

// Rows per forward block in Accuracy(): bounds memory on large eval sets.
constexpr int64_t kEvalBlock = 1000;

// FNV-1a: unlike std::hash, stable across standard libraries and platforms,
// so a (seed, name) pair gives the same initial values everywhere.
uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// splitmix64 finalizer: decorrelates nearby seeds before seeding mt19937_64.
uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Layer sizes [input, hidden..., classes].
std::vector<int> LayerDims(const ModelSpec& spec) {
  std::vector<int> dims;
  dims.push_back(spec.input_dim);
  dims.insert(dims.end(), spec.hidden_units.begin(), spec.hidden_units.end());
  dims.push_back(spec.num_classes);
  return dims;
}

// Adds the bias row to every row of z.
void AddBias(const std::vector<float>& bias, RowMatrix* z) {
  z->rowwise() += ConstRowVectorMap(bias.data(), z->cols());
}

}  // namespace

Model::Model(ModelSpec spec) : spec_(std::move(spec)) {
  const std::vector<int> dims = LayerDims(spec_);
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    variables_.push_back({absl::StrCat("dense", i, "/kernel"), dims[i], dims[i + 1]});
    variables_.push_back({absl::StrCat("dense", i, "/bias"), 1, dims[i + 1]});
  }
}

absl::StatusOr<Model> Model::Create(const ModelSpec& spec) {
  if (spec.type == "softmax") {
    if (!spec.hidden_units.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model type \"softmax\" takes no hidden_units, got [",
                       absl::StrJoin(spec.hidden_units, ","), "]"));
    }
  } else if (spec.type == "mlp") {
    if (spec.hidden_units.empty()) {
      return absl::InvalidArgumentError("model type \"mlp\" needs at least one hidden_units entry");
    }
    for (size_t i = 0; i < spec.hidden_units.size(); ++i) {
      if (spec.hidden_units[i] <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("model type \"mlp\": hidden_units[", i,
                                                       "] is ", spec.hidden_units[i],
                                                       ", must be > 0"));
      }
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model type \"", spec.type, "\" (expected \"softmax\" or \"mlp\")"));
  }
  if (spec.input_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_dim is ", spec.input_dim, ", must be > 0"));
  }
  if (spec.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes is ", spec.num_classes, ", must be >= 2"));
  }
  return Model(spec);
}

std::vector<float> Model::InitialValue(int index, uint64_t seed) const {
  if (index < 0 || index >= static_cast<int>(variables_.size())) return {};
  const VariableSpec& var = variables_[index];
  std::vector<float> value(var.num_elements(), 0.0f);
  // Biases are zero; odd indices are biases (kernel, bias per layer).
  if (index % 2 == 1 || spec_.type == "softmax") return value;

  std::mt19937_64 rng(Mix64(seed ^ Mix64(Fnv1a64(var.name))));
  const double limit = std::sqrt(6.0 / static_cast<double>(var.rows + var.cols));
  for (float& v : value) {
    // Hand-rolled uniform: std::uniform_real_distribution's output is
    // implementation-defined, which would break cross-platform determinism.
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0,1)
    v = static_cast<float>((2.0 * u - 1.0) * limit);
  }
  return value;
}

Params Model::InitialParams(uint64_t seed) const {
  Params params;
  params.reserve(variables_.size());
  for (int i = 0; i < static_cast<int>(variables_.size()); ++i) {
    params.push_back(InitialValue(i, seed));
  }
  return params;
}

float Model::LossAndGradients(const Params& params, const float* x, const int32_t* y, int batch,
                              Params* grads) const {
  assert(params.size() == variables_.size());
  const int num_layers = static_cast<int>(variables_.size() / 2);
  grads->resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    (*grads)[i].resize(params[i].size());
  }
  if (batch <= 0) {
    for (auto& g : *grads) std::fill(g.begin(), g.end(), 0.0f);
    return 0.0f;
  }

  // Forward. acts[i] is the input of layer i (acts[0] is x, not copied);
  // for hidden layers it is the post-ReLU activation, whose sign also serves
  // as the ReLU mask in backprop.
  ConstMatrixMap input(x, batch, spec_.input_dim);
  std::vector<RowMatrix> acts(num_layers);  // acts[0] unused
  RowMatrix logits;
  for (int l = 0; l < num_layers; ++l) {
    const VariableSpec& kv = variables_[2 * l];
    ConstMatrixMap kernel(params[2 * l].data(), kv.rows, kv.cols);
    RowMatrix z(batch, kv.cols);
    if (l == 0) {
      z.noalias() = input * kernel;
    } else {
      z.noalias() = acts[l] * kernel;
    }
    AddBias(params[2 * l + 1], &z);
    if (l + 1 < num_layers) {
      acts[l + 1] = (z.array() > 0.0f).select(z.array(), 0.0f);
    } else {
      logits = std::move(z);
    }
  }

  // Softmax cross-entropy with log-sum-exp; logits becomes d(loss)/d(logits).
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double loss = 0.0;
  for (int r = 0; r < batch; ++r) {
    auto row = logits.row(r);
    const int label = y[r];
    assert(label >= 0 && label < spec_.num_classes);
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
  RowMatrix dz = std::move(logits);

  // Backward.
  for (int l = num_layers - 1; l >= 0; --l) {
    const VariableSpec& kv = variables_[2 * l];
    MatrixMap dkernel((*grads)[2 * l].data(), kv.rows, kv.cols);
    if (l == 0) {
      dkernel.noalias() = input.transpose() * dz;
    } else {
      dkernel.noalias() = acts[l].transpose() * dz;
    }
    RowVectorMap((*grads)[2 * l + 1].data(), kv.cols) = dz.colwise().sum();
    if (l > 0) {
      ConstMatrixMap kernel(params[2 * l].data(), kv.rows, kv.cols);
      RowMatrix da(batch, kv.rows);
      da.noalias() = dz * kernel.transpose();
      // ReLU gradient: pass through where the activation was positive.
      dz = (acts[l].array() > 0.0f).select(da.array(), 0.0f);
    }
  }
  return static_cast<float>(loss / batch);
}

double Model::Accuracy(const Params& params, const float* x, const int32_t* y, int64_t n) const {
  if (n <= 0) return 0.0;
  const int num_layers = static_cast<int>(variables_.size() / 2);
  int64_t correct = 0;
  RowMatrix a, z;
  for (int64_t start = 0; start < n; start += kEvalBlock) {
    const int64_t rows = std::min(kEvalBlock, n - start);
    ConstMatrixMap input(x + start * spec_.input_dim, rows, spec_.input_dim);
    for (int l = 0; l < num_layers; ++l) {
      const VariableSpec& kv = variables_[2 * l];
      ConstMatrixMap kernel(params[2 * l].data(), kv.rows, kv.cols);
      z.resize(rows, kv.cols);
      if (l == 0) {
        z.noalias() = input * kernel;
      } else {
        z.noalias() = a * kernel;
      }
      AddBias(params[2 * l + 1], &z);
      if (l + 1 < num_layers) {
        a = (z.array() > 0.0f).select(z.array(), 0.0f);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      Eigen::Index arg = 0;
      z.row(r).maxCoeff(&arg);
      if (arg == y[start + r]) ++correct;
    }
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace kubetrain
