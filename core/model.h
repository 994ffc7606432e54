// Models trained by kubetrain: dense layers with ReLU and a softmax
// cross-entropy head, on Eigen.
//
// Parameters are a list of variables, each a row-major float32 matrix
// (`rows` x `cols`). A dense layer i has a kernel "dense{i}/kernel" of shape
// [in, out] and a bias "dense{i}/bias" of shape [1, out]. Row-major kernels
// with rows = input features make a split by rows (across PS tasks) a
// contiguous slice.
//
// Thread safety: a Model is immutable after Create(); all const methods may be
// called concurrently.
#ifndef KUBETRAIN_CORE_MODEL_H_
#define KUBETRAIN_CORE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kubetrain {

struct VariableSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t num_elements() const { return rows * cols; }
  int64_t num_bytes() const { return num_elements() * 4; }
};

struct ModelSpec {
  std::string type = "softmax";   // "softmax" (784->10) or "mlp"
  std::vector<int> hidden_units;  // mlp only: sizes of the hidden ReLU layers
  int input_dim = 784;
  int num_classes = 10;
};

// One flat row-major buffer per variable, in Model::variables() order.
using Params = std::vector<std::vector<float>>;

class Model {
 public:
  // Validates the spec: softmax takes no hidden units, mlp needs at least one,
  // every size > 0.
  static absl::StatusOr<Model> Create(const ModelSpec& spec);

  const std::vector<VariableSpec>& variables() const { return variables_; }
  const ModelSpec& spec() const { return spec_; }

  // Deterministic initial value of variable `index` for a given seed: kernels
  // Glorot-uniform, biases zero (softmax kernel: zero, as in the seed model).
  std::vector<float> InitialValue(int index, uint64_t seed) const;
  Params InitialParams(uint64_t seed) const;

  // Mean softmax cross-entropy over `batch` examples (x: batch x input_dim
  // row-major, y: labels in [0, num_classes)). Writes d(loss)/d(param) into
  // `grads`, resized to the layout of `params`.
  // REQUIRES: params has the layout of variables().
  float LossAndGradients(const Params& params, const float* x, const int32_t* y, int batch,
                         Params* grads) const;

  // Fraction of the n examples whose argmax prediction equals the label.
  double Accuracy(const Params& params, const float* x, const int32_t* y, int64_t n) const;

 private:
  explicit Model(ModelSpec spec);
  ModelSpec spec_;
  std::vector<VariableSpec> variables_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_MODEL_H_
