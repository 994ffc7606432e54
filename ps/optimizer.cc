#include "ps/optimizer.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <utility>

#include <eigen3/Eigen/Core>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "ps/finite.h"

namespace kubetrain {
namespace {
struct ExactSqrtOp;
}  // namespace
}  // namespace kubetrain

// Packet access only where ExactSqrtOp has an exact packet sqrt (x86 SSE and up).
template <>
struct Eigen::internal::functor_traits<kubetrain::ExactSqrtOp> {
#if defined(EIGEN_VECTORIZE_SSE)
  enum {Cost = 5 * Eigen::NumTraits<float>::MulCost, PacketAccess = 1};
#else
  enum { Cost = 5 * Eigen::NumTraits<float>::MulCost, PacketAccess = 0 };
#endif
};

namespace kubetrain {
namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using ConstVec = Eigen::Map<const Eigen::ArrayXf>;

// Correctly rounded sqrt per element, vectorised. Eigen's packet sqrt under
// EIGEN_FAST_MATH is an rsqrt approximation while its scalar tail is exact,
// so which elements got which would depend on buffer alignment; the IEEE
// sqrt instructions (sqrtps) round correctly like std::sqrt, so an update
// stays a function of the values alone (dense parts and table rows agree bit
// for bit) and the whole update expression stays vectorised (a scalar-only
// functor made Eigen evaluate every Adam/Adagrad/FTRL update element by
// element: the apply of the step bench's 0.94 MB Adam model took ~6x longer).
struct ExactSqrtOp {
  float operator()(float v) const { return std::sqrt(v); }
#if defined(EIGEN_VECTORIZE_SSE)
  Eigen::internal::Packet4f packetOp(const Eigen::internal::Packet4f& p) const {
    return _mm_sqrt_ps(p);
  }
#endif
#if defined(EIGEN_VECTORIZE_AVX)
  Eigen::internal::Packet8f packetOp(const Eigen::internal::Packet8f& p) const {
    return _mm256_sqrt_ps(p);
  }
#endif
#if defined(EIGEN_VECTORIZE_AVX512)
  Eigen::internal::Packet16f packetOp(const Eigen::internal::Packet16f& p) const {
    return _mm512_sqrt_ps(p);
  }
#endif
};

template <typename Expr>
auto ExactSqrt(const Expr& e) {
  return e.unaryExpr(ExactSqrtOp());
}

// The element-wise update of one optimizer type: from a value, its gradient
// and the current slots (in[k]: slot k), the new value and slots (out[k]).
// Dense parts and embedding-table rows both run these, so a lazy (row-wise)
// update is the dense update of the touched rows, by construction.
class Rule {
 public:
  virtual ~Rule() = default;
  virtual std::vector<float> slot_init() const = 0;  // one entry per slot
  // Returns false if any new value or slot element is not finite.
  virtual bool Update(const float* value, const float* grad, int64_t n, int64_t step,
                      const float* const* in, float* const* out, float* value_out) const = 0;
};

class SgdRule final : public Rule {
 public:
  explicit SgdRule(float lr) : lr_(lr) {}
  std::vector<float> slot_init() const override { return {}; }
  bool Update(const float* value, const float* grad, int64_t n, int64_t, const float* const*,
              float* const*, float* value_out) const override {
    Vec out(value_out, n);
    out = ConstVec(value, n) - lr_ * ConstVec(grad, n);
    return AllFinite(value_out, n);
  }

 private:
  const float lr_;
};

class MomentumRule final : public Rule {
 public:
  MomentumRule(float lr, float momentum, bool nesterov)
      : lr_(lr), momentum_(momentum), nesterov_(nesterov) {}
  std::vector<float> slot_init() const override { return {0}; }
  bool Update(const float* value, const float* grad, int64_t n, int64_t, const float* const* in,
              float* const* out_slots, float* value_out) const override {
    Vec a(out_slots[0], n);
    ConstVec g(grad, n);
    a = momentum_ * ConstVec(in[0], n) + g;  // TF's MomentumOptimizer
    Vec out(value_out, n);
    if (nesterov_) {
      out = ConstVec(value, n) - lr_ * (g + momentum_ * a);
    } else {
      out = ConstVec(value, n) - lr_ * a;
    }
    return AllFinite(value_out, n) && AllFinite(out_slots[0], n);
  }

