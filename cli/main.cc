// kubetrain: the user's command.
//   kubetrain run FILE.yaml [--summary-json PATH] [--quiet] [--bin-dir DIR] ...
//   kubetrain validate FILE.yaml
//   kubetrain eval MODEL [--data DIR] [--json]
//   kubetrain export --from-ps HOST:PORT,... --job FILE.yaml --output MODEL [--auth-dir DIR]
#include <cstdio>
#include <string>
#include <vector>

#include "cli/eval.h"
#include "cli/export.h"
#include "cli/run.h"
#include "cli/validate.h"
#include "core/flags.h"
#include "core/job_spec.h"

namespace {

constexpr char kUsage[] =
    "usage: kubetrain <command> [flags]\n\n"
    "commands:\n"
    "  run FILE.yaml       run a TrainingJob as local processes (its PS, worker, chief and "
    "evaluator tasks)\n"
    "  validate FILE.yaml  check a TrainingJob spec and its data, and print what it means\n"
    "  eval MODEL          report a model file's accuracy on the Fashion-MNIST test set\n"
    "  export --from-ps HOST:PORT,... --job FILE.yaml --output MODEL [--auth-dir DIR]\n"
    "                      save the model of a job's live PS tasks (e.g. ones that could not "
    "write their final checkpoint) to a model file\n\n"
    "`kubetrain <command> --help` lists a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc < 2 ? "" : argv[1];
  if (command.empty() || command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, command.empty() ? stderr : stdout);
    return command.empty() ? 2 : 0;
  }
  if (command == "eval") return kubetrain::EvalCommand(argc, argv);
  if (command == "export") return kubetrain::ExportCommand(argc, argv, kubetrain::ExecutableDir());
  if (command != "run" && command != "validate") {
    std::fprintf(stderr, "error: unknown command \"%s\"\n\n%s", command.c_str(), kUsage);
    return 2;
  }
  kubetrain::RunOptions options;
  std::string restart_policy;
  options.bin_dir = kubetrain::ExecutableDir();
  kubetrain::FlagParser parser("kubetrain " + command + " FILE.yaml");
  std::string memory_limit;
  parser.String("memory_limit", &memory_limit,
                "the memory each task may use (8Gi, 512Mi, ...; default: the cgroup's limit, "
                "else the machine's memory): a model that cannot fit is refused");
  bool skip_data = false;
  if (command == "validate") {
    parser.Bool("skip_data", &skip_data,
                "do not read the data files (they exist only where the tasks run, e.g. in the "
                "pods' image or volume); epochs still need the training set");
  }
  if (command == "run") {
    parser.String("summary_json", &options.summary_json,
                  "also write the job summary as JSON to this file");
    parser.String("bin_dir", &options.bin_dir,
                  "directory holding kubetrain-ps and kubetrain-worker");
    parser.Bool("quiet", &options.quiet, "hide task logs; show only progress and the summary");
    parser.String("export_model", &options.export_model,
                  "write the trained model to this file (then: kubetrain eval FILE)");
    parser.Bool("tls", &options.tls,
                "the tasks speak mutual TLS under a CA made for this run (tokens are always on)");
    parser.String("restart_policy", &restart_policy,
                  "restart failed tasks per this policy instead of the spec's: Never, OnFailure, "
                  "Always, ExitCode");
  }
  std::vector<std::string> files;
  if (auto exit_code = parser.ParseMain(argc, argv, 2, &files)) return *exit_code;
  if (files.size() != 1) {
    std::fprintf(stderr, "error: expected exactly one TrainingJob file\n\n%s",
                 parser.Usage().c_str());
    return 2;
  }
  if (command == "validate") {
    return kubetrain::ValidateCommand(files[0], memory_limit, !skip_data);
  }
  options.job_file = files[0];
  options.memory_limit = memory_limit;
  if (!restart_policy.empty()) {
    options.restart_policy = kubetrain::RestartPolicyFromName(restart_policy);
    if (!options.restart_policy) {
      std::fprintf(stderr,
                   "error: --restart-policy: \"%s\" is not one of Never, OnFailure, Always, "
                   "ExitCode\n",
                   restart_policy.c_str());
      return 2;
    }
  }
  kubetrain::InitProcess(kubetrain::ProcessProfile::kDefault);
  options.interrupted = kubetrain::InterruptOnSignals();
  return kubetrain::RunJob(options);
}
