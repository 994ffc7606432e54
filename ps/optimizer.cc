#include "ps/optimizer.h"

#include <cmath>
#include <utility>

#include <eigen3/Eigen/Core>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using ConstVec = Eigen::Map<const Eigen::ArrayXf>;

// Per part, the current slot buffer and the staged one (swapped by Commit).
class Slot {
 public:
  Slot(const std::vector<int64_t>& sizes, float init) {
    for (int64_t n : sizes) {
      current_.emplace_back(n, init);
      staged_.emplace_back(n, init);
    }
  }
  ConstVec current(int part, int64_t n) const { return ConstVec(current_[part].data(), n); }
  Vec staged(int part, int64_t n) { return Vec(staged_[part].data(), n); }
  bool staged_finite(int part, int64_t n) { return staged(part, n).allFinite(); }
  void Commit(int part) { std::swap(current_[part], staged_[part]); }
  std::vector<float>* current_buffer(int part) { return &current_[part]; }

 private:
  std::vector<std::vector<float>> current_, staged_;
};

class Sgd final : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  bool Stage(int, const float* value, const float* grad, int64_t n, int64_t,
             float* value_out) override {
    Vec out(value_out, n);
    out = ConstVec(value, n) - lr_ * ConstVec(grad, n);
    return out.allFinite();
  }
  void Commit(int) override {}
  std::vector<std::vector<float>*> Slots(int) override { return {}; }

 private:
  const float lr_;
};

class Momentum final : public Optimizer {
 public:
  Momentum(float lr, float momentum, bool nesterov, const std::vector<int64_t>& sizes)
      : lr_(lr), momentum_(momentum), nesterov_(nesterov), accum_(sizes, 0) {}
  bool Stage(int part, const float* value, const float* grad, int64_t n, int64_t,
             float* value_out) override {
    Vec a = accum_.staged(part, n);
    ConstVec g(grad, n);
    a = momentum_ * accum_.current(part, n) + g;  // TF's MomentumOptimizer
    Vec out(value_out, n);
    if (nesterov_) {
      out = ConstVec(value, n) - lr_ * (g + momentum_ * a);
    } else {
      out = ConstVec(value, n) - lr_ * a;
    }
    return out.allFinite() && a.allFinite();
  }
  void Commit(int part) override { accum_.Commit(part); }
  std::vector<std::vector<float>*> Slots(int part) override {
    return {accum_.current_buffer(part)};
  }

 private:
  const float lr_, momentum_;
  const bool nesterov_;
  Slot accum_;
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerSpec& s, const std::vector<int64_t>& sizes)
      : lr_(s.learning_rate),
        b1_(s.beta1),
        b2_(s.beta2),
        eps_(s.epsilon),
        m_(sizes, 0),
        v_(sizes, 0) {}
  bool Stage(int part, const float* value, const float* grad, int64_t n, int64_t step,
             float* value_out) override {
    Vec m = m_.staged(part, n), v = v_.staged(part, n);
    ConstVec g(grad, n);
    m = b1_ * m_.current(part, n) + (1 - b1_) * g;
    v = b2_ * v_.current(part, n) + (1 - b2_) * g.square();
    double t = static_cast<double>(step);
    float alpha =
        static_cast<float>(lr_ * std::sqrt(1 - std::pow(b2_, t)) / (1 - std::pow(b1_, t)));
    Vec out(value_out, n);
    out = ConstVec(value, n) - alpha * m / (v.sqrt() + static_cast<float>(eps_));
    return out.allFinite() && m.allFinite() && v.allFinite();
  }
  void Commit(int part) override {
    m_.Commit(part);
    v_.Commit(part);
  }
  std::vector<std::vector<float>*> Slots(int part) override {
    return {m_.current_buffer(part), v_.current_buffer(part)};
  }

 private:
  const double lr_, b1_, b2_, eps_;
  Slot m_, v_;
};

class Adagrad final : public Optimizer {
 public:
  Adagrad(const OptimizerSpec& s, const std::vector<int64_t>& sizes)
      : lr_(s.learning_rate),
        eps_(s.epsilon),
        accum_(sizes, static_cast<float>(s.initial_accumulator)) {}
  bool Stage(int part, const float* value, const float* grad, int64_t n, int64_t,
             float* value_out) override {
    Vec a = accum_.staged(part, n);
    ConstVec g(grad, n);
    a = accum_.current(part, n) + g.square();
    Vec out(value_out, n);
    out = ConstVec(value, n) - lr_ * g / (a.sqrt() + eps_);
    return out.allFinite() && a.allFinite();
  }
  void Commit(int part) override { accum_.Commit(part); }
  std::vector<std::vector<float>*> Slots(int part) override {
    return {accum_.current_buffer(part)};
  }

 private:
  const float lr_, eps_;
  Slot accum_;
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