 private:
  const float lr_, momentum_;
  const bool nesterov_;
};

class AdamRule final : public Rule {
 public:
  explicit AdamRule(const OptimizerSpec& s)
      : lr_(s.learning_rate), b1_(s.beta1), b2_(s.beta2), eps_(s.epsilon) {}
  std::vector<float> slot_init() const override { return {0, 0}; }
  bool Update(const float* value, const float* grad, int64_t n, int64_t step,
              const float* const* in, float* const* out_slots, float* value_out) const override {
    Vec m(out_slots[0], n), v(out_slots[1], n);
    ConstVec g(grad, n);
    m = b1_ * ConstVec(in[0], n) + (1 - b1_) * g;
    v = b2_ * ConstVec(in[1], n) + (1 - b2_) * g.square();
    Vec out(value_out, n);
    out = ConstVec(value, n) - Alpha(step) * m / (ExactSqrt(v) + static_cast<float>(eps_));
    return AllFinite(value_out, n) && AllFinite(out_slots[0], n) && AllFinite(out_slots[1], n);
  }

 private:
  // The bias-corrected step size of `step`, computed once per step (Update
  // runs per block of a part and per table row).
  float Alpha(int64_t step) const {
    if (step != alpha_step_) {
      const double t = static_cast<double>(step);
      alpha_ = static_cast<float>(lr_ * std::sqrt(1 - std::pow(b2_, t)) / (1 - std::pow(b1_, t)));
      alpha_step_ = step;
    }
    return alpha_;
  }

  const double lr_, b1_, b2_, eps_;
  mutable int64_t alpha_step_ = -1;
  mutable float alpha_ = 0;
};

class AdagradRule final : public Rule {
 public:
  explicit AdagradRule(const OptimizerSpec& s)
      : lr_(s.learning_rate), eps_(s.epsilon), init_(s.initial_accumulator) {}
  std::vector<float> slot_init() const override { return {init_}; }
  bool Update(const float* value, const float* grad, int64_t n, int64_t, const float* const* in,
              float* const* out_slots, float* value_out) const override {
    Vec a(out_slots[0], n);
    ConstVec g(grad, n);
    a = ConstVec(in[0], n) + g.square();
    Vec out(value_out, n);
    out = ConstVec(value, n) - lr_ * g / (ExactSqrt(a) + eps_);
    return AllFinite(value_out, n) && AllFinite(out_slots[0], n);
  }

 private:
  const float lr_, eps_, init_;
};

// FTRL-Proximal (McMahan et al. 2013; TF's FtrlOptimizer, its ApplyFtrl
// kernel): slots are the accumulated squared gradients n and the linear term
// z. The per-coordinate learning rate is lr / n^(-learningRatePower); the
// default power -0.5 (the paper's lr / sqrt(n)) runs on sqrt, as TF's kernel
// special-cases it, and any other power on std::pow.
class FtrlRule final : public Rule {
 public:
  explicit FtrlRule(const OptimizerSpec& s)
      : lr_(s.learning_rate),
        l1_(s.l1),
        l2_(s.l2),
        init_(s.initial_accumulator),
        power_(s.learning_rate_power) {}
  std::vector<float> slot_init() const override { return {init_, 0}; }
  bool Update(const float* value, const float* grad, int64_t n, int64_t, const float* const* in,
              float* const* out_slots, float* value_out) const override {
    Vec acc(out_slots[0], n), z(out_slots[1], n);
    ConstVec g(grad, n), w(value, n), old_acc(in[0], n);
    acc = old_acc + g.square();
    Vec out(value_out, n);
    if (power_ == -0.5f) {
      z = ConstVec(in[1], n) + g - (ExactSqrt(acc) - ExactSqrt(old_acc)) / lr_ * w;
      const auto quadratic = ExactSqrt(acc) / lr_ + 2 * l2_;
      // (sign(z) * l1 - z) / quadratic where |z| > l1, else 0, in the same
      // operations (clamp(z) is sign(z) * l1 there and z elsewhere, z - z = +0)
      // but vectorised: Eigen 3.4 evaluates select() and sign() per element.
      out = (z.max(-l1_).min(l1_) - z) / quadratic;
    } else {
      // n^(-power), new and old, by std::pow element by element: Eigen's
      // packet pow need not round as std::pow does, and a value must not
      // depend on where in a packet it falls. The rest stays vectorised.
      new_pow_.resize(n);
      old_pow_.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        new_pow_[i] = std::pow(acc[i], -power_);
        old_pow_[i] = std::pow(old_acc[i], -power_);
      }
      ConstVec new_pow(new_pow_.data(), n), old_pow(old_pow_.data(), n);
      z = ConstVec(in[1], n) + g - (new_pow - old_pow) / lr_ * w;
      out = (z.max(-l1_).min(l1_) - z) / (new_pow / lr_ + 2 * l2_);
    }
    return AllFinite(value_out, n) && AllFinite(out_slots[0], n) && AllFinite(out_slots[1], n);
  }

