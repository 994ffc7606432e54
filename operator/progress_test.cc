#include "operator/progress.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

TEST(ProgressTest, ParsesTheChiefsGauges) {
  auto p = ParseProgress(
      "# HELP kubetrain_global_step x\n# TYPE kubetrain_global_step gauge\nkubetrain_global_step 1200\n"
      "kubetrain_training_loss 0.4125\nkubetrain_eval_accuracy 0.8712\n"
      "kubetrain_rpc_duration_seconds_count{method=\"Pull\",side=\"client\"} 5\n");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*p)["globalStep"], 1200);
  EXPECT_DOUBLE_EQ((*p)["loss"].get<double>(), 0.4125);
  EXPECT_DOUBLE_EQ((*p)["accuracy"].get<double>(), 0.8712);
  EXPECT_FALSE(ParseProgress("kubetrain_eval_accuracy 0\n").has_value());
  auto before_eval = ParseProgress("kubetrain_global_step 3\nkubetrain_eval_accuracy 0\n");
  EXPECT_FALSE(before_eval->contains("accuracy"));
}

}  // namespace
}  // namespace kubetrain
