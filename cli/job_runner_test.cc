#include "cli/job_runner.h"

#include <signal.h>

#include <cstdio>
#include <map>

#include <gtest/gtest.h>

#include "cli/fake_launcher.h"
#include "core/job_report.h"
#include "core/testing/temp_files.h"

namespace kubetrain {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1800000000);

TrainingJob Job(const std::string& extra_replicas = "",
                const std::string& worker_policy = "Never") {
  auto job = ParseTrainingJob(
      "apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: {name: mnist}\nspec:\n"
      "  replicaSpecs:\n    PS: {replicas: 2}\n    Worker: {replicas: 2, restartPolicy: " +
      worker_policy + "}\n" + extra_replicas +
      "  training: {mode: sync, model: {type: softmax}, steps: 100}\n");
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

JobResult Result() {
  JobResult r;
  r.status = "Succeeded";
  r.mode = "sync";
  r.global_step = 100;
  r.target_steps = 100;
  r.test_accuracy = 0.81;
  r.final_loss = 0.5;
  r.wall_seconds = 12.5;
  r.examples_per_second = 900;
  r.model_path = "/tmp/m.ktm";
  return r;
}

// A JobRunner on fake processes and a fake clock, with its console captured.
class JobRunnerTest : public ::testing::Test {
 protected:
  JobRunnerTest()
      : clock_(kStart), launcher_(&clock_), out_(std::tmpfile()), console_(false, out_, &clock_) {
    options_.ps_binary = "/bin/kubetrain-ps";
    options_.worker_binary = "/bin/kubetrain-worker";
    options_.job_path = "/jobs/mnist.yaml";
  }
  ~JobRunnerTest() override { std::fclose(out_); }

  JobRunResult Run(const TrainingJob& job, const std::atomic<bool>* interrupted = nullptr) {
    std::vector<int> ports;
    for (size_t i = 0; i < 2 * JobTasks(job).size(); ++i)
      ports.push_back(30000 + static_cast<int>(i));
    JobRunnerEnv env{&launcher_, &clock_, [this](absl::Duration d) { clock_.Advance(d); },
                     &console_};
    return JobRunner(job, 100, ports, options_, env).Run(interrupted);
  }
  std::string Output() {
    std::fflush(out_);
    std::rewind(out_);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), out_)) > 0) text.append(buf, n);
    return text;
  }
  absl::Time At(int seconds) const { return kStart + absl::Seconds(seconds); }

  FakeClock clock_;
  FakeLauncher launcher_;
  FILE* out_;
  Console console_;
  JobRunnerOptions options_;
};

TEST_F(JobRunnerTest, StartsEveryReplicaTypeWithItsBinaryFlagsAndTfConfig) {
  options_.export_model = "/tmp/out.ktm";
  options_.auth_dirs = {{"ps-1", "/auth/ps-1"}, {"chief-0", "/auth/chief-0"}};
  TrainingJob job = Job("    Chief: {replicas: 1}\n    Evaluator: {replicas: 1}\n");
  launcher_.PrintOnExit("chief-0", 0, FormatReportLine(Result()));
  launcher_.ExitAt("chief-0", At(5), 0);
  Run(job);
  std::map<std::string, ProcessSpec> specs;
  for (const auto& s : launcher_.starts()) specs[s.task] = s.spec;
  ASSERT_EQ(specs.size(), 6u);
  EXPECT_EQ(specs["ps-1"].argv, (std::vector<std::string>{
                                    "/bin/kubetrain-ps", "--config=/jobs/mnist.yaml",
                                    "--metrics_address=127.0.0.1:30005", "--bind_host=127.0.0.1"}));
  EXPECT_EQ(specs["chief-0"].argv,
            (std::vector<std::string>{"/bin/kubetrain-worker", "--config=/jobs/mnist.yaml",
                                      "--metrics_address=127.0.0.1:30001",
                                      "--export_model=/tmp/out.ktm"}));
  EXPECT_EQ(specs["worker-0"].argv.size(), 3u);  // not the chief: no --export_model
  EXPECT_EQ(specs["evaluator-0"].argv[0], "/bin/kubetrain-worker");
  auto tf = ParseTfConfig(specs["evaluator-0"].env["TF_CONFIG"]);
  ASSERT_TRUE(tf.ok()) << tf.status();
  EXPECT_EQ(tf->task_type, "evaluator");
  EXPECT_EQ(tf->tasks("chief"), std::vector<std::string>{"127.0.0.1:30000"});
  EXPECT_EQ(tf->tasks("ps"), (std::vector<std::string>{"127.0.0.1:30002", "127.0.0.1:30004"}));
  EXPECT_EQ(tf->tasks("worker"), (std::vector<std::string>{"127.0.0.1:30006", "127.0.0.1:30008"}));
  EXPECT_EQ(tf->self_address(), "127.0.0.1:30010");
  // Each task its own credentials directory; a task without one gets none.
  EXPECT_EQ(specs["ps-1"].env["KUBETRAIN_AUTH_DIR"], "/auth/ps-1");
  EXPECT_EQ(specs["chief-0"].env["KUBETRAIN_AUTH_DIR"], "/auth/chief-0");
  EXPECT_EQ(specs["worker-0"].env.count("KUBETRAIN_AUTH_DIR"), 0u);
  EXPECT_CONTAINS(Output(),
                  "kubetrain run: mnist (sync, softmax, 1 chief, 2 PS, 2 workers, 1 evaluator, "
                  "100 global steps)");
}