 private:
  const float lr_, l1_, l2_, init_, power_;
  mutable std::vector<float> new_pow_, old_pow_;  // scratch of the pow path
};

absl::StatusOr<std::unique_ptr<Rule>> CreateRule(const OptimizerSpec& spec) {
  if (!(spec.learning_rate > 0) || !std::isfinite(spec.learning_rate)) {
    return absl::InvalidArgumentError("optimizer.learningRate must be > 0");
  }
  if (spec.type == "sgd") return std::unique_ptr<Rule>(new SgdRule(spec.learning_rate));
  if (spec.type == "momentum") {
    return std::unique_ptr<Rule>(
        new MomentumRule(spec.learning_rate, spec.momentum, spec.nesterov));
  }
  if (spec.type == "adam") return std::unique_ptr<Rule>(new AdamRule(spec));
  if (spec.type == "adagrad") return std::unique_ptr<Rule>(new AdagradRule(spec));
  if (spec.type == "ftrl") {
    if (!(spec.learning_rate_power <= 0)) {
      return absl::InvalidArgumentError("optimizer.learningRatePower must be <= 0");
    }
    return std::unique_ptr<Rule>(new FtrlRule(spec));
  }
  return absl::InvalidArgumentError(absl::StrCat("optimizer.type: unknown \"", spec.type,
                                                 "\" (sgd, momentum, adam, adagrad, ftrl)"));
}

// Per part, per slot: the current buffer and the staged one (swapped by Commit).
class DenseOptimizer final : public Optimizer {
 public:
  static constexpr size_t kMaxSlots = 2;  // Adam's and FTRL's
  DenseOptimizer(std::unique_ptr<Rule> rule, const std::vector<int64_t>& sizes)
      : rule_(std::move(rule)) {
    const std::vector<float> init = rule_->slot_init();
    assert(init.size() <= kMaxSlots);
    current_.resize(sizes.size());
    staged_.resize(sizes.size());
    for (size_t p = 0; p < sizes.size(); ++p) {
      for (float v : init) {
        current_[p].emplace_back(sizes[p], v);
        staged_[p].emplace_back(sizes[p], v);
      }
    }
  }
  // The rule runs block by block: its passes over one block (new slots, new
  // values, their finiteness) then find the block's 7-10 arrays in L1 instead
  // of streaming the whole part through memory once per pass. The rules are
  // element-wise, so the result does not depend on the blocking.
  bool Stage(int part, const float* value, const float* grad, int64_t n, int64_t step,
             float* value_out, bool* grad_finite) override {
    constexpr int64_t kBlock = 1024;
    const size_t slots = current_[part].size();
    const float* in[kMaxSlots];
    float* out[kMaxSlots];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(kBlock, n - b);
      // Before the rule: the block is then in L1 for it too.
      if (grad_finite != nullptr && !AllFinite(grad + b, len)) {
        *grad_finite = false;
        return false;
      }
      for (size_t k = 0; k < slots; ++k) {
        in[k] = current_[part][k].data() + b;
        out[k] = staged_[part][k].data() + b;
      }
      if (!rule_->Update(value + b, grad + b, len, step, in, out, value_out + b)) {
        return false;
      }
    }
    return true;
  }
  void Commit(int part) override { std::swap(current_[part], staged_[part]); }
  std::vector<std::vector<float>*> Slots(int part) override {
    std::vector<std::vector<float>*> slots;
    for (auto& s : current_[part]) slots.push_back(&s);
    return slots;
  }

 private:
  const std::unique_ptr<Rule> rule_;
  std::vector<std::vector<std::vector<float>>> current_, staged_;  // [part][slot]
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           const std::vector<int64_t>& sizes) {
  auto rule = CreateRule(spec);
  if (!rule.ok()) return rule.status();
  return std::unique_ptr<Optimizer>(new DenseOptimizer(std::move(*rule), sizes));
}

