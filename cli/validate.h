// `kubetrain validate FILE.yaml`: parses and validates a TrainingJob, reads
// its dataset's real size (epochs become global steps), and prints what the
// job means; errors name the field or the file.
#ifndef KUBETRAIN_CLI_VALIDATE_H_
#define KUBETRAIN_CLI_VALIDATE_H_

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "core/memory_budget.h"

namespace kubetrain {

// The --memory-limit flag ("" = DetectMemoryLimit()) as a MemoryLimit.
absl::StatusOr<MemoryLimit> MemoryLimitFromFlag(const std::string& flag);

// Returns the exit code: 0 valid, 2 not (the error is written to `err`).
// `memory_limit` is the --memory-limit flag ("" = the cgroup's limit or the
// machine's memory): the model must fit every task in it (core/memory_budget.h).
int ValidateCommand(const std::string& file, const std::string& memory_limit = "",
                    std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_VALIDATE_H_