TEST_F(JobRunnerTest, TheChiefsReportMakesTheSummary) {
  TrainingJob job = Job();
  Progress p;
  p.global_step = 40;
  p.target_steps = 100;
  p.loss = 0.7;
  launcher_.PrintOnExit("worker-0", 0, FormatReportLine(p));
  launcher_.PrintOnExit("worker-0", 0, "worker:0 done");
  launcher_.PrintOnExit("worker-0", 0, FormatReportLine(Result()));
  launcher_.ExitAt("worker-0", At(20), 0);
  for (const char* t : {"worker-1", "ps-0", "ps-1"}) launcher_.ExitAt(t, At(21), 0);
  JobRunResult r = Run(job);
  EXPECT_EQ(r.status, "Succeeded");
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_EQ(r.decided_after, absl::Seconds(20));
  EXPECT_NEAR(r.wall_seconds, 21, 0.2);  // the others exited by themselves
  ASSERT_TRUE(r.result.has_value());
  nlohmann::json s = SummaryJson(job, 100, r);
  EXPECT_EQ(s["status"], "Succeeded");
  EXPECT_EQ(s["test_accuracy"], 0.81);
  EXPECT_EQ(s["global_step"], 100);
  EXPECT_EQ(s["training_seconds"], 12.5);  // the chief's
  EXPECT_NEAR(s["wall_seconds"].get<double>(), 21, 0.2);
  EXPECT_EQ(s["model_path"], "/tmp/m.ktm");
  EXPECT_EQ(s["exit_codes"],
            (nlohmann::json{{"ps-0", 0}, {"ps-1", 0}, {"worker-0", 0}, {"worker-1", 0}}));
  EXPECT_EQ(s["total_restarts"], 0);
  EXPECT_EQ(s["ps"], 2);
  EXPECT_FALSE(s.contains("reason"));
  const std::string out = Output();
  EXPECT_CONTAINS(out, "[worker-0] worker:0 done");
  EXPECT_EQ(out.find("kubetrain-result"), std::string::npos) << out;  // reports are not echoed
  EXPECT_CONTAINS(SummaryText(job, 100, r), "TrainingJob mnist Succeeded in 21.");
  EXPECT_CONTAINS(SummaryText(job, 100, r), "test accuracy 0.8100, final loss 0.5000");
  EXPECT_CONTAINS(SummaryText(job, 100, r), "model: /tmp/m.ktm (kubetrain eval /tmp/m.ktm)");
}

