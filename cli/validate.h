// `kubetrain validate FILE.yaml`: parses and validates a TrainingJob, checks
// its data (the training and test files are readable and their first records
// parse against spec.training.dataset: CheckDatasetFiles, core/task_config.h),
// reads its dataset's real size (epochs become global steps), and prints what
// the job means; errors name the field, the file or file:line.
#ifndef KUBETRAIN_CLI_VALIDATE_H_
#define KUBETRAIN_CLI_VALIDATE_H_

#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/flags.h"
#include "core/memory_budget.h"

namespace kubetrain {

// The --memory-limit flag ("" = DetectMemoryLimit()) as a MemoryLimit.
absl::StatusOr<MemoryLimit> MemoryLimitFromFlag(const std::string& flag);

// Returns the exit code: 0 valid, 2 not (the error is written to `err`).
// `memory_limit` is the --memory-limit flag ("" = the cgroup's limit or the
// machine's memory): the model must fit every task in it (core/memory_budget.h).
// `check_data` false (--skip-data: the data exists only inside the pods)
// skips the data check; epochs still need the training set.
int ValidateCommand(const std::string& file, const std::string& memory_limit = "",
                    bool check_data = true, std::FILE* out = stdout, std::FILE* err = stderr);

// What `kubetrain run` and `validate` share: --memory_limit on `parser`, and
// one TrainingJob file as the only argument. ParseJobCommand returns an exit
// code when the command should stop there (--help, bad flags, not exactly one
// file), else nullopt with *file set.
void AddMemoryLimitFlag(FlagParser& parser, std::string* memory_limit);
std::optional<int> ParseJobCommand(FlagParser& parser, int argc, char** argv, std::string* file);

// `kubetrain validate FILE.yaml [--memory_limit Q] [--skip_data]` (argv[1] is
// "validate"): ValidateCommand's exit code, 2 on bad flags.
int ValidateMain(int argc, char** argv);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_VALIDATE_H_
