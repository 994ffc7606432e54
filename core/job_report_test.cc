#include "core/job_report.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

JobResult SampleResult() {
  JobResult r;
  r.status = "Succeeded";
  r.mode = "sync";
  r.global_step = 3750;
  r.target_steps = 3750;
  r.test_accuracy = 0.8843;
  r.final_loss = 0.25;
  r.wall_seconds = 21.5;
  r.examples_per_second = 22489;
  r.gradients_applied = 7500;
  r.stale_gradients_dropped = 3;
  r.steps_lost = 7;
  r.mean_staleness = 0.5;
  r.model_path = "/tmp/model.ktm";
  return r;
}

TEST(JobReportTest, CamelCaseIsDerived) {
  EXPECT_EQ(CamelCase("examples_per_second"), "examplesPerSecond");
  EXPECT_EQ(CamelCase("loss"), "loss");
  EXPECT_EQ(CamelCase("ps_restarts_seen"), "psRestartsSeen");
}

TEST(JobReportTest, ResultRoundTripsInBothStyles) {
  for (NameStyle style : {NameStyle::kSnake, NameStyle::kCamel}) {
    nlohmann::json j = ToJson(SampleResult(), style);
    auto back = JobResultFromJson(j);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(ToJson(*back), ToJson(SampleResult()));
  }
  nlohmann::json camel = ToJson(SampleResult(), NameStyle::kCamel);
  EXPECT_TRUE(camel.contains("examplesPerSecond"));
  EXPECT_TRUE(camel.contains("staleGradientsDropped"));
  EXPECT_FALSE(camel.contains("examples_per_second"));
  nlohmann::json snake = ToJson(SampleResult());
  EXPECT_EQ(snake["test_accuracy"], 0.8843);
  EXPECT_EQ(snake["model_path"], "/tmp/model.ktm");
}

TEST(JobReportTest, ProgressOmitsUnknownFields) {
  Progress p;
  p.global_step = 10;
  p.target_steps = 100;
  p.loss = 1.5;
  nlohmann::json j = ToJson(p);
  EXPECT_FALSE(j.contains("accuracy"));
  EXPECT_FALSE(j.contains("examples_per_second"));
  EXPECT_EQ(j["loss"], 1.5);
  auto back = ProgressFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->accuracy.has_value());
  EXPECT_EQ(back->global_step, 10);
}

