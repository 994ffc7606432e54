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

#include "absl/strings/str_cat.h"
#include "core/flags.h"
#include "core/job_credentials.h"
#include "core/log.h"
#include "core/task_config.h"
#include "ps/ps_task.h"

namespace {

std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

}  // namespace

int main(int argc, char** argv) {
  using namespace kubetrain;
  std::string config_file, tf_config, auth_dir;
  if (const char* tf = std::getenv("TF_CONFIG")) tf_config = tf;
  if (const char* dir = std::getenv(kAuthDirEnv)) auth_dir = dir;
  PsTaskOptions options;
  std::string insecure_env;
  if (const char* v = std::getenv(kInsecureEnv)) insecure_env = v;
  if (insecure_env == "1" || insecure_env == "true") {
    options.insecure = true;
  } else if (!insecure_env.empty() && insecure_env != "0" && insecure_env != "false") {
    std::fprintf(stderr, "error: $%s: must be 1, true, 0 or false, got \"%s\"\n", kInsecureEnv,
                 insecure_env.c_str());
    return 2;
  }
  int64_t shutdown_grace_seconds = absl::ToInt64Seconds(options.shutdown_grace);
  int64_t keep_serving_seconds =
      absl::ToInt64Seconds(options.keep_serving_after_checkpoint_failure);
  FlagParser parser("kubetrain-ps --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  parser.String("config", &config_file, "TrainingJob YAML file");
  parser.String("tf_config", &tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser.String("auth_dir", &auth_dir,
                "the job's credentials: job.key, and ca.crt, tls.crt, tls.key for TLS (default: "
                "$KUBETRAIN_AUTH_DIR; none: refused unless --insecure)");
  parser.Bool("insecure", &options.insecure,
              "without an auth directory, serve any client that reaches the port (pushes, "
              "pulls, Shutdown) instead of refusing to start (default: $KUBETRAIN_INSECURE=1); "
              "only on a network no one but the job can reach");
  parser.String("bind_host", &options.bind_host,
                "address to listen on; the port comes from TF_CONFIG");
  parser.String("metrics_address", &options.metrics_address, "host:port for /metrics; empty = off");
  parser.Int("shutdown_grace_seconds", &shutdown_grace_seconds,
             "after the chief's shutdown, how long to wait for workers to leave");
  parser.Int("keep_serving_after_checkpoint_failure_seconds", &keep_serving_seconds,
             "when the final checkpoint cannot be written, serve the parameters read-only this "
             "long for `kubetrain export --from-ps` before exiting 1 (0: exit at once)");
  std::string termination_log;
  AddTerminationLogFlag(parser, &termination_log);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  if (config_file.empty()) {
    std::fprintf(stderr, "error: --config is required\n\n%s", parser.Usage().c_str());
    return 2;
  }
  options.shutdown_grace = absl::Seconds(shutdown_grace_seconds);
  if (keep_serving_seconds < 0) {
    std::fprintf(stderr, "error: --keep_serving_after_checkpoint_failure_seconds: must be >= 0\n");
    return 2;
  }
  options.keep_serving_after_checkpoint_failure = absl::Seconds(keep_serving_seconds);
  InitProcess(ProcessProfile::kTensorBuffers);
  // SIGTERM (kubetrain run, the kubelet) ends serving with a final
  // checkpoint instead of losing what was trained since the last one.
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  options.signals = &g_signals;

  if (!auth_dir.empty()) {
    auto credentials = ReadTaskCredentials(auth_dir);
    if (!credentials.ok()) return ExitWithError(2, credentials.status().message(), termination_log);
    if (credentials->job_key.empty()) {
      return ExitWithError(2,
                           absl::StrCat(auth_dir, "/", kJobKeyFile,
                                        ": missing: a PS task checks its callers' tokens with the "
                                        "job key"),
                           termination_log);
    }
    options.credentials = *std::move(credentials);
  }

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