TEST_F(JobRunnerTest, TheSummaryShowsCheckpointFailuresAndAbsentWorkers) {
  TrainingJob job = Job();
  JobResult result = Result();
  result.checkpoint_failures = 2;
  result.checkpoints_failing = 0;
  result.checkpoint_error = "ps:1 at version 40: cannot create /ckpt/x: Read-only file system";
  result.absent_workers = 1;
  launcher_.PrintOnExit("worker-0", 0, FormatReportLine(result));
  launcher_.ExitAt("worker-0", At(20), 0);
  for (const char* t : {"worker-1", "ps-0", "ps-1"}) launcher_.ExitAt(t, At(21), 0);
  JobRunResult r = Run(job);
  ASSERT_EQ(r.status, "Succeeded");
  nlohmann::json s = SummaryJson(job, 100, r);
  EXPECT_EQ(s["checkpoint_failures"], 2);
  EXPECT_EQ(s["checkpoints_failing"], 0);
  EXPECT_EQ(s["checkpoint_error"], result.checkpoint_error);
  EXPECT_EQ(s["absent_workers"], 1);
  const std::string text = SummaryText(job, 100, r);
  EXPECT_CONTAINS(text,
                  "  storage: 2 checkpoint writes failed, the latest ones written; last: ps:1 at "
                  "version 40: cannot create /ckpt/x: Read-only file system\n");
  EXPECT_CONTAINS(text, "  absent workers: 1 (missed a barrier");
}

// Dynamic tables: how many rows the PS tasks held at the end and how many
// maxRows evicted, in the summary JSON and as a line; no line without them.
TEST_F(JobRunnerTest, TheSummaryShowsDynamicTableRows) {
  JobRunResult r;
  r.status = "Succeeded";
  r.result = Result();
  EXPECT_EQ(SummaryText(Job(), 100, r).find("dynamic tables"), std::string::npos);
  r.result->dynamic_rows = 504;
  r.result->dynamic_rows_evicted = 3;
  EXPECT_CONTAINS(SummaryText(Job(), 100, r),
                  "  dynamic tables: 504 rows held, 3 evicted (maxRows)\n");
  nlohmann::json s = SummaryJson(Job(), 100, r);
  EXPECT_EQ(s["dynamic_rows"], 504);
  EXPECT_EQ(s["dynamic_rows_evicted"], 3);
}

TEST_F(JobRunnerTest, AFailedJobsSummaryShowsTheLastReportedCheckpointFailures) {
  Progress p;
  p.global_step = 40;
  p.target_steps = 100;
  p.checkpoint_failures = 5;
  p.checkpoints_failing = 2;
  p.checkpoint_error = "ps:0 at version 40: cannot create /ckpt/y: No space left on device";
  launcher_.PrintOnExit("worker-0", 1, FormatReportLine(p));
  launcher_.ExitAt("worker-0", At(4), 1);
  JobRunResult r = Run(Job());
  ASSERT_EQ(r.status, "Failed");
  nlohmann::json s = SummaryJson(Job(), 100, r);
  EXPECT_FALSE(s.contains("global_step"));
  EXPECT_EQ(s["checkpoint_failures"], 5);
  EXPECT_EQ(s["checkpoints_failing"], 2);
  EXPECT_EQ(s["checkpoint_error"], p.checkpoint_error);
  EXPECT_CONTAINS(SummaryText(Job(), 100, r),
                  "  storage: 5 checkpoint writes failed, 2 PS tasks failing now; last: ps:0 at "
                  "version 40: cannot create /ckpt/y: No space left on device\n");
  // Without failures there is no storage line.
  JobRunResult clean;
  clean.status = "Succeeded";
  clean.result = Result();
  EXPECT_EQ(SummaryText(Job(), 100, clean).find("storage:"), std::string::npos);
  EXPECT_EQ(SummaryText(Job(), 100, clean).find("absent workers"), std::string::npos);
}

TEST_F(JobRunnerTest, TasksStillRunningAfterTheGraceAreStopped) {
  launcher_.PrintOnExit("worker-0", 0, FormatReportLine(Result()));
  launcher_.ExitAt("worker-0", At(20), 0);
  JobRunResult r = Run(Job());
  EXPECT_EQ(r.status, "Succeeded");
  EXPECT_EQ(r.tasks[0].name, "ps-0");
  EXPECT_EQ(r.tasks[0].exit_code, 128 + SIGTERM);
  EXPECT_NEAR(r.wall_seconds, 20 + absl::ToDoubleSeconds(options_.cleanup_grace), 0.2);
}

// ps-0 cannot write its final checkpoint and holds the parameters.
constexpr char kHoldLine[] =
    "ps:0 could not write its final checkpoint (version 100) to /ckpt "
    "(spec.training.checkpoint.directory); serving the parameters read-only for `kubetrain "
    "export --from-ps` on 127.0.0.1:30000 for 10m, then exits 1 (SIGTERM again to exit now)";

