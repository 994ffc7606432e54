// One kubetrain-worker task as an object, for each TF_CONFIG task type it
// runs (core/job_spec.h IsChiefTask says which task is the chief):
//
//   worker     trains its shard of the data (worker/trainer.h Train); worker
//              0 of a job without a Chief replica is also the chief;
//   chief      the Chief replica's task: a coordinator that computes no
//              gradients (Follow): evaluates, exports, reports, ends the job;
//   evaluator  evaluates at evaluation boundaries and at the end (Follow);
//              never ends the job; done when training is.
//
// The chief reports on `report_sink` (stdout by default) with the contract of
// core/job_report.h: "kubetrain-progress {json}" lines while the job runs,
// one "kubetrain-result {json}" line at the end (also written to
// options.result_file), and the gauges the operator reads from /metrics.
//
// main() turns flags into options and exits with 2 if Create fails (a
// configuration error: the task, its data, its metrics address) and with 1 if
// Run fails.
#ifndef KUBETRAIN_WORKER_WORKER_TASK_H_
#define KUBETRAIN_WORKER_WORKER_TASK_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/family.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/job_report.h"
#include "core/metrics.h"
#include "core/task_config.h"
#include "ps/shard_channel.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace prometheus {
class Gauge;
class Registry;
}  // namespace prometheus

namespace kubetrain {

struct WorkerTaskOptions {
  std::string metrics_address = "0.0.0.0:9090";  // "" = no /metrics
  std::string result_file;                       // chief: also write the final result JSON here
  absl::Duration progress_interval = absl::Seconds(1);  // chief: report this often
  absl::Duration step_delay = absl::ZeroDuration();     // sleep before every step (a straggler)
  bool overlap_layers = false;                          // TrainerOptions::overlap_layers
  // Chief: write the final model here ("" = <checkpoint.directory>/model.ktm
  // when checkpoints are on, else nowhere).
  std::string export_model;
  // How the export is retried; its env also probes the directory at Create.
  ExportPolicy export_policy;
  // The chief's report lines, without newline ("" default: stdout, flushed).
  std::function<void(const std::string& line)> report_sink;
  // Threads a step (and an evaluation) computes on (Model::SetThreads); 0:
  // as many as this process's CPU limit allows (ThreadsFromCpuLimit,
  // core/thread_pool.h); kThreadsFromJob: the task's replica's
  // (ReplicaSpec::threads: the whole cores of the runtime container's CPU
  // limit in the job's pod template, else 1), so a job gives the same bits
  // under `kubetrain run` and on Kubernetes. A given count gives the same bits
  // on every run; 1 keeps the single-threaded bits of older releases.
  static constexpr int kThreadsFromJob = -1;
  int threads = kThreadsFromJob;
};

// Data already opened (e.g. shared by tasks in one process; in memory:
// InMemoryTrainingSet); a null one is opened from the job's dataset section
// when the task needs it. Workers stream the training set (core/dataset.h).
struct WorkerData {
  std::shared_ptr<const TrainingSet> train;
  std::shared_ptr<const Dataset> test;
};

class WorkerTask {
 public:
  // Checks the task type, registers its metrics in `registry` and serves
  // them, and loads the data it needs. channels[i] talks to ps task i.
  // `clock` must outlive the task. Errors are configuration errors.
  static absl::StatusOr<std::unique_ptr<WorkerTask>> Create(
      TaskConfig config, WorkerTaskOptions options, const Clock* clock,
      std::shared_ptr<prometheus::Registry> registry,
      std::vector<std::unique_ptr<ShardChannel>> channels, WorkerData data = {});
  WorkerTask(const WorkerTask&) = delete;
  WorkerTask& operator=(const WorkerTask&) = delete;

  // Connects to every PS and trains (or follows) until the job reached its
  // target; the chief then reports the result and ends the job. Errors name
  // the task ("worker:1: ...").
  absl::Status Run();
  // Ends Run soon with CANCELLED (a call the PS is holding ends when the PS
  // answers it). Thread-safe.
  void Stop() { client_->Cancel(); }

  bool is_chief() const { return is_chief_; }
  // The threads its model computes on (options.threads resolved).
  int threads() const { return config_.model ? config_.model->threads() : 1; }
  // The chief's result, once Run succeeded.
  const std::optional<JobResult>& result() const { return result_; }
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

 private:
  WorkerTask(TaskConfig config, WorkerTaskOptions options, const Clock* clock,
             std::shared_ptr<prometheus::Registry> registry);
  void RegisterMetrics();
  void Report(const std::string& line) const;
  JobResult MakeResult(const TrainResult& r) const;
  // The chief's progress report: the trainer's figures plus the PS tasks'
  // (GetStats: absent workers, checkpoint writes), also set as the gauges the
  // operator reads (core/job_report.h). A PS that cannot be reached keeps the
  // figures of the last report.
  void ReportProgress(const Progress& p);
  // A refused handshake (another job fingerprint on a PS) names the fields
  // that differ; any other status is returned as it is.
  absl::Status ExplainMismatch(const absl::Status& s) const;

  // Constant after construction.
  const TaskConfig config_;
  const WorkerTaskOptions options_;
  const Clock* const clock_;
  const std::shared_ptr<prometheus::Registry> registry_;
  std::string name_;                     // "worker:1", "chief:0", "evaluator:0"
  bool threads_from_cpu_limit_ = false;  // options.threads was 0
  bool is_chief_ = false;
  bool trains_ = false;  // a worker (not a reader)
  PsClientMetrics client_metrics_;
  TrainerMetrics trainer_metrics_;
  prometheus::Gauge* target_steps_ = nullptr;  // chief only
  // Chief only: the PS tasks' absent workers and checkpoint writes.
  prometheus::Gauge* job_absent_workers_ = nullptr;
  prometheus::Gauge* job_checkpoint_failures_ = nullptr;
  prometheus::Family<prometheus::Gauge>* job_checkpoints_failing_ = nullptr;
  std::unique_ptr<MetricsServer> metrics_server_;
  WorkerData data_;
  // A Chief replica's: the first kLossSampleExamples training records.
  std::shared_ptr<const Dataset> loss_sample_;
  std::unique_ptr<PsClient> client_;

  // Run's thread only.
  std::optional<JobResult> result_;
  v1::ShardStats ps_stats_;                      // the last the chief read (ReportProgress)
  prometheus::Gauge* failing_series_ = nullptr;  // of job_checkpoints_failing_
  std::string failing_label_;                    // its last_error
};

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_WORKER_TASK_H_
