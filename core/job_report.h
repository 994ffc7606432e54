// The chief's report: the one contract for what a job tells the outside world
// while it runs (Progress) and when it ends (JobResult). The chief task writes
// it; `kubetrain run` and the operator read it. Every projection of it is
// derived here, from one field table per struct:
//
//   - the chief's stdout lines  "kubetrain-progress {json}" / "kubetrain-result {json}"
//     and its termination message (/dev/termination-log): snake_case JSON;
//   - the `kubetrain run --summary-json` file: snake_case JSON (plus what only
//     the launcher knows: exit codes, restarts);
//   - a TrainingJob's `.status.progress` / `.status.result`: camelCase JSON,
//     as Kubernetes API conventions ask.
//
// Naming rule (documented in docs/trainingjob.md): every field has one
// snake_case name; the camelCase name is derived mechanically
// (`examples_per_second` -> `examplesPerSecond`). Adding a field = one line in
// the field table of job_report.cc; every reader and writer follows.
//
// Live progress is also served as Prometheus metrics by the chief; the names
// the operator reads are the constants below (and nowhere else).
#ifndef KUBETRAIN_CORE_JOB_REPORT_H_
#define KUBETRAIN_CORE_JOB_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kubetrain {

// Metric names read by the operator from the chief's /metrics.
inline constexpr char kGlobalStepMetric[] = "kubetrain_global_step";
inline constexpr char kTrainingLossMetric[] = "kubetrain_training_loss";
inline constexpr char kEvalAccuracyMetric[] = "kubetrain_eval_accuracy";
inline constexpr char kTargetStepsMetric[] = "kubetrain_target_steps";
inline constexpr char kExamplesPerSecondMetric[] = "kubetrain_examples_per_second";
// The chief's view of the PS tasks (from their GetStats), for the operator:
// absent sync workers (most over PS tasks), failed checkpoint writes (summed),
// and the PS tasks whose latest write failed, labelled with the latest
// failure's message (kCheckpointErrorLabel; one series, replaced when the
// message changes; absent until a write has failed).
inline constexpr char kAbsentWorkersMetric[] = "kubetrain_job_absent_workers";
inline constexpr char kCheckpointFailuresMetric[] = "kubetrain_job_checkpoint_failures";
inline constexpr char kCheckpointsFailingMetric[] = "kubetrain_job_checkpoints_failing";
inline constexpr char kCheckpointErrorLabel[] = "last_error";

// In the log line of a PS task that could not write its final checkpoint and
// holds the parameters for an export (ps/ps_task.h); `kubetrain run` keeps
// such a task running and tells the user the export command.
inline constexpr char kHoldingParametersNote[] =
    "serving the parameters read-only for `kubetrain export --from-ps`";
// A PS task's gauge: 1 while it holds them (read by the operator from the PS
// pods it is stopping, to keep them and tell the user how to save the model).
inline constexpr char kHoldingUnsavedParametersMetric[] = "kubetrain_ps_holding_unsaved_parameters";
// How long a PS task holds them by default (kubetrain-ps
// --keep_serving_after_checkpoint_failure_seconds); the operator gives PS pods
// a termination grace period longer than this, so the kubelet does not cut
// the hold short.
inline constexpr int64_t kDefaultKeepServingAfterCheckpointFailureSeconds = 600;

// Stdout tags of the chief's report lines.
inline constexpr char kProgressTag[] = "kubetrain-progress";
inline constexpr char kResultTag[] = "kubetrain-result";

enum class NameStyle { kSnake, kCamel };

// "examples_per_second" -> "examplesPerSecond".
std::string CamelCase(const std::string& snake);

// Where a running job is. Optional fields are absent until known.
struct Progress {
  int64_t global_step = 0;
  int64_t target_steps = 0;
  std::optional<double> loss;
  std::optional<double> examples_per_second;
  std::optional<double> accuracy;  // test accuracy at the last evaluation
  // Sync workers the PS tasks no longer wait for: they missed a barrier
  // (barrierTimeoutSeconds) and have not pushed since.
  int64_t absent_workers = 0;
  // Checkpoint writes of the PS tasks (docs/trainingjob.md, "Full, read-only
  // and failing disks"): failed ones, summed over PS tasks since they started;
  // PS tasks whose latest write failed; the latest failure's message, naming
  // the task, the version and the OS error ("" if none failed).
  int64_t checkpoint_failures = 0;
  int64_t checkpoints_failing = 0;
  std::string checkpoint_error;
};

