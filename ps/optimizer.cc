#include "ps/optimizer.h"

#include <cmath>

#include <eigen3/Eigen/Core>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using ConstVec = Eigen::Map<const Eigen::ArrayXf>;

std::vector<std::vector<float>> MakeSlots(const std::vector<int64_t>& sizes, float init) {
  std::vector<std::vector<float>> slots;
  for (int64_t n : sizes) slots.emplace_back(n, init);
  return slots;
}

class Sgd final : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  void Apply(int, float* value, const float* grad, int64_t n, int64_t) override {
    Vec(value, n) -= lr_ * ConstVec(grad, n);
  }
  std::vector<std::vector<float>*> Slots(int) override { return {}; }

 private:
  float lr_;
};

class Momentum final : public Optimizer {
 public:
  Momentum(float lr, float momentum, bool nesterov, const std::vector<int64_t>& sizes)
      : lr_(lr), momentum_(momentum), nesterov_(nesterov), accum_(MakeSlots(sizes, 0)) {}
  void Apply(int part, float* value, const float* grad, int64_t n, int64_t) override {
    Vec a(accum_[part].data(), n);
    ConstVec g(grad, n);
    a = momentum_ * a + g;  // TF's MomentumOptimizer
    if (nesterov_) {
      Vec(value, n) -= lr_ * (g + momentum_ * a);
    } else {
      Vec(value, n) -= lr_ * a;
    }
  }
  std::vector<std::vector<float>*> Slots(int part) override { return {&accum_[part]}; }

 private:
  float lr_, momentum_;
  bool nesterov_;
  std::vector<std::vector<float>> accum_;
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerSpec& s, const std::vector<int64_t>& sizes)
      : lr_(s.learning_rate),
        b1_(s.beta1),
        b2_(s.beta2),
        eps_(s.epsilon),
        m_(MakeSlots(sizes, 0)),
        v_(MakeSlots(sizes, 0)) {}
  void Apply(int part, float* value, const float* grad, int64_t n, int64_t step) override {
    Vec m(m_[part].data(), n), v(v_[part].data(), n);
    ConstVec g(grad, n);
    m = b1_ * m + (1 - b1_) * g;
    v = b2_ * v + (1 - b2_) * g.square();
    double t = static_cast<double>(step);
    float alpha =
        static_cast<float>(lr_ * std::sqrt(1 - std::pow(b2_, t)) / (1 - std::pow(b1_, t)));
    Vec(value, n) -= alpha * m / (v.sqrt() + static_cast<float>(eps_));
  }
  std::vector<std::vector<float>*> Slots(int part) override { return {&m_[part], &v_[part]}; }

 private:
  double lr_, b1_, b2_, eps_;
  std::vector<std::vector<float>> m_, v_;
};

class Adagrad final : public Optimizer {
 public:
  Adagrad(const OptimizerSpec& s, const std::vector<int64_t>& sizes)
      : lr_(s.learning_rate),
        eps_(s.epsilon),
        accum_(MakeSlots(sizes, static_cast<float>(s.initial_accumulator))) {}
  void Apply(int part, float* value, const float* grad, int64_t n, int64_t) override {
    Vec a(accum_[part].data(), n);
    ConstVec g(grad, n);
    a += g.square();
    Vec(value, n) -= lr_ * g / (a.sqrt() + eps_);
  }
  std::vector<std::vector<float>*> Slots(int part) override { return {&accum_[part]}; }

 private:
  float lr_, eps_;
  std::vector<std::vector<float>> accum_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           const std::vector<int64_t>& sizes) {
  if (!(spec.learning_rate > 0) || !std::isfinite(spec.learning_rate)) {
    return absl::InvalidArgumentError("optimizer.learningRate must be > 0");
  }
  if (spec.type == "sgd") return std::unique_ptr<Optimizer>(new Sgd(spec.learning_rate));
  if (spec.type == "momentum") {
    return std::unique_ptr<Optimizer>(
        new Momentum(spec.learning_rate, spec.momentum, spec.nesterov, sizes));
  }
  if (spec.type == "adam") return std::unique_ptr<Optimizer>(new Adam(spec, sizes));
  if (spec.type == "adagrad") return std::unique_ptr<Optimizer>(new Adagrad(spec, sizes));
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.type: unknown \"", spec.type, "\" (sgd, momentum, adam, adagrad)"));
}

}  // namespace kubetrain
