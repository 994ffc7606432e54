// One parameter-server task (kubetrain-ps) as an object: built from the task's
// config (the TrainingJob + TF_CONFIG), it holds its shard of the model,
// serves it over gRPC and its metrics over HTTP, writes checkpoints, and ends
// once the chief has ended the job and every worker and evaluator has left
// (or the shutdown grace has passed). main() only turns flags into options.
//
// Checkpoints (with checkpoint.directory): Create probes the directory (a
// probe file created, written, fsynced, renamed and deleted) and fails naming
// spec.training.checkpoint.directory and the OS error; restored on Create
// (the newest valid one; another model's is refused), written the moment the
// version crosses a multiple of checkpoint.everySteps, every
// checkpoint.everySeconds (of the injected clock) when the version moved, and
// a final one at the end. A write that fails does not stop training: it is
// counted (kubetrain_checkpoint_failures_total), logged with the OS error and
// tried again after options.checkpoint_retry (doubling to a minute); on a full
// disk older checkpoints make room (WriteShardCheckpoint). The final one is
// tried options.final_checkpoint_attempts times; if it cannot be written
// Serve returns an error naming the directory (kubetrain-ps exits 1) -- but
// first the task holds the parameters (options.keep_serving_after_checkpoint_failure
// > 0): the shard turns read-only (pushes FAILED_PRECONDITION, pulls answered
// at once) and keeps serving for that long so `kubetrain export --from-ps`
// can save the model elsewhere; it logs a line with kHoldingParametersNote
// (core/job_report.h), sets kubetrain_ps_holding_unsaved_parameters to 1 and
// the gRPC health status to NOT_SERVING. The hold ends when the time is up,
// at the next Stop() or signal (a second SIGTERM exits at once), or when a
// retried final checkpoint is written after all (then Serve succeeds).
//
// Thread safety: Create, Start, Serve and RunRound are called from one thread
// (Serve runs the rounds itself); Stop may be called from any thread.
#ifndef KUBETRAIN_PS_PS_TASK_H_
#define KUBETRAIN_PS_PS_TASK_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/file_env.h"
#include "core/job_credentials.h"
#include "core/job_report.h"
#include "core/metrics.h"
#include "core/task_config.h"
#include "ps/bulk_server.h"
#include "ps/checkpoint.h"
#include "ps/service.h"
#include "ps/shard.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace prometheus {
class Counter;
class Gauge;
class Registry;
}  // namespace prometheus

namespace kubetrain {

struct PsTaskOptions {
  std::string bind_host = "0.0.0.0";
  // The port to listen on: -1 = this task's port in TF_CONFIG; 0 = any free
  // port (see PsTask::port()).
  int port = -1;
  // The bulk data plane (ps/bulk_server.h) beside gRPC: -1 = off; 0 = any
  // free port; else that port. Advertised to workers in GetInfo. With TLS
  // credentials it speaks mutual TLS too (proto/bulk_tls.h).
  int bulk_port = -1;
  std::string metrics_address = "0.0.0.0:9090";  // "" = no /metrics
  // After the chief's shutdown, how long to wait for workers and evaluators
  // to leave.
  absl::Duration shutdown_grace = absl::Seconds(30);
  // Unique per start of the task; 0 = microseconds since the epoch on the clock.
  int64_t incarnation = 0;
  // Serve's round: expire held pulls, write due checkpoints, check for the end.
  absl::Duration tick = absl::Milliseconds(50);
  // Where checkpoints are written (a test injects ENOSPC/EROFS/EIO). Not owned.
  FileEnv* env = FileEnv::Default();
  // A failed checkpoint is tried again after this, doubling up to a minute.
  absl::Duration checkpoint_retry = absl::Seconds(1);
  // The final checkpoint is tried this many times (checkpoint_retry apart,
  // doubling) before the task gives up on it.
  int final_checkpoint_attempts = 4;
  // How long a task whose final checkpoint cannot be written keeps serving
  // its parameters read-only for `kubetrain export --from-ps` (0: exits at once).
  absl::Duration keep_serving_after_checkpoint_failure =
      absl::Seconds(kDefaultKeepServingAfterCheckpointFailureSeconds);
  // What this task checks its callers with (core/job_credentials.h): the
  // job key (empty: any client is served, which Start logs) and, with TLS
  // files, mutual TLS under the job's CA. TLS needs the job key too.
  TaskCredentials credentials;
  // Serve any client when `credentials` has no job key (kubetrain-ps
  // --insecure): without it Create refuses such a task, naming --auth_dir
  // and --insecure; with it Start logs a warning line. Ignored when there is
  // a job key.
  bool insecure = false;
  // Signals received (counted by a signal handler): the first ends serving
  // as Stop() does; one more while holding the parameters exits at once. Not owned.
  const std::atomic<int>* signals = nullptr;
};

class PsTask {
 public:
  // Checks the task (TF_CONFIG type "ps"), registers the PS metrics in
  // `registry` and serves them on options.metrics_address, builds the shard
  // and restores its checkpoint. Every error is a configuration error
  // (kubetrain-ps exits 2), among them no job key without options.insecure
  // (FAILED_PRECONDITION). `clock` must outlive the task.
  static absl::StatusOr<std::unique_ptr<PsTask>> Create(
      TaskConfig config, PsTaskOptions options, const Clock* clock,
      std::shared_ptr<prometheus::Registry> registry);
  ~PsTask();
  PsTask(const PsTask&) = delete;
  PsTask& operator=(const PsTask&) = delete;