TEST(JobReportTest, WrongTypeNamesTheField) {
  auto r = JobResultFromJson({{"global_step", "many"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("global_step"), std::string::npos) << r.status();
  EXPECT_FALSE(JobResultFromJson(nlohmann::json::array()).ok());
}

TEST(JobReportTest, UnknownKeysAreIgnored) {
  auto r = JobResultFromJson({{"global_step", 5}, {"from_the_future", true}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->global_step, 5);
}

TEST(JobReportTest, ReportLinesRoundTrip) {
  Progress p;
  p.global_step = 42;
  p.accuracy = 0.5;
  auto line = ParseReportLine(FormatReportLine(p));
  ASSERT_TRUE(line.has_value());
  ASSERT_TRUE(line->progress.has_value());
  EXPECT_EQ(line->progress->global_step, 42);
  EXPECT_EQ(*line->progress->accuracy, 0.5);

  auto result = ParseReportLine(FormatReportLine(SampleResult()));
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->result.has_value());
  EXPECT_EQ(result->result->global_step, 3750);

  EXPECT_FALSE(ParseReportLine("worker:0 step 5").has_value());
  EXPECT_FALSE(ParseReportLine("kubetrain-progress {not json").has_value());
  EXPECT_FALSE(ParseReportLine("kubetrain-progressive {}").has_value());
}

TEST(JobReportTest, FinalProgressProjectsTheResult) {
  Progress p = FinalProgress(SampleResult());
  EXPECT_EQ(p.global_step, 3750);
  EXPECT_EQ(*p.accuracy, 0.8843);
  EXPECT_EQ(*p.loss, 0.25);
  JobResult unevaluated;
  EXPECT_FALSE(FinalProgress(unevaluated).accuracy.has_value());
}

TEST(JobReportTest, ProgressFromMetricsText) {
  const std::string text =
      "# HELP kubetrain_global_step Global step\n"
      "# TYPE kubetrain_global_step gauge\n"
      "kubetrain_global_step 120\n"
      "kubetrain_target_steps 3750\n"
      "kubetrain_training_loss 0.75\n"
      "kubetrain_eval_accuracy 0\n"
      "kubetrain_rpc_duration_seconds_count{method=\"Pull\",side=\"client\"} 9\n";
  auto p = ProgressFromMetrics(text);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->global_step, 120);
  EXPECT_EQ(p->target_steps, 3750);
  EXPECT_EQ(*p->loss, 0.75);
  EXPECT_FALSE(p->accuracy.has_value());  // 0 = not evaluated yet
  auto evaluated = ProgressFromMetrics("kubetrain_global_step 5\nkubetrain_eval_accuracy 0.8\n");
  ASSERT_TRUE(evaluated.has_value());
  EXPECT_EQ(*evaluated->accuracy, 0.8);
  EXPECT_FALSE(ProgressFromMetrics("kubetrain_training_loss 1\n").has_value());
}

TEST(JobReportTest, MetricValueReadsOneMetricByItsWholeName) {
  const std::string text =
      "# HELP kubetrain_ps_holding_unsaved_parameters x\n"
      "kubetrain_ps_holding_unsaved_parameters_other 7\n"
      "kubetrain_ps_holding_unsaved_parameters 1\n"
      "kubetrain_table_rows{table=\"ids\"} 12\n";
  EXPECT_EQ(MetricValue(text, kHoldingUnsavedParametersMetric), 1.0);
  EXPECT_EQ(MetricValue(text, "kubetrain_table_rows"), 12.0);
  EXPECT_FALSE(MetricValue(text, "kubetrain_global_step").has_value());
  EXPECT_FALSE(MetricValue("", kHoldingUnsavedParametersMetric).has_value());
}

TEST(JobReportTest, StorageHealthAndAbsentWorkersTravelThroughEveryProjection) {
  JobResult r = SampleResult();
  r.absent_workers = 1;
  r.checkpoint_failures = 3;
  r.checkpoints_failing = 1;
  r.checkpoint_error = "ps:0 at version 400: cannot create /ckpt/x: No space left on device";
  nlohmann::json camel = ToJson(r, NameStyle::kCamel);
  EXPECT_EQ(camel["checkpointFailures"], 3);
  EXPECT_EQ(camel["checkpointsFailing"], 1);
  EXPECT_EQ(camel["checkpointError"], r.checkpoint_error);
  EXPECT_EQ(camel["absentWorkers"], 1);
  auto back = JobResultFromJson(camel);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->checkpoint_error, r.checkpoint_error);
  Progress p = FinalProgress(r);
  EXPECT_EQ(p.absent_workers, 1);
  EXPECT_EQ(p.checkpoint_failures, 3);
  EXPECT_EQ(p.checkpoints_failing, 1);
  EXPECT_EQ(p.checkpoint_error, r.checkpoint_error);
  auto line = ParseReportLine(FormatReportLine(p));
  ASSERT_TRUE(line.has_value() && line->progress.has_value());
  EXPECT_EQ(line->progress->checkpoint_error, r.checkpoint_error);
  auto wrong = ProgressFromJson({{"checkpoint_error", 5}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("progress.checkpoint_error: expected a string"),
            std::string::npos)
      << wrong.status();
}

TEST(JobReportTest, CheckpointHealthTextSaysHowManyAndTheLastError) {
  EXPECT_EQ(CheckpointHealthText(0, 0, ""), "");
  EXPECT_EQ(CheckpointHealthText(3, 1, "ps:0 at version 400: x: No space left on device"),
            "3 checkpoint writes failed, 1 PS task failing now; last: ps:0 at version 400: x: No "
            "space left on device");
  EXPECT_EQ(CheckpointHealthText(1, 0, "ps:1 at version 9: y: Read-only file system"),
            "1 checkpoint write failed, the latest ones written; last: ps:1 at version 9: y: "
            "Read-only file system");
  EXPECT_EQ(CheckpointHealthText(4, 2, ""), "4 checkpoint writes failed, 2 PS tasks failing now");
}

TEST(JobReportTest, ProgressFromMetricsReadsTheChiefsViewOfThePsTasks) {
  const std::string text =
      "kubetrain_global_step 120\n"
      "kubetrain_job_absent_workers 1\n"
      "kubetrain_job_checkpoint_failures 2\n"
      "# a label value with a comma, an escaped quote, a backslash and a newline\n"
      "kubetrain_job_checkpoints_failing{last_error=\"ps:0 at version 4: a, \\\"b\\\" "
      "c\\\\d\\ne: No space left on device\"} 1\n";
  auto p = ProgressFromMetrics(text);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->absent_workers, 1);
  EXPECT_EQ(p->checkpoint_failures, 2);
  EXPECT_EQ(p->checkpoints_failing, 1);
  EXPECT_EQ(p->checkpoint_error, "ps:0 at version 4: a, \"b\" c\\d\ne: No space left on device");
  // An empty label set, a timestamp, and a label value never closed (ignored).
  auto q = ProgressFromMetrics(
      "kubetrain_global_step{} 7 1700000000000\n"
      "kubetrain_job_checkpoints_failing{last_error=\"never closed} 1\n");
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->global_step, 7);
  EXPECT_EQ(q->checkpoints_failing, 0);
  EXPECT_EQ(q->checkpoint_error, "");
}

}  // namespace
}  // namespace kubetrain
