// The flags of kubetrain-worker, parsed once in main() and turned into the
// options of the task it runs: a WorkerTask (worker/worker_task.h) or, with
// --export_from_ps, an ExporterTask (worker/exporter_task.h).
#ifndef KUBETRAIN_WORKER_WORKER_FLAGS_H_
#define KUBETRAIN_WORKER_WORKER_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/flags.h"
#include "worker/exporter_task.h"
#include "worker/worker_task.h"

namespace kubetrain {

struct WorkerFlags {
  std::string config_file;
  std::string tf_config;  // default: $TF_CONFIG
  std::string auth_dir;   // default: $KUBETRAIN_AUTH_DIR
  std::string termination_log;
  std::string export_from_ps;  // non-empty: be the exporter
  WorkerTaskOptions task;      // filled by Finish()

  // Registers every flag on `parser`, with the environment's defaults.
  void Register(FlagParser* parser);
  // Checks the values and converts them into `task`; InvalidArgument naming
  // the flag.
  absl::Status Finish();
  bool exporter() const { return !export_from_ps.empty(); }
  ExporterTaskOptions ExporterOptions() const;

 private:
  double progress_interval_seconds_ = 1.0;
  int64_t step_delay_ms_ = 0;
  int64_t threads_ = WorkerTaskOptions::kThreadsFromJob;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_WORKER_FLAGS_H_
