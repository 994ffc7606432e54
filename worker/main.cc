// kubetrain-worker: one worker, chief or evaluator task (worker/worker_task.h).
// Reads the TrainingJob file and TF_CONFIG, trains (or follows training)
// against the PS tasks, serves /metrics. The chief reports progress and the
// result on stdout ("kubetrain-progress {json}" / "kubetrain-result {json}",
// core/job_report.h) and ends the job on every PS. Exit code 0 when the job
// reached its target, 1 if training failed, 2 on a configuration error.
// With --export_from_ps=HOST:PORT,... it is the exporter instead
// (worker/exporter_task.h: what `kubetrain export --from-ps` runs).
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

#include "core/flags.h"
#include "core/job_credentials.h"
#include "core/log.h"
#include "core/task_config.h"
#include "worker/bulk_shard_channel.h"
#include "worker/exporter_task.h"
#include "worker/grpc_shard_channel.h"
#include "worker/worker_flags.h"
#include "worker/worker_task.h"

int main(int argc, char** argv) {
  using namespace kubetrain;  // NOLINT: main only wires objects together
  WorkerFlags flags;
  FlagParser parser("kubetrain-worker --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  flags.Register(&parser);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  if (absl::Status s = flags.Finish(); !s.ok()) {
    std::fprintf(stderr, "error: %s\n\n%s", std::string(s.message()).c_str(),
                 parser.Usage().c_str());
    return 2;
  }
  const std::string& termination_log = flags.termination_log;
  InitProcess(ProcessProfile::kTensorBuffers);

  RealClock clock;
  if (flags.exporter()) {
    auto task = ExporterTask::Create(flags.ExporterOptions(), NewGrpcShardChannel, &clock);
    if (!task.ok()) return ExitWithError(2, task.status().message(), termination_log);
    absl::Status s = (*task)->Run().status();
    return s.ok() ? 0 : ExitWithError(ExporterTask::ExitCode(s), s.message(), termination_log);
  }
  auto config = LoadTaskConfig(flags.config_file, flags.tf_config);
  if (!config.ok()) return ExitWithError(2, config.status().message(), termination_log);
  auto caller = flags.auth_dir.empty() ? CallerCredentials()
                                       : ReadCallerCredentials(flags.auth_dir, config->tf.task_type,
                                                               config->tf.task_index);
  if (!caller.ok()) return ExitWithError(2, caller.status().message(), termination_log);
  std::vector<std::unique_ptr<ShardChannel>> channels;
  for (const std::string& address : config->tf.tasks("ps")) {
    channels.push_back(NewPsChannel(address, config->job.training.chunk_bytes, *caller));
  }
  auto task = WorkerTask::Create(std::move(*config), flags.task, &clock,
                                 std::make_shared<prometheus::Registry>(), std::move(channels));
  if (!task.ok()) return ExitWithError(2, task.status().message(), termination_log);
  if (absl::Status s = (*task)->Run(); !s.ok()) {
    // A PS that refuses this task's credentials will refuse them again.
    const bool refused = absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s);
    return ExitWithError(refused ? 2 : 1, s.message(), termination_log);
  }
  return 0;
}
