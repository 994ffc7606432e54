// The lifecycle scenario table (core/testing/lifecycle_scenarios.h) through
// `kubetrain run`'s JobRunner: fake processes end when the table says, on a
// fake clock; the trace is what the runner did (restarts = processes started
// again, then the outcome). operator/desired_lifecycle_test.cc runs the same
// table through Desired().
#include <atomic>
#include <cstdio>
#include <set>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "cli/fake_launcher.h"
#include "cli/job_runner.h"
#include "core/job_report.h"
#include "core/testing/lifecycle_scenarios.h"

namespace kubetrain {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1800000000);

std::string At(absl::Duration since_start) {
  return absl::StrCat(" @", absl::ToInt64Seconds(since_start));
}

class JobRunnerLifecycleTest : public ::testing::TestWithParam<LifecycleScenario> {};

TEST_P(JobRunnerLifecycleTest, DecidesAsTheTableSays) {
  const LifecycleScenario& s = GetParam();
  auto job = ParseTrainingJob(s.job.dump());
  ASSERT_TRUE(job.ok()) << job.status();
  FakeClock clock(kStart);
  FakeLauncher launcher(&clock);
  for (const ScenarioEvent& e : s.events) {
    launcher.ExitAt(e.task, kStart + absl::Seconds(e.at_seconds), e.exit_code.value_or(137));
  }
  JobResult result;
  result.status = "Succeeded";
  result.global_step = 100;
  launcher.PrintOnExit(JobTask{job->chief_task_type(), 0}.name(), 0, FormatReportLine(result));

  FILE* sink = std::fopen("/dev/null", "w");
  Console console(/*quiet=*/true, sink, &clock);
  std::atomic<bool> give_up{false};  // the table's jobs all end within minutes
  JobRunnerEnv env{&launcher, &clock,
                   [&](absl::Duration d) {
                     clock.Advance(d);
                     if (clock.Now() - kStart > absl::Hours(1)) give_up = true;
                   },
                   &console};
  JobRunnerOptions options;
  options.ps_binary = "/bin/kubetrain-ps";
  options.worker_binary = "/bin/kubetrain-worker";
  options.backoff = kKubeletBackoff;
  std::vector<int> ports;
  for (size_t i = 0; i < 2 * JobTasks(*job).size(); ++i)
    ports.push_back(20000 + static_cast<int>(i));
  JobRunResult r = JobRunner(*job, 100, ports, options, env).Run(&give_up);
  std::fclose(sink);

  std::vector<std::string> trace;
  std::set<std::string> started;
  for (const auto& start : launcher.starts()) {
    if (!started.insert(start.task).second)
      trace.push_back("restart " + start.task + At(start.at - kStart));
  }
  if (r.status == "Succeeded") trace.push_back("succeed" + At(r.decided_after));
  if (r.status == "Failed") {
    trace.push_back(absl::StrCat("fail ", FailureKindName(r.failure.kind), At(r.decided_after)));
  }
  EXPECT_EQ(trace, s.trace) << r.status << ": " << r.reason;
  EXPECT_EQ(r.total_restarts, s.total_restarts);
  EXPECT_EQ(r.replicas["Worker"].restarts, s.worker_restarts);
}

INSTANTIATE_TEST_SUITE_P(Table, JobRunnerLifecycleTest, ::testing::ValuesIn(LifecycleScenarios()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kubetrain
