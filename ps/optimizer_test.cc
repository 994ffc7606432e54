#include "ps/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

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
