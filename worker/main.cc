// kubetrain-worker: one worker, chief or evaluator task (worker/worker_task.h).
// Reads the TrainingJob file and TF_CONFIG, trains (or follows training)
// against the PS tasks, serves /metrics. The chief reports progress and the
// result on stdout ("kubetrain-progress {json}" / "kubetrain-result {json}",
// core/job_report.h) and ends the job on every PS. Exit code 0 when the job
// reached its target, 1 if training failed, 2 on a configuration error.
//
// With --export_from_ps=HOST:PORT,... it is the exporter instead (what
// `kubetrain export --from-ps` runs; worker/model_export.h): it pulls the
// whole model from those PS tasks of --config's job and writes it to
// --export_model (no TF_CONFIG). Exit code 0 when written, 1 if the PS tasks
// cannot be read or the file cannot be written, 2 on bad input (a PS count or
// fingerprint that does not match the job).
//
// With --auth_dir (else $KUBETRAIN_AUTH_DIR; core/job_credentials.h) every
// call to a PS carries this task's token (the exporter derives its own from
// job.key), over TLS when the directory has ca.crt. A PS that refuses the
// credentials (UNAUTHENTICATED, PERMISSION_DENIED) is a configuration error:
// exit code 2 with the PS's reason, no retry.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/strings/str_split.h"
#include "core/flags.h"
#include "core/job_credentials.h"
#include "core/log.h"
#include "core/task_config.h"
#include "worker/grpc_shard_channel.h"
#include "worker/model_export.h"
#include "worker/worker_task.h"

int main(int argc, char** argv) {
  using namespace kubetrain;
  std::string config_file, tf_config, auth_dir;
  if (const char* tf = std::getenv("TF_CONFIG")) tf_config = tf;
  if (const char* dir = std::getenv(kAuthDirEnv)) auth_dir = dir;
  WorkerTaskOptions options;
  double progress_interval_seconds = 1.0;
  int64_t step_delay_ms = 0;
  FlagParser parser("kubetrain-worker --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  parser.String("config", &config_file, "TrainingJob YAML file");
  parser.String("tf_config", &tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser.String("auth_dir", &auth_dir,
                "this task's credentials for the PS tasks: token (or job.key), and ca.crt, "
                "tls.crt, tls.key for TLS (default: $KUBETRAIN_AUTH_DIR; none: plaintext, no "
                "token)");
  parser.String("metrics_address", &options.metrics_address, "host:port for /metrics; empty = off");
  parser.String("result_file", &options.result_file,
                "chief: also write the final result JSON here (e.g. /dev/termination-log)");
  parser.Double("progress_interval_seconds", &progress_interval_seconds,
                "how often the chief reports progress");
  parser.String("export_model", &options.export_model,
                "chief: write the final model here (default: <checkpoint.directory>/model.ktm when "
                "checkpoints are on)");
  parser.Int("step_delay_ms", &step_delay_ms,
             "sleep this long before every step: makes this worker a straggler (for experiments "
             "and tests)");
  std::string export_from_ps;
  parser.String("export_from_ps", &export_from_ps,
                "be the exporter: pull the whole model from these PS tasks (host:port of ps:0, "
                "ps:1, ... comma-separated) and write it to --export_model");
  int64_t threads = 1;
  parser.Int("threads", &threads,
             "threads a step computes on (0: as many as the container's CPU limit, else the "
             "machine's cores); the bits of a run are the same for a given count");
  std::string termination_log;
  AddTerminationLogFlag(parser, &termination_log);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  if (threads < 0 || threads > 1024) {
    std::fprintf(stderr,
                 "error: --threads must be >= 1 (or 0: the CPU limit) and at most 1024, got "
                 "%lld\n\n%s",
                 static_cast<long long>(threads), parser.Usage().c_str());
    return 2;
  }
  options.threads = static_cast<int>(threads);
  if (config_file.empty()) {
    std::fprintf(stderr, "error: --config is required\n\n%s", parser.Usage().c_str());
    return 2;
  }
  options.progress_interval = absl::Seconds(progress_interval_seconds);
  options.step_delay = absl::Milliseconds(step_delay_ms);
  InitProcess(ProcessProfile::kTensorBuffers);

  // This task's credentials for the PS tasks (none without a directory).
  auto caller_for = [&auth_dir](const std::string& type,
                                int index) -> absl::StatusOr<CallerCredentials> {
    if (auth_dir.empty()) return CallerCredentials();
    return ReadCallerCredentials(auth_dir, type, index);
  };
  // A PS that refuses this task's credentials will refuse them again.
  auto exit_code_for = [](const absl::Status& s) {
    return absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s) ? 2 : 1;
  };

  RealClock clock;
  if (!export_from_ps.empty()) {
    ExportFromPsOptions export_options;
    export_options.job_file = config_file;
    export_options.ps_addresses = absl::StrSplit(export_from_ps, ',', absl::SkipEmpty());
    export_options.output = options.export_model;
    if (export_options.output.empty()) {
      std::fprintf(stderr, "error: --export_from_ps needs --export_model (the file to write)\n");
      return 2;
    }
    auto caller = caller_for("exporter", 0);
    if (!caller.ok()) return ExitWithError(2, caller.status().message(), termination_log);
    auto channels = [&caller](const std::string& address, int64_t chunk_bytes) {
      return NewGrpcShardChannel(address, chunk_bytes, *caller);
    };
    auto exported = ExportFromPs(export_options, channels, &clock);
    if (!exported.ok()) {
      const absl::Status& s = exported.status();
      const bool bad_input = absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s);
      return ExitWithError(bad_input ? 2 : exit_code_for(s), s.message(), termination_log);
    }
    Log("exported ", export_options.job_file, "'s model at global step ", exported->global_step,
        " from ", export_options.ps_addresses.size(), " PS tasks to ", exported->path,
        exported->test_metrics.accuracy
            ? absl::StrCat(", test accuracy ", *exported->test_metrics.accuracy)
            : std::string(),
        " (kubetrain eval ", exported->path, ")");
    return 0;
  }
  auto config = LoadTaskConfig(config_file, tf_config);
  if (!config.ok()) {
    return ExitWithError(2, config.status().message(), termination_log);
  }
  auto caller = caller_for(config->tf.task_type, config->tf.task_index);
  if (!caller.ok()) return ExitWithError(2, caller.status().message(), termination_log);
  std::vector<std::unique_ptr<ShardChannel>> channels;
  for (const std::string& address : config->tf.tasks("ps")) {
    channels.push_back(NewGrpcShardChannel(address, config->job.training.chunk_bytes, *caller));
  }
  auto task = WorkerTask::Create(std::move(*config), options, &clock,
                                 std::make_shared<prometheus::Registry>(), std::move(channels));
  if (!task.ok()) {
    return ExitWithError(2, task.status().message(), termination_log);
  }
  if (absl::Status s = (*task)->Run(); !s.ok()) {
    return ExitWithError(exit_code_for(s), s.message(), termination_log);
  }
  return 0;
}