TEST_F(JobRunnerTest, APsHoldingItsParametersIsKeptAndTheExportCommandShown) {
  launcher_.ExitAt("worker-0", At(5), 1);  // the chief cannot export
  launcher_.HoldOnSigterm("ps-0", kHoldLine);
  launcher_.ExitAt("ps-0", At(5 + 600), 1);  // the hold is over
  options_.export_auth_dir = "/tmp/kubetrain-mnist-auth-x/export";
  JobRunResult r = Run(Job());
  EXPECT_EQ(r.status, "Failed");
  EXPECT_EQ(r.holding_tasks, std::vector<std::string>{"ps-0"});
  EXPECT_EQ(r.export_command,
            "kubetrain export --from-ps 127.0.0.1:30000,127.0.0.1:30002 --job /jobs/mnist.yaml "
            "--output /tmp/mnist-model.ktm --auth-dir /tmp/kubetrain-mnist-auth-x/export");
  EXPECT_GE(r.wall_seconds, 600);  // not killed after stop_grace
  std::map<std::string, int> codes;
  for (const auto& t : r.tasks) codes[t.name] = t.exit_code;
  EXPECT_EQ(codes["ps-0"], 1);
  EXPECT_EQ(codes["ps-1"], 128 + SIGTERM);
  const std::string out = Output();
  EXPECT_NE(out.find("kubetrain run: ps-0 could not write the final checkpoint"), std::string::npos)
      << out;
  EXPECT_NE(out.find("  " + r.export_command + "\n"), std::string::npos) << out;
  EXPECT_EQ(SummaryJson(Job(), 100, r)["export_command"], r.export_command);
  EXPECT_NE(SummaryText(Job(), 100, r).find("  parameters: ps-0 could not write"),
            std::string::npos);
}

TEST_F(JobRunnerTest, CtrlCWhileAPsHoldsItsParametersStopsItAtOnce) {
  std::atomic<bool> interrupted{false};
  launcher_.ExitAt("worker-0", At(5), 1);
  launcher_.HoldOnSigterm("ps-0", kHoldLine);
  JobRunnerEnv env{&launcher_, &clock_,
                   [&](absl::Duration d) {
                     clock_.Advance(d);
                     if (clock_.Now() >= At(60)) interrupted = true;
                   },
                   &console_};
  std::vector<int> ports(8, 1);
  JobRunResult r = JobRunner(Job(), 100, ports, options_, env).Run(&interrupted);
  EXPECT_EQ(r.status, "Failed");
  EXPECT_EQ(r.tasks[0].name, "ps-0");
  EXPECT_EQ(r.tasks[0].exit_code, 1);  // the second SIGTERM
  EXPECT_LT(r.wall_seconds, 70);
}

TEST_F(JobRunnerTest, AnInterruptedRunDoesNotWaitForAHoldingPs) {
  std::atomic<bool> interrupted{true};
  launcher_.HoldOnSigterm("ps-0", kHoldLine);
  JobRunResult r = Run(Job(), &interrupted);
  EXPECT_EQ(r.status, "Interrupted");
  EXPECT_EQ(r.tasks[0].exit_code, 128 + SIGKILL);
  EXPECT_TRUE(r.export_command.empty());
}

TEST_F(JobRunnerTest, AChiefWithoutAResultFailsTheJob) {
  launcher_.ExitAt("worker-0", At(3), 0);
  JobRunResult r = Run(Job());
  EXPECT_EQ(r.status, "Failed");
  EXPECT_EQ(r.reason, "the chief (worker-0) exited without reporting a result");
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_FALSE(SummaryJson(Job(), 100, r).contains("global_step"));
}