// How a job ended, as the chief saw it.
struct JobResult {
  std::string status;  // "Succeeded" (the chief reports only success)
  std::string mode;    // "sync" | "async"
  int64_t global_step = 0;
  int64_t target_steps = 0;
  double test_accuracy = -1;  // < 0: not evaluated
  // Per head (core/model.h EvalMetrics): binary labels AUC and log loss,
  // regression RMSE; absent when the head has no such figure.
  std::optional<double> test_auc;
  std::optional<double> test_log_loss;
  std::optional<double> test_rmse;
  int64_t records_skipped = 0;  // bad data records dropped (onBadRecord: skip), train + test
  double final_loss = 0;
  double wall_seconds = 0;  // the chief's training time
  double examples_per_second = 0;
  int64_t gradients_applied = 0;
  int64_t stale_gradients_dropped = 0;
  int64_t pushes_rejected = 0;
  int64_t barrier_timeouts = 0;
  int64_t restored_version = 0;
  int64_t steps_lost = 0;
  int64_t ps_restarts_seen = 0;
  int64_t max_staleness = 0;
  double mean_staleness = 0;
  std::string model_path;           // where the chief exported the final model ("" = not exported)
  int64_t export_failures = 0;      // failed attempts at writing it before it was written
  int64_t absent_workers = 0;       // as in Progress, when the chief ended the job
  int64_t checkpoint_failures = 0;  // as in Progress, when the chief ended the job
  int64_t checkpoints_failing = 0;
  std::string checkpoint_error;
  // Dynamic tables, summed over tables and PS tasks when the chief ended the
  // job: rows held, and rows evicted to keep them within maxRows.
  int64_t dynamic_rows = 0;
  int64_t dynamic_rows_evicted = 0;
};

// One line on the PS tasks' checkpoint writes, "" if none failed:
// "3 checkpoint writes failed, 1 PS task failing now; last: ps:0 at version
// 400: <path>: No space left on device" (the summary's storage line, the
// operator's CheckpointFailing condition).
std::string CheckpointHealthText(int64_t failures, int64_t failing, const std::string& error);

nlohmann::json ToJson(const Progress& p, NameStyle style = NameStyle::kSnake);
nlohmann::json ToJson(const JobResult& r, NameStyle style = NameStyle::kSnake);

// Reads either naming style. Unknown keys are ignored (a newer chief may
// report more); a known key of the wrong JSON type is an error naming it.
absl::StatusOr<Progress> ProgressFromJson(const nlohmann::json& j);
absl::StatusOr<JobResult> JobResultFromJson(const nlohmann::json& j);

// The progress a JobResult implies (its final figures), e.g. for
// `.status.progress` once a job has succeeded.
Progress FinalProgress(const JobResult& r);

// "kubetrain-progress {json}" / "kubetrain-result {json}" (no newline).
std::string FormatReportLine(const Progress& p);
std::string FormatReportLine(const JobResult& r);

// A line of the chief's stdout: which report it carries, if any.
struct ReportLine {
  std::optional<Progress> progress;
  std::optional<JobResult> result;
};
// nullopt if the line is not a report line (ordinary output); a tagged line
// whose JSON does not parse is not a report line either.
std::optional<ReportLine> ParseReportLine(const std::string& line);

// Progress from Prometheus text exposition (the chief's /metrics, the
// metrics named above); nullopt if the text has no kGlobalStepMetric sample.
std::optional<Progress> ProgressFromMetrics(const std::string& metrics_text);

// The value of the first sample of metric `name` (any labels) in Prometheus
// text exposition; nullopt if there is none.
std::optional<double> MetricValue(const std::string& metrics_text, const std::string& name);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_JOB_REPORT_H_