  // Serves the PS service over gRPC. Errors name the address.
  absl::Status Start();
  // Start()s if needed, then runs a round every options.tick until the job
  // is over (see RunRound) and stops the server.
  absl::Status Serve();
  // One round of Serve: waits up to `wait` for a checkpoint boundary, expires
  // held pulls and timed-out barriers, writes a due checkpoint, and checks
  // for the end. Returns true once serving is over; the final checkpoint is
  // then written (once).
  bool RunRound(absl::Duration wait);
  // Ends serving at the next round, as if the job had ended; while holding
  // the parameters, ends the hold. Thread-safe.
  void Stop();
  // Serving read-only after the final checkpoint failed (see above).
  bool holding_parameters() const { return holding_; }

  Shard* shard() const { return shard_.get(); }
  int port() const { return port_; }                           // after Start
  int bulk_port() const { return bulk_ ? bulk_->port() : 0; }  // 0 = off
  int metrics_port() const { return metrics_port_; }           // 0 = off

 private:
  struct Metrics {
    ShardMetrics shard;
    PsServiceMetrics service;
    prometheus::Counter* checkpoints_written = nullptr;
    prometheus::Counter* checkpoint_failures = nullptr;
    prometheus::Counter* checkpoint_restores = nullptr;
    prometheus::Gauge* restored_version = nullptr;
    prometheus::Gauge* holding = nullptr;  // kubetrain_ps_holding_unsaved_parameters
  };
  static Metrics RegisterMetrics(prometheus::Registry& registry);

  PsTask(TaskConfig config, PsTaskOptions options, const Clock* clock,
         std::shared_ptr<prometheus::Registry> registry, Metrics metrics);
  absl::Status Restore();
  // True if written (or there is no checkpoint directory).
  bool SaveCheckpoint(const char* why, std::unique_ptr<CheckpointSource> image = nullptr);
  void Finish();
  // kubetrain_table_rows / _bytes / _rows_created_total / _rows_evicted_total
  // from the shard now (start-up and every round: dynamic tables change).
  void UpdateTableMetrics();
  // Stop()s plus signals so far.
  int StopsAndSignals() const;
  // The final checkpoint failed: serve read-only (see the class comment).
  void StartHolding(absl::Time now);
  // One round while holding; true once the hold is over.
  bool HoldRound(absl::Duration wait);
  void EndHolding(const std::string& why);

  // Constant after construction.
  const TaskConfig config_;
  const PsTaskOptions options_;
  const Clock* const clock_;
  const std::shared_ptr<prometheus::Registry> registry_;
  const Metrics metrics_;
  const int index_;
  std::unique_ptr<Shard> shard_;  // set by Create

  std::atomic<int> stops_{0};
  std::atomic<bool> holding_{false};  // written by Serve's thread

  std::unique_ptr<MetricsServer> metrics_server_;  // set by Create
  int metrics_port_ = 0;

  // Serve's thread only.
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<BulkServer> bulk_;
  int port_ = 0;
  int64_t saved_version_ = 0;
  // Per table (set by Create; null if the job has no tables).
  struct TableMetrics {
    prometheus::Gauge* rows = nullptr;
    prometheus::Gauge* bytes = nullptr;
    prometheus::Counter* created = nullptr;
    prometheus::Counter* evicted = nullptr;
    Shard::TableCounts reported;  // what the counters say
  };
  std::vector<TableMetrics> table_metrics_;
  absl::Time saved_at_;
  absl::Time shutdown_at_ = absl::InfiniteFuture();
  absl::Time trimmed_at_ = absl::InfinitePast();
  bool finished_ = false;
  int failures_in_a_row_ = 0;                     // checkpoint writes
  absl::Time retry_at_ = absl::InfiniteFuture();  // after a failed write
  absl::Status final_status_;                     // Finish's: the final checkpoint
  bool over_ = false;                             // serving (and any hold) ended
  absl::Time hold_until_;                         // while holding_
  int stops_at_hold_ = 0;                         // StopsAndSignals() when the hold began
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_PS_TASK_H_
