#include "ps/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kubetrain {
namespace {

std::unique_ptr<Optimizer> Make(OptimizerSpec spec, int64_t n) {
  auto opt = CreateOptimizer(spec, {n});
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(*opt);
}

TEST(OptimizerTest, SgdStep) {
  OptimizerSpec s;
  s.type = "sgd";
  s.learning_rate = 0.5;
  auto opt = Make(s, 2);
  float w[2] = {1, 2}, g[2] = {0.2f, -0.4f};
  opt->Apply(0, w, g, 2, 1);
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  EXPECT_FLOAT_EQ(w[1], 2.2f);
}

TEST(OptimizerTest, MomentumAccumulates) {
  OptimizerSpec s;
  s.type = "momentum";
  s.learning_rate = 0.1;
  s.momentum = 0.9;
  auto opt = Make(s, 1);
  float w = 0, g = 1;
  opt->Apply(0, &w, &g, 1, 1);  // a=1, w=-0.1
  opt->Apply(0, &w, &g, 1, 2);  // a=1.9, w=-0.29
  EXPECT_NEAR(w, -0.29f, 1e-6);
}

TEST(OptimizerTest, AdamFirstStepIsLearningRateTimesSign) {
  OptimizerSpec s;
  s.type = "adam";
  s.learning_rate = 0.01;
  auto opt = Make(s, 2);
  float w[2] = {0, 0}, g[2] = {3, -0.5f};
  opt->Apply(0, w, g, 2, 1);
  EXPECT_NEAR(w[0], -0.01f, 1e-5);
  EXPECT_NEAR(w[1], 0.01f, 1e-5);
}

TEST(OptimizerTest, AdagradScalesByAccumulatedSquares) {
  OptimizerSpec s;
  s.type = "adagrad";
  s.learning_rate = 1;
  s.initial_accumulator = 0;
  s.epsilon = 0;
  auto opt = Make(s, 1);
  float w = 0, g = 2;
  opt->Apply(0, &w, &g, 1, 1);  // a=4, w -= 2/2
  EXPECT_NEAR(w, -1, 1e-6);
  opt->Apply(0, &w, &g, 1, 2);  // a=8, w -= 2/sqrt(8)
  EXPECT_NEAR(w, -1 - 2 / std::sqrt(8.0f), 1e-6);
}

// FTRL-Proximal as published, in double precision, written from the rule
// itself and not from ps/optimizer.cc: McMahan et al. 2013, "Ad Click
// Prediction: a View from the Trenches", Algorithm 1 (per-coordinate
// learning rate lr / sqrt(n)), with the learning rate power of TF's
// FtrlOptimizer as its ApplyFtrl kernel (tensorflow/core/kernels/
// training_ops.cc) and tf.raw_ops.ApplyFtrl's documentation state it:
//   accum_new = accum + g^2
//   linear   += g - (accum_new^(-lr_power) - accum^(-lr_power)) / lr * var
//   quadratic = accum_new^(-lr_power) / lr + 2 * l2
//   var       = |linear| > l1 ? (sign(linear) * l1 - linear) / quadratic : 0
//   accum     = accum_new
// (std::pow throughout, also for lr_power -0.5, where TF and the PS use sqrt.)
struct FtrlReference {
  double lr, l1, l2, lr_power;
  double var, accum, linear = 0;
  // The sum of the magnitudes of the terms added into linear: float32
  // rounding errs on linear by a few ulps of it, not of |linear| (the terms
  // of gradients of both signs cancel), and var inherits that error.
  double linear_magnitude = 0;
  void Step(double g) {
    const double accum_new = accum + g * g;
    const double sigma_var =
        (std::pow(accum_new, -lr_power) - std::pow(accum, -lr_power)) / lr * var;
    linear += g - sigma_var;
    linear_magnitude += std::fabs(g) + std::fabs(sigma_var);
    const double quadratic = std::pow(accum_new, -lr_power) / lr + 2 * l2;
    var = std::fabs(linear) > l1 ? ((linear > 0 ? l1 : -l1) - linear) / quadratic : 0.0;
    accum = accum_new;
  }
};

// The reference itself, on a first step worked by hand: from var 0, linear
// is g, and with l1 = l2 = 0, var = -g * lr / sqrt(accum0 + g^2).
TEST(FtrlReferenceTest, FirstStepByHand) {
  FtrlReference r{/*lr=*/0.5,        /*l1=*/0,  /*l2=*/0,
                  /*lr_power=*/-0.5, /*var=*/0, /*accum=*/0.1};
  r.Step(0.5);
  EXPECT_DOUBLE_EQ(r.accum, 0.35);
  EXPECT_DOUBLE_EQ(r.linear, 0.5);
  EXPECT_NEAR(r.var, -0.25 / std::sqrt(0.35), 1e-15);  // -0.42257712736425829
  // With l1 = 0.3: var = (0.3 - 0.5) / (sqrt(0.35) / 0.5) = -0.1 / sqrt(0.35).
  FtrlReference s{0.5, 0.3, 0, -0.5, 0, 0.1};
  s.Step(0.5);
  EXPECT_NEAR(s.var, -0.1 / std::sqrt(0.35), 1e-15);
  // |linear| <= l1: var is 0.
  FtrlReference t{0.5, 0.3, 0, -0.5, 0, 0.1};
  t.Step(0.25);
  EXPECT_EQ(t.var, 0.0);
}

// The PS's FTRL, dense and row-wise, against the reference over hand-made
// gradient sequences: learning rate powers -0.5 (the sqrt path), -0.25, -1
// and 0 (a fixed rate, the pow path), initial accumulators 0.1 and 1, l1
// and l2 0 and > 0. Six coordinates, six steps: coordinate 1's small
// gradients keep |linear| <= l1 (value 0) for a while, 3 and 5 cross the
// threshold mid-sequence, 4 has a zero gradient; 0 and 2 are large.
TEST(OptimizerTest, FtrlMatchesThePublishedRule) {
  constexpr int kN = 6, kSteps = 6;
  const float w0[kN] = {0.0f, 0.5f, -1.5f, 0.02f, 2.0f, -0.3f};
  const float grads[kSteps][kN] = {
      {0.5f, -0.1f, 1.5f, 0.05f, -3.0f, 0.35f}, {0.4f, 0.05f, -2.0f, 0.1f, 0.5f, -0.3f},
      {-0.1f, -0.2f, 0.85f, 0.2f, 0.5f, 0.31f}, {0.6f, 0.15f, 0.3f, 0.25f, -0.25f, -0.29f},
      {0.2f, -0.1f, -0.4f, -0.65f, 0.0f, 0.2f}, {-0.05f, 0.1f, 1.1f, -0.7f, 0.75f, 0.4f},
  };
  int cases = 0, zeros = 0, crossings = 0;
  for (double lr_power : {-0.5, -0.25, -1.0, 0.0}) {
    for (double init : {0.1, 1.0}) {
      for (double l1 : {0.0, 0.3}) {
        for (double l2 : {0.0, 0.2}) {
          OptimizerSpec s;
          s.type = "ftrl";
          s.learning_rate = 0.5;
          s.learning_rate_power = lr_power;
          s.initial_accumulator = init;
          s.l1 = l1;
          s.l2 = l2;
          const std::string name = "lr_power " + std::to_string(lr_power) + " init " +
                                   std::to_string(init) + " l1 " + std::to_string(l1) + " l2 " +
                                   std::to_string(l2);
          auto dense = Make(s, kN);
          auto rows = RowOptimizer::Create(s, 2, kN / 2);  // 2 rows of 3, both touched
          ASSERT_TRUE(rows.ok()) << rows.status();
          std::vector<FtrlReference> ref;
          for (int i = 0; i < kN; ++i) ref.push_back({0.5, l1, l2, lr_power, w0[i], init});
          std::vector<float> w(w0, w0 + kN), table(w0, w0 + kN);
          for (int step = 1; step <= kSteps; ++step) {
            const float* g = grads[step - 1];
            ASSERT_TRUE(dense->Apply(0, w.data(), g, kN, step)) << name;
            std::vector<float> out(kN);
            ASSERT_TRUE((*rows)->Stage(table.data(), {0, 1}, g, step, out.data())) << name;
            (*rows)->Commit({0, 1});
            table = out;
            for (int i = 0; i < kN; ++i) {
              const bool was_zero = ref[i].var == 0;
              ref[i].Step(g[i]);
              // Keep the data clear of the threshold: a |linear| within
              // float32 rounding of l1 could land on either side.
              if (l1 > 0) {
                ASSERT_GT(std::fabs(std::fabs(ref[i].linear) - l1), 1e-4)
                    << name << " step " << step << " coordinate " << i;
              }
              zeros += ref[i].var == 0;
              crossings += l1 > 0 && was_zero && ref[i].var != 0;
            }
            const std::vector<float>& accum = *dense->Slots(0)[0];
            const std::vector<float>& linear = *dense->Slots(0)[1];
            for (int i = 0; i < kN; ++i) {
              const FtrlReference& r = ref[i];
              const std::string at =
                  name + " step " + std::to_string(step) + " coordinate " + std::to_string(i);
              // float32 rounding, 1e-6 relative to the scale of what was
              // summed: linear's terms, and for var those plus l1 over
              // quadratic (|var| itself when nothing cancelled).
              const double quadratic = std::pow(r.accum, -lr_power) / 0.5 + 2 * l2;
              const double scale = (r.linear_magnitude + l1) / quadratic;
              EXPECT_NEAR(w[i], r.var, 1e-6 * scale) << at;
              if (l1 > 0) {
                EXPECT_EQ(w[i] == 0, r.var == 0) << at;  // the threshold
              }
              EXPECT_NEAR(accum[i], r.accum, 1e-6 * r.accum) << at;
              EXPECT_NEAR(linear[i], r.linear, 1e-6 * r.linear_magnitude) << at;
              // Row-wise: the same rule, the same bits.
              EXPECT_EQ(table[i], w[i]) << at;
            }
          }
          const auto row_slots = (*rows)->Slots();
          EXPECT_EQ(*row_slots[0], *dense->Slots(0)[0]) << name;
          EXPECT_EQ(*row_slots[1], *dense->Slots(0)[1]) << name;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 32);
  // The sequences exercise the l1 threshold both ways.
  EXPECT_GT(zeros, 0);
  EXPECT_GT(crossings, 0);
}

TEST(OptimizerTest, FtrlRefusesAPositiveLearningRatePower) {
  OptimizerSpec s;
  s.type = "ftrl";
  s.learning_rate_power = 0.5;
  EXPECT_FALSE(CreateOptimizer(s, {1}).ok());
  EXPECT_FALSE(RowOptimizer::Create(s, 1, 1).ok());
}

// An update is a function of the values alone: the same elements updated as
// one large part (SIMD packets, blocks) and as parts of one element each
// (Eigen's scalar path) end bit for bit equal. (The vectorised rules were
// also compared with the element-by-element build before them: identical
// values and slots for every optimizer over 20 steps of 100003 elements.)
TEST(OptimizerTest, OnePartAndOneElementPerPartAgreeBitForBit) {
  const int64_t n = 3 * 1024 + 13;  // several blocks and a tail shorter than a SIMD packet
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0, 1);
  std::vector<OptimizerSpec> specs(7);
  specs[0].type = "sgd";
  specs[1].type = "momentum";
  specs[1].momentum = 0.9;
  specs[2] = specs[1];
  specs[2].nesterov = true;
  specs[3].type = "adam";
  specs[4].type = "adagrad";
  specs[4].initial_accumulator = 0.1f;
  specs[5].type = "ftrl";
  specs[5].initial_accumulator = 0.1f;
  specs[5].l1 = 0.05f;
  specs[5].l2 = 0.01f;
  specs[6] = specs[5];
  specs[6].learning_rate_power = -0.25;  // the pow path
  for (OptimizerSpec& spec : specs) {
    spec.learning_rate = 0.05;
    auto opt = Make(spec, n);
    auto one_by_one = CreateOptimizer(spec, std::vector<int64_t>(n, 1));
    ASSERT_TRUE(one_by_one.ok());
    std::vector<float> w(n), g(n);
    for (float& x : w) x = normal(rng);
    std::vector<float> w_ref = w;
    for (int64_t step = 1; step <= 6; ++step) {
      for (float& x : g) x = normal(rng) * (step % 3 == 0 ? 100.0f : 1.0f);
      ASSERT_TRUE(opt->Apply(0, w.data(), g.data(), n, step));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE((*one_by_one)->Apply(static_cast<int>(i), &w_ref[i], &g[i], 1, step));
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::memcmp(&w[i], &w_ref[i], sizeof(float)), 0)
            << spec.type << (spec.nesterov ? " (nesterov)" : "") << " step " << step << " element "
            << i << ": " << w[i] << " vs " << w_ref[i];
      }
    }
  }
}

// A non-finite value in the last block refuses the whole update: the blocks
// staged before it leave nothing behind.
TEST(OptimizerTest, NonFiniteInALaterBlockLeavesSlotsUnchanged) {
  OptimizerSpec s;
  s.type = "adam";
  s.learning_rate = 0.01;
  const int64_t n = 4096 + 5;
  auto opt = Make(s, n);
  std::vector<float> w(n, 1.0f), g(n, 0.5f), out(n);
  ASSERT_TRUE(opt->Apply(0, w.data(), g.data(), n, 1));
  const std::vector<float> m_before = *opt->Slots(0)[0], v_before = *opt->Slots(0)[1];
  g[n - 1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(opt->Stage(0, w.data(), g.data(), n, 2, out.data()));
  EXPECT_EQ(*opt->Slots(0)[0], m_before);
  EXPECT_EQ(*opt->Slots(0)[1], v_before);
}

TEST(OptimizerTest, RejectsUnknownTypeAndBadRate) {
  OptimizerSpec s;
  s.type = "rmsprop";
  EXPECT_FALSE(CreateOptimizer(s, {1}).ok());
  s.type = "sgd";
  s.learning_rate = -1;
  EXPECT_FALSE(CreateOptimizer(s, {1}).ok());
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// The row-wise optimizer on the touched rows of a table equals the dense
// optimizer on the whole table (zero gradient elsewhere), bit for bit, and
// leaves the other rows' values and slots untouched. dim 16 is a whole
// number of SIMD packets, so both run the same instructions per element.
TEST(RowOptimizerTest, LazyEqualsDenseOnTouchedRowsAndLeavesOthers) {
  const int64_t rows = 6, dim = 16;
  for (const char* type : {"sgd", "momentum", "adam", "adagrad", "ftrl"}) {
    OptimizerSpec s;
    s.type = type;
    s.learning_rate = 0.05;
    s.l1 = 0.001;
    s.l2 = 0.01;
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> dense(rows * dim);
    for (float& v : dense) v = normal(rng);
    std::vector<float> table = dense;
    auto full = CreateOptimizer(s, {rows * dim});
    ASSERT_TRUE(full.ok());
    auto lazy = RowOptimizer::Create(s, rows, dim);
    ASSERT_TRUE(lazy.ok());
    const std::vector<int64_t> touched = {4, 1};
    const std::vector<float> initial = table;
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> row_grads(touched.size() * dim), dense_grads(rows * dim, 0.0f);
      for (size_t i = 0; i < touched.size(); ++i) {
        for (int64_t k = 0; k < dim; ++k) {
          const float g = normal(rng);
          row_grads[i * dim + k] = g;
          dense_grads[touched[i] * dim + k] = g;
        }
      }
      ASSERT_TRUE((*full)->Apply(0, dense.data(), dense_grads.data(), rows * dim, step));
      std::vector<float> out(touched.size() * dim);
      ASSERT_TRUE((*lazy)->Stage(table.data(), touched, row_grads.data(), step, out.data()));
      (*lazy)->Commit(touched);
      for (size_t i = 0; i < touched.size(); ++i) {
        std::copy_n(out.data() + i * dim, dim, table.data() + touched[i] * dim);
      }
    }
    auto dense_slots = (*full)->Slots(0);
    auto lazy_slots = (*lazy)->Slots();
    ASSERT_EQ(dense_slots.size(), lazy_slots.size()) << type;
    for (int64_t r = 0; r < rows; ++r) {
      const bool hit = r == 1 || r == 4;
      for (int64_t k = 0; k < dim; ++k) {
        const int64_t e = r * dim + k;
        if (hit) {
          EXPECT_EQ(table[e], dense[e]) << type << " row " << r;
          for (size_t j = 0; j < lazy_slots.size(); ++j) {
            EXPECT_EQ((*lazy_slots[j])[e], (*dense_slots[j])[e]) << type << " slot " << j;
          }
        } else {
          EXPECT_EQ(table[e], initial[e]) << type << " untouched row " << r;
        }
      }
    }
    // Untouched slots keep their initial value.
    auto fresh = RowOptimizer::Create(s, rows, dim);
    for (size_t j = 0; j < lazy_slots.size(); ++j) {
      EXPECT_EQ((*lazy_slots[j])[0], (*(*fresh)->Slots()[j])[0]) << type;
    }
  }
}

TEST(RowOptimizerTest, NonFiniteIsReported) {
  OptimizerSpec s;
  s.type = "adagrad";
  auto lazy = RowOptimizer::Create(s, 2, 2);
  ASSERT_TRUE(lazy.ok());
  std::vector<float> table = {1, 2, 3, 4}, grad = {1e30f, 1e30f}, out(2);
  EXPECT_FALSE((*lazy)->Stage(table.data(), {1}, grad.data(), 1, out.data()));
}

TEST(RowOptimizerTest, UnknownTypeNamesTheField) {
  OptimizerSpec s;
  s.type = "rmsprop";
  EXPECT_NE(std::string(RowOptimizer::Create(s, 1, 1).status().message()).find("optimizer.type"),
            std::string::npos);
}

}  // namespace
}  // namespace kubetrain
