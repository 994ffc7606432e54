// kubetrain: the user's command.
//   kubetrain run FILE.yaml [--summary-json PATH] [--quiet] [--bin-dir DIR] ...
//   kubetrain validate FILE.yaml
//   kubetrain eval MODEL [--data DIR] [--json]
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/eval.h"
#include "cli/run.h"
#include "core/flags.h"
#include "core/job_spec.h"
#include "core/task_config.h"

namespace {

std::atomic<bool> g_interrupted{false};  // set by SIGINT/SIGTERM, read by RunJob

void OnSignal(int) { g_interrupted.store(true); }

constexpr char kUsage[] =
    "usage: kubetrain <command> [flags]\n\n"
    "commands:\n"
    "  run FILE.yaml       run a TrainingJob as local processes (its PS, worker, chief and evaluator tasks)\n"
    "  validate FILE.yaml  check a TrainingJob spec and print what it means\n"
    "  eval MODEL          report a model file's accuracy on the Fashion-MNIST test set\n\n"
    "`kubetrain <command> --help` lists a command's flags.\n";

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

int Validate(const std::string& file) {
  auto job = kubetrain::LoadTrainingJobFile(file);
  auto steps = job.ok() ? kubetrain::JobTargetSteps(*job) : absl::StatusOr<int64_t>(job.status());
  if (!steps.ok()) {
    std::fprintf(stderr, "error: %s%s\n", job.ok() ? (file + ": ").c_str() : "",
                 std::string(steps.status().message()).c_str());
    return 2;
  }
  std::printf("%s: valid TrainingJob \"%s\": %s mode, %s model, %d PS, %d workers, %lld global steps\n",
              file.c_str(), job->name.c_str(), kubetrain::TrainingModeName(job->training.mode),
              job->training.model.type.c_str(), job->num_ps(), job->num_workers(),
              static_cast<long long>(*steps));
  return 0;
}

std::optional<kubetrain::RestartPolicy> ParseRestartPolicy(const std::string& name) {
  for (auto p : {kubetrain::RestartPolicy::kNever, kubetrain::RestartPolicy::kOnFailure,
                 kubetrain::RestartPolicy::kAlways, kubetrain::RestartPolicy::kExitCode}) {
    if (name == kubetrain::RestartPolicyName(p)) return p;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "eval") return kubetrain::EvalCommand(argc, argv);
  if (command != "run" && command != "validate") {
    std::fprintf(stderr, "error: unknown command \"%s\"\n\n%s", command.c_str(), kUsage);
    return 2;
  }
  kubetrain::RunOptions options;
  std::string restart_policy;
  options.bin_dir = SelfDir();
  kubetrain::FlagParser parser("kubetrain " + command + " FILE.yaml");
  if (command == "run") {
    parser.String("summary_json", &options.summary_json, "also write the job summary as JSON to this file");
    parser.String("bin_dir", &options.bin_dir, "directory holding kubetrain-ps and kubetrain-worker");
    parser.Bool("quiet", &options.quiet, "hide task logs; show only progress and the summary");
    parser.String("export_model", &options.export_model,
                  "write the trained model to this file (then: kubetrain eval FILE)");
    parser.String("restart_policy", &restart_policy,
                  "restart failed tasks per this policy instead of the spec's: Never, OnFailure, Always, ExitCode");
  }
  std::vector<std::string> files;
  if (auto exit_code = parser.ParseMain(argc, argv, 2, &files)) return *exit_code;
  if (files.size() != 1) {
    std::fprintf(stderr, "error: expected exactly one TrainingJob file\n\n%s", parser.Usage().c_str());
    return 2;
  }
  if (command == "validate") return Validate(files[0]);
  options.job_file = files[0];
  if (!restart_policy.empty()) {
    options.restart_policy = ParseRestartPolicy(restart_policy);
    if (!options.restart_policy) {
      std::fprintf(stderr, "error: --restart-policy: \"%s\" is not one of Never, OnFailure, Always, ExitCode\n",
                   restart_policy.c_str());
      return 2;
    }
  }
  kubetrain::InitProcess(kubetrain::ProcessProfile::kDefault);
  options.interrupted = &g_interrupted;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return kubetrain::RunJob(options);
}
