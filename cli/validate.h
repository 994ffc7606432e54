// `kubetrain validate FILE.yaml`: parses and validates a TrainingJob, reads
// its dataset's real size (epochs become global steps), and prints what the
// job means; errors name the field or the file.
#ifndef KUBETRAIN_CLI_VALIDATE_H_
#define KUBETRAIN_CLI_VALIDATE_H_

#include <cstdio>
#include <string>

namespace kubetrain {

// Returns the exit code: 0 valid, 2 not (the error is written to `err`).
int ValidateCommand(const std::string& file, std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_VALIDATE_H_
