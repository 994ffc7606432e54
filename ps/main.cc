// kubetrain-ps: one parameter-server task (ps/ps_task.h). Reads the
// TrainingJob file and TF_CONFIG, serves its shard of the model until the
// chief has ended training and every worker has left (or SIGTERM: then with
// a final checkpoint). Exit code 0 when the job ended, 1 if it cannot serve or
// its final checkpoint could not be written (after holding the parameters
// read-only for --keep_serving_after_checkpoint_failure_seconds, for
// `kubetrain export --from-ps`; a second SIGTERM exits at once), 2 on a
// configuration error (including a checkpoint directory that cannot be
// written at start, or credentials that cannot be read).
//
// With --auth_dir (else $KUBETRAIN_AUTH_DIR; core/job_credentials.h) it
// serves only its job's tasks: every call must carry a task's token (the
// directory's job.key checks them), and with ca.crt, tls.crt and tls.key the
// port speaks mutual TLS under the job's CA. Without credentials it refuses
// to start (exit code 2, naming --auth_dir and --insecure) unless --insecure
// (else $KUBETRAIN_INSECURE=1) says to serve any client; it then logs a
// warning line.
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
#include "ps/ps_flags.h"
#include "ps/ps_task.h"

namespace {

std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

}  // namespace

int main(int argc, char** argv) {
  using namespace kubetrain;  // NOLINT: main only wires objects together
  PsFlags flags;
  FlagParser parser("kubetrain-ps --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  flags.Register(&parser);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  if (absl::Status s = flags.Finish(); !s.ok()) {
    std::fprintf(stderr, "error: %s\n\n%s", std::string(s.message()).c_str(),
                 parser.Usage().c_str());
    return 2;
  }
  InitProcess(ProcessProfile::kTensorBuffers);
  // SIGTERM (kubetrain run, the kubelet) ends serving with a final
  // checkpoint instead of losing what was trained since the last one.
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  flags.task.signals = &g_signals;
  if (absl::Status s = flags.ReadCredentials(); !s.ok()) {
    return ExitWithError(2, s.message(), flags.termination_log);
  }

  RealClock clock;
  auto config = LoadTaskConfig(flags.config_file, flags.tf_config);
  if (!config.ok()) return ExitWithError(2, config.status().message(), flags.termination_log);
  auto task = PsTask::Create(std::move(*config), flags.task, &clock,
                             std::make_shared<prometheus::Registry>());
  if (!task.ok()) return ExitWithError(2, task.status().message(), flags.termination_log);
  if (absl::Status s = (*task)->Serve(); !s.ok()) {
    return ExitWithError(1, s.message(), flags.termination_log);
  }
  return 0;
}
