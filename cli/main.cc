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
  return command == "run" ? kubetrain::RunCommand(argc, argv, kubetrain::ExecutableDir())
                          : kubetrain::ValidateMain(argc, argv);
}
