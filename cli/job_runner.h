// `kubetrain run`'s driver: starts every task of a TrainingJob as a local
// process (with the same two inputs the operator gives pods: the job file and
// TF_CONFIG), then loops: poll the processes, feed what they did to the job
// lifecycle (core/job_lifecycle.h), carry out its decision (restart a task
// when its backoff is over, end the job), show progress. The chief task's
// stdout carries its report (core/job_report.h).
//
// Processes, time and sleeping come in through JobRunnerEnv, so the whole
// loop runs in unit tests with fake processes on a fake clock
// (job_runner_test.cc, and the lifecycle scenario table that the operator's
// Desired() must agree with).
#ifndef KUBETRAIN_CLI_JOB_RUNNER_H_
#define KUBETRAIN_CLI_JOB_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/console.h"
#include "cli/process.h"
#include "core/clock.h"
#include "core/cluster_spec.h"
#include "core/job_lifecycle.h"
#include "core/job_report.h"
#include "core/job_spec.h"

namespace kubetrain {

struct JobRunnerOptions {
  std::string job_path;       // the job file every task reads (absolute)
  std::string ps_binary;      // kubetrain-ps
  std::string worker_binary;  // kubetrain-worker (worker, chief and evaluator tasks)
  std::string export_model;   // passed to the chief task as --export_model (if set)
  // PS tasks get --bulk_port=0: the bulk data plane on any free port.
  bool bulk_data_plane = false;
  RestartBackoff backoff = kLocalBackoff;
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Stopping: SIGTERM, then SIGKILL after this long.
  absl::Duration stop_grace = absl::Seconds(5);
  // After success the other tasks get this long to exit by themselves (PS
  // tasks do once the chief ends the job) before they are stopped.
  absl::Duration cleanup_grace = absl::Seconds(30);
  // Task name ("worker-1") -> its credentials directory, given to it as
  // KUBETRAIN_AUTH_DIR (cli/local_credentials.h); a task not named gets none.
  std::map<std::string, std::string> auth_dirs;
  // The directory with the job key that the export command shown for PS
  // tasks holding their parameters passes as --auth-dir ("": none).
  std::string export_auth_dir;
};

// What the runner uses and does not own.
struct JobRunnerEnv {
  ProcessLauncher* launcher = nullptr;
  const Clock* clock = nullptr;
  std::function<void(absl::Duration)> sleep;  // waits (a fake clock's test advances itself)
  Console* console = nullptr;
};

struct TaskOutcome {
  std::string name;  // "worker-1"
  int exit_code = -1;
  int restarts = 0;
};

struct JobRunResult {
  std::string status;  // "Succeeded" | "Failed" | "Interrupted"
  std::string reason;  // why, unless Succeeded
  Failure failure;     // the lifecycle's, when it failed the job
  // When the outcome was decided, from the start (wall_seconds also counts
  // the tasks' stopping).
  absl::Duration decided_after;
  double wall_seconds = 0;
  std::optional<JobResult> result;   // the chief's report, if it gave one
  std::optional<Progress> progress;  // the chief's last progress report, if any
  // The PS tasks' figures at the end: the result's (FinalProgress), else the
  // last progress report's (a job that failed), else none.
  Progress LastKnown() const;
  std::vector<TaskOutcome> tasks;  // JobTasks order
  std::map<std::string, ReplicaCounts> replicas;
  int64_t total_restarts = 0;
  // PS tasks that could not write their final checkpoint and held the
  // parameters read-only (kHoldingParametersNote), and the command that
  // saves them while they do (shown while kubetrain run waited for them).
  std::vector<std::string> holding_tasks;
  std::string export_command;

  // 0 Succeeded, 130 Interrupted, 1 otherwise.
  int ExitCode() const;
};

class JobRunner {
 public:
  // `ports`: two per task in JobTasks order (its TF_CONFIG port, its metrics
  // port). `target_steps` is only shown. Restart policies are the job's
  // (apply a --restart-policy override to `job` first).
  JobRunner(TrainingJob job, int64_t target_steps, std::vector<int> ports, JobRunnerOptions options,
            JobRunnerEnv env);
  ~JobRunner();

  // Runs the job to its end; *interrupted (may be null) stops it early.
  JobRunResult Run(const std::atomic<bool>* interrupted);

 private:
  struct Task;
  absl::Status StartTask(Task& t);
  // SIGTERM to every task, SIGKILL after stop_grace -- except PS tasks that
  // hold the parameters they could not checkpoint: unless the run was
  // interrupted, the user is told the export command and they are waited
  // for until they exit by themselves (their grace) or Ctrl-C.
  void StopAll(const std::atomic<bool>* interrupted, JobRunResult* out);
  std::vector<std::string> HoldingTasks() const;
  void Announce(const Restart& r, Task& t);
  std::string ProgressLine(absl::Time start) const;

  // Constant after construction.
  const TrainingJob job_;
  const int64_t target_steps_;
  const JobRunnerOptions options_;
  const JobRunnerEnv env_;
  std::vector<std::unique_ptr<Task>> tasks_;

  // The chief's report, written by its output reader thread.
  mutable absl::Mutex report_mu_;
  std::optional<Progress> progress_ ABSL_GUARDED_BY(report_mu_);
  std::optional<JobResult> result_ ABSL_GUARDED_BY(report_mu_);
  // Each task's last "error: ..." log line (without the prefix), by task
  // name: restarts and the failure reason say why, not only the exit code.
  std::map<std::string, std::string> last_errors_ ABSL_GUARDED_BY(report_mu_);
  // PS tasks that logged kHoldingParametersNote.
  std::set<std::string> holding_ ABSL_GUARDED_BY(report_mu_);
  std::string LastError(const std::string& task) const;
};

// The --summary-json document: the chief's JobResult (snake_case, its own
// `wall_seconds` as `training_seconds`) plus what only the launcher knows:
// name, status, reason, model, task counts, target_steps, wall_seconds,
// exit_codes, restarts (per task) and total_restarts (and export_command
// when PS tasks held the parameters for an export). Without a result (the
// job failed), absent_workers and the checkpoint_* fields come from the last
// progress report.
nlohmann::json SummaryJson(const TrainingJob& job, int64_t target_steps, const JobRunResult& r);
// The summary printed at the end (README.md shows it), with a "storage:"
// line when checkpoint writes failed and the absent workers when there are.
std::string SummaryText(const TrainingJob& job, int64_t target_steps, const JobRunResult& r);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_JOB_RUNNER_H_
