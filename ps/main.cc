// kubetrain-ps: one parameter-server task (ps/ps_task.h). Reads the
// TrainingJob file and TF_CONFIG, serves its shard of the model until the
// chief has ended training and every worker has left (or SIGTERM: then with
// a final checkpoint). Exit code 0 when the job ended, 1 if it cannot serve or
// its final checkpoint could not be written, 2 on a configuration error
// (including a checkpoint directory that cannot be written at start).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "core/flags.h"
#include "core/log.h"
#include "core/task_config.h"
#include "ps/ps_task.h"

namespace {

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

}  // namespace

int main(int argc, char** argv) {
  using namespace kubetrain;
  std::string config_file, tf_config;
  if (const char* tf = std::getenv("TF_CONFIG")) tf_config = tf;
  PsTaskOptions options;
  int64_t shutdown_grace_seconds = absl::ToInt64Seconds(options.shutdown_grace);
  FlagParser parser("kubetrain-ps --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  parser.String("config", &config_file, "TrainingJob YAML file");
  parser.String("tf_config", &tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser.String("bind_host", &options.bind_host,
                "address to listen on; the port comes from TF_CONFIG");
  parser.String("metrics_address", &options.metrics_address, "host:port for /metrics; empty = off");
  parser.Int("shutdown_grace_seconds", &shutdown_grace_seconds,
             "after the chief's shutdown, how long to wait for workers to leave");
  std::string termination_log;
  AddTerminationLogFlag(parser, &termination_log);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  if (config_file.empty()) {
    std::fprintf(stderr, "error: --config is required\n\n%s", parser.Usage().c_str());
    return 2;
  }
  options.shutdown_grace = absl::Seconds(shutdown_grace_seconds);
  InitProcess(ProcessProfile::kTensorBuffers);
  // SIGTERM (kubetrain run, the kubelet) ends serving with a final
  // checkpoint instead of losing what was trained since the last one.
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  options.interrupted = &g_interrupted;

  RealClock clock;
  auto config = LoadTaskConfig(config_file, tf_config);
  if (!config.ok()) {
    return ExitWithError(2, config.status().message(), termination_log);
  }
  auto task =
      PsTask::Create(std::move(*config), options, &clock, std::make_shared<prometheus::Registry>());
  if (!task.ok()) {
    return ExitWithError(2, task.status().message(), termination_log);
  }
  if (absl::Status s = (*task)->Serve(); !s.ok()) {
    return ExitWithError(1, s.message(), termination_log);
  }
  return 0;
}
