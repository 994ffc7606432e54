// `kubetrain eval MODEL [--data DIR] [--json]`: loads a model file written by
// WriteModelFile (core/model_file.h) and reports its accuracy on the
// Fashion-MNIST test set.
#ifndef KUBETRAIN_CLI_EVAL_H_
#define KUBETRAIN_CLI_EVAL_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/model.h"

namespace kubetrain {

// Where Debian's dataset-fashion-mnist package installs the data.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct EvalResult {
  std::string model_path;
  std::string model_summary;  // ModelSummary(spec), e.g. "mlp 784-256-128-10"
  std::string job_name;       // the job that exported the model
  int64_t global_step = 0;
  double test_accuracy = 0.0;                                // < 0: the head has none (regression)
  std::optional<double> test_auc, test_log_loss, test_rmse;  // as the job reports them
  int64_t examples = 0;
  int64_t records_skipped = 0;
};

// "softmax 784-10", "mlp 784-256-128-10": the type and the layer sizes.
std::string ModelSummary(const ModelSpec& spec);

// Reads the model file and evaluates it on its test set: `data` (an IDX
// directory, or a CSV file/glob) if not empty, else the test set recorded in
// the model file (IDX files before layer lists: kDefaultFashionMnistDir).
// CSV data is read with the schema and normalisation recorded in the file.
// Errors name the file (or file:line) that is missing or wrong.
absl::StatusOr<EvalResult> EvaluateModelFile(const std::string& model_path,
                                             const std::string& data);

// The command: argv[0] is the program, argv[1] "eval", flags and MODEL follow.
// Prints the result to `out` (a line, or a JSON object with --json) and
// errors to `err`. Returns the exit code: 0 success, 2 bad input (bad flags,
// missing/corrupt model file, missing dataset).
int EvalCommand(int argc, char** argv, std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_EVAL_H_
