#include "cli/run.h"

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/console.h"
#include "cli/job_runner.h"
#include "cli/local_credentials.h"
#include "cli/process.h"
#include "cli/validate.h"
#include "core/clock.h"
#include "core/cluster_spec.h"
#include "core/file_env.h"
#include "core/flags.h"
#include "core/task_config.h"

namespace kubetrain {
namespace {

std::atomic<bool> g_interrupted{false};

void OnInterrupt(int) { g_interrupted.store(true); }

}  // namespace

absl::Status PreflightCheck(const TrainingJob& job) {
  if (absl::Status s = CheckDatasetFiles(job.training); !s.ok()) return s;
  const std::string& dir = job.training.checkpoint_dir;
  if (!dir.empty()) {
    if (absl::Status s = ProbeWritableDir(FileEnv::Default(), dir); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("spec.training.checkpoint.directory: ", dir,
                                                        " is not writable: ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

const std::atomic<bool>* InterruptOnSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return &g_interrupted;
}

int RunJob(const RunOptions& options) {
  auto job = LoadTrainingJobFile(options.job_file);
  if (!job.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (!job->has_training) {
    std::fprintf(stderr,
                 "error: %s: spec.training: required by kubetrain run (without it every replica "
                 "runs its own containers, which only a Kubernetes cluster runs: kubectl apply -f "
                 "%s)\n",
                 options.job_file.c_str(), options.job_file.c_str());
    return 2;
  }
  if (options.restart_policy) {
    for (auto& [key, replica] : job->replica_specs)
      replica.restart_policy = *options.restart_policy;
  }
  auto limit = MemoryLimitFromFlag(options.memory_limit);
  if (!limit.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(limit.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = CheckModelFitsMemory(*job, *limit, /*tasks_share_limit=*/true); !s.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", options.job_file.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  auto target = JobTargetSteps(*job);
  if (!target.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", options.job_file.c_str(),
                 std::string(target.status().message()).c_str());
    return 2;
  }
  // What every task will need and this machine can check before any starts:
  // a task that cannot read its data or write its checkpoints would only be
  // restarted again and again.
  if (absl::Status s = PreflightCheck(*job); !s.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", options.job_file.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  JobRunnerOptions runner;
  runner.ps_binary = options.bin_dir + "/kubetrain-ps";
  runner.worker_binary = options.bin_dir + "/kubetrain-worker";
  for (const auto& bin : {runner.ps_binary, runner.worker_binary}) {
    if (::access(bin.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "error: cannot find %s (build with `make build`, or pass --bin-dir)\n",
                   bin.c_str());
      return 2;
    }
  }
  runner.job_path = options.job_file;
  char cwd[4096];
  if (!runner.job_path.empty() && runner.job_path[0] != '/' && ::getcwd(cwd, sizeof(cwd))) {
    runner.job_path = std::string(cwd) + "/" + runner.job_path;
  }
  runner.export_model = options.export_model;
  runner.bulk_data_plane = options.bulk;
  auto ports = PickFreePorts(2 * static_cast<int>(JobTasks(*job).size()));
  if (!ports.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(ports.status().message()).c_str());
    return 1;
  }

  // The job's credentials, in a private directory that lives as long as the
  // run (PS tasks holding their parameters included): under $TMPDIR, else in
  // memory (/dev/shm), else /tmp.
  std::vector<std::string> parents = {"/dev/shm", "/tmp"};
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
    parents.insert(parents.begin(), tmp);
  }
  auto credentials = LocalCredentials::Create(*job, options.tls, parents);
  if (!credentials.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(credentials.status().message()).c_str());
    return 1;
  }
  runner.auth_dirs = (*credentials)->task_dirs();
  runner.export_auth_dir = (*credentials)->export_dir();

  RealClock clock;
  SubprocessLauncher launcher;
  Console console(options.quiet, stderr, &clock);
  console.Info(absl::StrCat("kubetrain run: task credentials (tokens",
                            options.tls ? ", mutual TLS" : "", ") in ", (*credentials)->root(),
                            ", removed at the end"));
  JobRunnerEnv env{&launcher, &clock, [](absl::Duration d) { absl::SleepFor(d); }, &console};
  JobRunResult result = JobRunner(*job, *target, *ports, runner, env).Run(options.interrupted);

  std::fputs(SummaryText(*job, *target, result).c_str(), stdout);
  std::fflush(stdout);
  if (!options.summary_json.empty()) {
    std::ofstream out(options.summary_json);
    out << SummaryJson(*job, *target, result).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "error: cannot write %s\n", options.summary_json.c_str());
      return 1;
    }
  }
  return result.ExitCode();
}

int RunCommand(int argc, char** argv, const std::string& bin_dir) {
  RunOptions options;
  options.bin_dir = bin_dir;
  FlagParser parser("kubetrain run FILE.yaml");
  AddMemoryLimitFlag(parser, &options.memory_limit);
  parser.String("summary_json", &options.summary_json,
                "also write the job summary as JSON to this file");
  parser.String("bin_dir", &options.bin_dir, "directory holding kubetrain-ps and kubetrain-worker");
  parser.Bool("quiet", &options.quiet, "hide task logs; show only progress and the summary");
  parser.String("export_model", &options.export_model,
                "write the trained model to this file (then: kubetrain eval FILE)");
  parser.Bool("tls", &options.tls,
              "the tasks speak mutual TLS under a CA made for this run (tokens are always on)");
  parser.Bool("bulk", &options.bulk,
              "pulls and pushes over the PS tasks' bulk data plane (framed TCP beside gRPC, "
              "faster; TLS with --tls); --bulk=false: gRPC only");
  std::string restart_policy;
  parser.String("restart_policy", &restart_policy,
                "restart failed tasks per this policy instead of the spec's: Never, OnFailure, "
                "Always, ExitCode");
  if (auto exit_code = ParseJobCommand(parser, argc, argv, &options.job_file)) return *exit_code;
  if (!restart_policy.empty()) {
    options.restart_policy = RestartPolicyFromName(restart_policy);
    if (!options.restart_policy) {
      std::fprintf(stderr,
                   "error: --restart-policy: \"%s\" is not one of Never, OnFailure, Always, "
                   "ExitCode\n",
                   restart_policy.c_str());
      return 2;
    }
  }
  InitProcess(ProcessProfile::kDefault);
  options.interrupted = InterruptOnSignals();
  return RunJob(options);
}

}  // namespace kubetrain
