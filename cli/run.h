// `kubetrain run FILE.yaml`: the local mode. Runs every task of a TrainingJob
// (Chief, PS, Worker, Evaluator) as a process on this machine, with the same
// two inputs the operator gives pods (the job file and TF_CONFIG), shows
// progress, and ends with a summary. The loop itself is JobRunner
// (cli/job_runner.h); this wires it to real processes and the wall clock.
#ifndef KUBETRAIN_CLI_RUN_H_
#define KUBETRAIN_CLI_RUN_H_

#include <atomic>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/job_spec.h"

namespace kubetrain {

struct RunOptions {
  std::string job_file;
  std::string summary_json;  // write the summary here too
  std::string bin_dir;       // where kubetrain-ps and kubetrain-worker live
  bool quiet = false;        // no task logs, only progress and summary
  // Overrides every replica type's restartPolicy (e.g. Never to fail fast).
  std::optional<RestartPolicy> restart_policy;
  // The chief writes the final model here (default with checkpoints on:
  // <checkpoint.directory>/model.ktm).
  std::string export_model;
  // --memory-limit ("" = the cgroup's limit, else the machine's memory): every
  // task runs on this machine, so together they must fit in it.
  std::string memory_limit;
  // Every task gets a token (cli/local_credentials.h); with `tls` also the
  // job's CA and certificate, and the tasks speak mutual TLS.
  bool tls = false;
  // PS tasks serve pulls and pushes also over the bulk data plane (framed
  // TCP beside gRPC, TLS with `tls`; ps/bulk_server.h), which workers then use.
  bool bulk = true;
  // Set (by a signal handler) to stop the job: children get SIGTERM, then SIGKILL.
  const std::atomic<bool>* interrupted = nullptr;
};

// What `kubetrain run` checks before it starts any task, naming the field:
// the job's training and test data can be read and its first records parse
// (CheckDatasetFiles, core/task_config.h: the check `kubetrain validate`
// makes, errors naming the field and file:line), and the checkpoint directory can hold a file
// (spec.training.checkpoint.directory; core/file_env.h ProbeWritableDir).
absl::Status PreflightCheck(const TrainingJob& job);

// Returns the process exit code: 0 success, 1 job failed, 2 bad input (also
// a failed PreflightCheck), 130 interrupted.
int RunJob(const RunOptions& options);

// `kubetrain run FILE.yaml [flags]` (argv[1] is "run"): parses the flags
// into RunOptions (tasks from `bin_dir` unless --bin_dir) and runs the job;
// the exit code of RunJob, 2 on bad flags.
int RunCommand(int argc, char** argv, const std::string& bin_dir);

// The directory of the running executable (where `make build` puts
// kubetrain-ps and kubetrain-worker beside kubetrain); "." if unknown.
std::string ExecutableDir();
// Installs SIGINT/SIGTERM handlers that set the returned flag (for
// RunOptions::interrupted). Call once.
const std::atomic<bool>* InterruptOnSignals();

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_RUN_H_
