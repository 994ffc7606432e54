// The loops a kubetrain-worker process runs, over a PsClient:
//
//   Train   a training worker: pull -> compute -> push, until the PS reports
//           the target global step. In a job without a Chief replica worker 0
//           is also the chief: it evaluates test accuracy every
//           evaluation.everySteps and at the end, exports the model, reports
//           progress, and ends the job on every PS.
//   Follow  the chief of a job with a Chief replica (a coordinator: it
//           computes no gradients) and the evaluator: each waits on the PS
//           for the next evaluation boundary (the PS answers when its version
//           gets there, with the values at that version; the wait joins no
//           barrier and no staleness bound), evaluates, and so on to the
//           target. The chief also reports progress every progress_interval,
//           exports the model and ends the job; the evaluator leaves when
//           training is done and never ends the job.
//
// Time (progress cadence, waits, the simulated straggler) comes from the
// injected clock. A PsClient::Cancel() ends either loop with CANCELLED.
#ifndef KUBETRAIN_WORKER_TRAINER_H_
#define KUBETRAIN_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/file_env.h"
#include "core/job_report.h"
#include "core/task_config.h"
#include "worker/model_export.h"
#include "worker/ps_client.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

struct TrainerMetrics {                                     // any pointer may be null
  prometheus::Histogram* barrier_wait_seconds = nullptr;    // sync: held at the barrier
  prometheus::Histogram* staleness_wait_seconds = nullptr;  // async: held by the staleness bound
  prometheus::Histogram* compute_seconds = nullptr;
  prometheus::Counter* steps = nullptr;
  prometheus::Counter* examples = nullptr;
  prometheus::Counter* dropped = nullptr;  // this worker's gradients the PS dropped
  prometheus::Gauge* global_step = nullptr;
  prometheus::Gauge* loss = nullptr;
  prometheus::Gauge* accuracy = nullptr;
  prometheus::Gauge* auc = nullptr;                  // binary labels
  prometheus::Gauge* log_loss = nullptr;             // binary labels
  prometheus::Gauge* rmse = nullptr;                 // regression
  prometheus::Gauge* examples_per_second = nullptr;  // chief: global, at each progress report
  prometheus::Counter* steps_lost = nullptr;         // global steps lost to PS restarts
  prometheus::Counter* records_skipped = nullptr;    // bad data records dropped at load
  prometheus::Histogram* unique_ids = nullptr;       // sparse: distinct table ids per batch
};

struct TrainResult {
  int64_t global_step = 0;
  int64_t local_steps = 0;
  double test_accuracy = -1;  // chief and evaluator only
  EvalMetrics test_metrics;   // chief and evaluator: the final evaluation
  // Train: mean training loss over this worker's last steps. Follow: the
  // final model's mean loss on the loss sample (0 without one).
  double final_loss = 0;
  double wall_seconds = 0;
  double examples_per_second = 0;  // global: examples in applied steps / wall time
  v1::ShardStats ps_stats;         // chief only: summed over shards
  int64_t steps_lost = 0;          // versions PS shards lost by restarting from a checkpoint
  int64_t ps_restarts_seen = 0;
  std::string model_path;       // where the chief exported the final model
  int64_t export_failures = 0;  // attempts at writing it that failed
};

// The chief writes the final model file per its ExportPolicy
// (worker/model_export.h). The job is only ended (Shutdown) once the model is
// written, so if it never is, the PS tasks still hold the parameters (and
// write a final checkpoint when they are stopped, or hold them for
// `kubetrain export --from-ps` if they cannot).

struct TrainerOptions {
  int worker_index = 0;
  bool is_chief = false;  // Train: worker 0 of a job without a Chief replica
  absl::Duration progress_interval = absl::Seconds(1);
  absl::Duration step_delay = absl::ZeroDuration();  // simulated straggler
  // Overlap each step's fused push-pull with its backprop (PsClient::
  // StartPushPull): a variable's gradient is sent as soon as it is final,
  // last layer first. The same pushes and pulls, so the same bits in sync
  // mode; the next step starts once the whole pull is in.
  bool overlap_layers = false;
  std::string export_model;  // chief: write the final model file here (empty: don't)
  ExportPolicy export_policy;
};

// `test` may be null unless options.is_chief. `on_progress` (chief) is called
// every progress_interval and once at the end.
absl::StatusOr<TrainResult> Train(const TaskConfig& config, const TrainerOptions& options,
                                  PsClient* client, const RecordSource& train, const Dataset* test,
                                  const Clock* clock, TrainerMetrics metrics,
                                  const std::function<void(const Progress&)>& on_progress);

struct FollowOptions {
  bool is_chief = true;                                 // false: the evaluator
  absl::Duration progress_interval = absl::Seconds(1);  // chief
  std::string export_model;  // chief: write the final model file here (empty: don't)
  ExportPolicy export_policy;
};

// Examples of the training set whose loss the chief of a job with a Chief
// replica reports (it computes no gradients, so it has no training loss of
// its own): the first kLossSampleExamples, evaluated like the test set.
inline constexpr int64_t kLossSampleExamples = 2048;

// `loss_sample` may be null (no loss is reported). `on_progress` (chief) is
// called at the start, every progress_interval, after each evaluation and
// once at the end. Boundaries are evaluated at the first version at or after
// them (exactly at them when the wait was already on the PS).
absl::StatusOr<TrainResult> Follow(const TaskConfig& config, const FollowOptions& options,
                                   PsClient* client, const Dataset& test,
                                   const Dataset* loss_sample, const Clock* clock,
                                   TrainerMetrics metrics,
                                   const std::function<void(const Progress&)>& on_progress);

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_TRAINER_H_