TEST_F(JobRunnerTest, RestartsAreAnnouncedAndCounted) {
  launcher_.PrintOnExit("worker-0", 0, FormatReportLine(Result()));
  launcher_.ExitAt("worker-1", At(5), 137);
  launcher_.ExitAt("worker-1", At(8), 137);
  launcher_.ExitAt("worker-0", At(30), 0);
  JobRunResult r = Run(Job("", "ExitCode"));
  EXPECT_EQ(r.status, "Succeeded");
  const std::string out = Output();
  EXPECT_CONTAINS(out,
                  "kubetrain run: worker-1 exited with code 137; restarting in 500ms (restart 1, "
                  "restartPolicy ExitCode)");
  EXPECT_CONTAINS(out,
                  "kubetrain run: worker-1 exited with code 137; restarting in 1s (restart 2, "
                  "restartPolicy ExitCode)");
  std::vector<absl::Time> restarts;
  for (const auto& s : launcher_.starts()) {
    if (s.task == "worker-1") restarts.push_back(s.at);
  }
  EXPECT_EQ(restarts, (std::vector<absl::Time>{At(0), At(5) + absl::Milliseconds(500), At(9)}));
  nlohmann::json s = SummaryJson(Job(), 100, r);
  EXPECT_EQ(s["restarts"]["worker-1"], 2);
  EXPECT_EQ(s["total_restarts"], 2);
}

TEST_F(JobRunnerTest, AFailureNamesTheTaskAndStopsTheRest) {
  launcher_.ExitAt("worker-1", At(4), 2);
  JobRunResult r = Run(Job());
  EXPECT_EQ(r.status, "Failed");
  EXPECT_EQ(r.reason, "worker-1 exited with code 2 (restartPolicy Never)");
  EXPECT_EQ(r.failure.kind, FailureKind::kTaskFailed);
  for (const auto& t : r.tasks) {
    EXPECT_EQ(t.exit_code, t.name == "worker-1" ? 2 : 128 + SIGTERM) << t.name;
  }
  EXPECT_EQ(SummaryJson(Job(), 100, r)["reason"], r.reason);
}

TEST_F(JobRunnerTest, ACommandThatCannotStartFailsTheJob) {
  launcher_.FailNextStart("ps-1", absl::NotFoundError("cannot execute /bin/kubetrain-ps"));
  JobRunResult r = Run(Job());
  EXPECT_EQ(r.status, "Failed");
  EXPECT_EQ(r.reason, "starting ps-1: cannot execute /bin/kubetrain-ps");
  EXPECT_EQ(r.tasks[1].exit_code, -1);
}

TEST_F(JobRunnerTest, InterruptStopsEveryTask) {
  std::atomic<bool> interrupted{false};
  launcher_.ExitAt("worker-1", At(2), 0);  // a task that already ended keeps its code
  // Interrupt once the job has run a while: the sleep hook sets it.
  JobRunnerEnv env{&launcher_, &clock_,
                   [&](absl::Duration d) {
                     clock_.Advance(d);
                     if (clock_.Now() >= At(3)) interrupted = true;
                   },
                   &console_};
  std::vector<int> ports(8, 1);
  JobRunResult r = JobRunner(Job(), 100, ports, options_, env).Run(&interrupted);
  EXPECT_EQ(r.status, "Interrupted");
  EXPECT_EQ(r.ExitCode(), 130);
  EXPECT_EQ(r.reason, "stopped by signal");
  for (const auto& t : r.tasks)
    EXPECT_EQ(t.exit_code, t.name == "worker-1" ? 0 : 128 + SIGTERM) << t.name;
}

TEST_F(JobRunnerTest, RestartsAndFailuresSayWhyTheTaskFailed) {
  const std::string why =
      "spec.training.dataset.path: cannot open /nope/train-images-idx3-ubyte.gz: No such file";
  launcher_.PrintOnExit("worker-1", 2, "12:00:00.000 error: " + why);
  launcher_.ExitAt("worker-1", At(4), 2);
  launcher_.ExitAt("worker-1", At(6), 2);
  TrainingJob job = Job("", "OnFailure");
  job.run_policy.backoff_limit = 1;
  JobRunResult r = Run(job);
  EXPECT_EQ(r.status, "Failed");
  EXPECT_CONTAINS(Output(),
                  "kubetrain run: worker-1 exited with code 2; restarting in 500ms "
                  "(restart 1, restartPolicy OnFailure): " +
                      why);
  EXPECT_CONTAINS(r.reason,
                  "worker-1 exited with code 2; backoffLimit (1 restarts) exceeded: " + why);
  EXPECT_EQ(SummaryJson(Job(), 100, r)["reason"], r.reason);
}

}  // namespace
}  // namespace kubetrain