struct RowOptimizer::Impl {
  std::unique_ptr<Rule> rule;
  int64_t rows = 0, dim = 0;
  std::vector<std::vector<float>> slots;   // [slot]: rows x dim
  std::vector<std::vector<float>> staged;  // [slot]: the staged rows, in Stage's order
};

RowOptimizer::RowOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RowOptimizer::~RowOptimizer() = default;

absl::StatusOr<std::unique_ptr<RowOptimizer>> RowOptimizer::Create(const OptimizerSpec& spec,
                                                                   int64_t rows, int64_t dim) {
  auto rule = CreateRule(spec);
  if (!rule.ok()) return rule.status();
  auto impl = std::make_unique<Impl>();
  impl->rule = std::move(*rule);
  impl->rows = rows;
  impl->dim = dim;
  for (float v : impl->rule->slot_init()) {
    impl->slots.emplace_back(rows * dim, v);
    impl->staged.emplace_back();
  }
  return std::unique_ptr<RowOptimizer>(new RowOptimizer(std::move(impl)));
}

bool RowOptimizer::Stage(const float* table, const std::vector<int64_t>& rows, const float* grad,
                         int64_t step, float* value_out) {
  Impl& s = *impl_;
  const int64_t dim = s.dim;
  for (auto& st : s.staged) st.resize(rows.size() * dim);
  // Inline: a rule has a few slots, and a push's rows must not allocate
  // (ps/sparse_push_alloc_test.cc).
  absl::InlinedVector<const float*, 4> in(s.slots.size());
  absl::InlinedVector<float*, 4> out(s.slots.size());
  bool finite = true;
  for (size_t i = 0; i < rows.size() && finite; ++i) {
    const int64_t r = rows[i];
    for (size_t k = 0; k < s.slots.size(); ++k) {
      in[k] = s.slots[k].data() + r * dim;
      out[k] = s.staged[k].data() + i * dim;
    }
    finite = s.rule->Update(table + r * dim, grad + i * dim, dim, step, in.data(), out.data(),
                            value_out + i * dim);
  }
  return finite;
}

void RowOptimizer::Commit(const std::vector<int64_t>& rows) {
  Impl& s = *impl_;
  for (size_t k = 0; k < s.slots.size(); ++k) {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(s.staged[k].data() + i * s.dim, s.dim, s.slots[k].data() + rows[i] * s.dim);
    }
  }
}

void RowOptimizer::Reserve(int64_t rows) {
  for (auto& st : impl_->staged) st.reserve(rows * impl_->dim);
}

int RowOptimizer::num_slots() const { return static_cast<int>(impl_->slots.size()); }

void RowOptimizer::Resize(int64_t rows, int64_t capacity) {
  Impl& s = *impl_;
  const std::vector<float> init = s.rule->slot_init();
  for (size_t k = 0; k < s.slots.size(); ++k) {
    s.slots[k].reserve(std::max(rows, capacity) * s.dim);
    s.slots[k].resize(rows * s.dim, init[k]);
  }
  s.rows = rows;
}

void RowOptimizer::ResetRow(int64_t r) {
  Impl& s = *impl_;
  const std::vector<float> init = s.rule->slot_init();
  for (size_t k = 0; k < s.slots.size(); ++k) {
    std::fill_n(s.slots[k].data() + r * s.dim, s.dim, init[k]);
  }
}

std::vector<std::vector<float>*> RowOptimizer::Slots() {
  std::vector<std::vector<float>*> out;
  for (auto& s : impl_->slots) out.push_back(&s);
  return out;
}

}  // namespace kubetrain
