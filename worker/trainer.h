// The worker's training loop: pull -> compute -> push, until the PS reports
// the target global step. Worker 0 is the chief: it evaluates test accuracy
// periodically and at the end, reports progress, and ends the job on every PS.
#ifndef KUBETRAIN_WORKER_TRAINER_H_
#define KUBETRAIN_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/task_config.h"
#include "worker/ps_client.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

struct TrainerMetrics {  // any pointer may be null
  prometheus::Histogram* barrier_wait_seconds = nullptr;    // sync: held at the barrier
  prometheus::Histogram* staleness_wait_seconds = nullptr;  // async: held by the staleness bound
  prometheus::Histogram* compute_seconds = nullptr;
  prometheus::Counter* steps = nullptr;
  prometheus::Counter* examples = nullptr;
  prometheus::Counter* dropped = nullptr;  // this worker's gradients the PS dropped
  prometheus::Gauge* global_step = nullptr;
  prometheus::Gauge* loss = nullptr;
  prometheus::Gauge* accuracy = nullptr;
  prometheus::Counter* steps_lost = nullptr;  // global steps lost to PS restarts
};

struct Progress {
  int64_t global_step = 0;
  int64_t target_steps = 0;
  double loss = 0;
  double examples_per_second = 0;
  double accuracy = -1;  // < 0: not evaluated yet
};

struct TrainResult {
  int64_t global_step = 0;
  int64_t local_steps = 0;
  double test_accuracy = -1;  // chief only
  double final_loss = 0;      // mean training loss over this worker's last steps
  double wall_seconds = 0;
  double examples_per_second = 0;  // global: examples in applied steps / wall time (chief)
  v1::ShardStats ps_stats;         // chief only: summed over shards
  int64_t steps_lost = 0;          // versions PS shards lost by restarting from a checkpoint
  int64_t ps_restarts_seen = 0;
  std::string model_path;  // where the chief exported the final model
};

struct TrainerOptions {
  int worker_index = 0;
  bool is_chief = false;
  absl::Duration progress_interval = absl::Seconds(1);
  absl::Duration step_delay = absl::ZeroDuration();  // simulated straggler
  std::string export_model;  // chief: write the final model file here (empty: don't)
};

// `test` may be null for non-chief workers. `on_progress` (chief) is called
// every progress_interval and after each evaluation.
absl::StatusOr<TrainResult> Train(const TaskConfig& config, const TrainerOptions& options,
                                  PsClient* client, const Dataset& train, const Dataset* test,
                                  const Clock* clock, TrainerMetrics metrics,
                                  const std::function<void(const Progress&)>& on_progress);

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_TRAINER_H_
