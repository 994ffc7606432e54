#include "worker/worker_flags.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/job_credentials.h"
#include "core/log.h"

namespace kubetrain {

void WorkerFlags::Register(FlagParser* parser) {
  if (const char* tf = std::getenv("TF_CONFIG")) tf_config = tf;
  if (const char* dir = std::getenv(kAuthDirEnv)) auth_dir = dir;
  parser->String("config", &config_file, "TrainingJob YAML file");
  parser->String("tf_config", &tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser->String("auth_dir", &auth_dir,
                 "this task's credentials for the PS tasks: token (or job.key), and ca.crt, "
                 "tls.crt, tls.key for TLS (default: $KUBETRAIN_AUTH_DIR; none: plaintext, no "
                 "token)");
  parser->String("metrics_address", &task.metrics_address, "host:port for /metrics; empty = off");
  parser->String("result_file", &task.result_file,
                 "chief: also write the final result JSON here (e.g. /dev/termination-log)");
  parser->Double("progress_interval_seconds", &progress_interval_seconds_,
                 "how often the chief reports progress");
  parser->String("export_model", &task.export_model,
                 "chief: write the final model here (default: <checkpoint.directory>/model.ktm "
                 "when checkpoints are on)");
  parser->Int("step_delay_ms", &step_delay_ms_,
              "sleep this long before every step: makes this worker a straggler (for experiments "
              "and tests)");
  parser->Bool("overlap_layers", &task.overlap_layers,
               "overlap the fused push-pull with the step: each variable's gradient leaves as soon "
               "as backprop produces it, last layer first (the same pushes, the same bits)");
  parser->String("export_from_ps", &export_from_ps,
                 "be the exporter: pull the whole model from these PS tasks (host:port of ps:0, "
                 "ps:1, ... comma-separated) and write it to --export_model");
  parser->Int("threads", &threads_,
              "threads a step computes on (default -1: the whole cores of the task's CPU limit "
              "in the job's pod template (resources.limits.cpu of the kubetrain container), "
              "else 1; 0: as many as this container's CPU limit, else the machine's cores); the "
              "bits of a run are the same for a given count");
  AddTerminationLogFlag(*parser, &termination_log);
}

absl::Status WorkerFlags::Finish() {
  if (threads_ < WorkerTaskOptions::kThreadsFromJob || threads_ > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--threads must be >= 1 (or 0: the CPU limit, -1: the job's) and at most 1024, got ",
        threads_));
  }
  if (config_file.empty()) return absl::InvalidArgumentError("--config is required");
  task.threads = static_cast<int>(threads_);
  task.progress_interval = absl::Seconds(progress_interval_seconds_);
  task.step_delay = absl::Milliseconds(step_delay_ms_);
  return absl::OkStatus();
}

ExporterTaskOptions WorkerFlags::ExporterOptions() const {
  ExporterTaskOptions o;
  o.export_options.job_file = config_file;
  o.export_options.ps_addresses = absl::StrSplit(export_from_ps, ',', absl::SkipEmpty());
  o.export_options.output = task.export_model;
  o.auth_dir = auth_dir;
  return o;
}

}  // namespace kubetrain
