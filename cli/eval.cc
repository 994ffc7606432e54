#include "cli/eval.h"

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/dataset.h"
#include "core/flags.h"
#include "core/model_file.h"

namespace kubetrain {

std::string ModelSummary(const ModelSpec& spec) {
  auto model = Model::Create(spec);
  return model.ok() ? model->Summary() : spec.type;
}

absl::StatusOr<EvalResult> EvaluateModelFile(const std::string& model_path,
                                             const std::string& data_dir) {
  auto file = ReadModelFile(model_path);
  if (!file.ok()) return file.status();
  auto model = Model::Create(file->spec);
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model_path, ": ", model.status().message()));
  }
  auto data = LoadFashionMnist(data_dir, /*train=*/false);
  if (!data.ok()) return data.status();
  if (data->feature_dim() != model->input_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": the model takes ", model->input_dim(), " input features, the test set in ",
        data_dir, " has ", data->feature_dim(), " (", data->rows, "x", data->cols, " images)"));
  }
  EvalResult result;
  result.model_path = model_path;
  result.model_summary = ModelSummary(file->spec);
  result.job_name = file->job_name;
  result.global_step = file->global_step;
  result.examples = data->size;
  result.test_accuracy =
      model->Accuracy(file->params, data->images.data(), data->labels.data(), data->size);
  return result;
}

int EvalCommand(int argc, char** argv, std::FILE* out, std::FILE* err) {
  std::string data_dir = kDefaultFashionMnistDir;
  bool json = false;
  FlagParser parser("kubetrain eval MODEL");
  parser.String("data", &data_dir,
                "directory holding the Fashion-MNIST test set (t10k-*-ubyte.gz)");
  parser.Bool("json", &json, "print the result as a JSON object");
  std::vector<std::string> files;
  absl::Status st = parser.Parse(argc, argv, 2, &files);
  if (parser.help_requested()) {
    std::fputs(parser.Usage().c_str(), out);
    return 0;
  }
  if (!st.ok() || files.size() != 1) {
    std::fprintf(err, "error: %s\n\n%s",
                 st.ok() ? "expected exactly one model file" : std::string(st.message()).c_str(),
                 parser.Usage().c_str());
    return 2;
  }
  auto result = EvaluateModelFile(files[0], data_dir);
  if (!result.ok()) {
    std::fprintf(err, "error: %s\n", std::string(result.status().message()).c_str());
    return 2;
  }
  if (json) {
    nlohmann::json j = {
        {"model", result->model_path},
        {"spec", result->model_summary},
        {"job_name", result->job_name},
        {"global_step", result->global_step},
        {"test_accuracy", result->test_accuracy},
        {"examples", result->examples},
    };
    std::fprintf(out, "%s\n", j.dump().c_str());
  } else {
    std::fprintf(out, "%s\n",
                 absl::StrFormat("%s: %s, global step %d, test accuracy %.4f on %d examples",
                                 result->model_path, result->model_summary, result->global_step,
                                 result->test_accuracy, result->examples)
                     .c_str());
  }
  std::fflush(out);
  return 0;
}

}  // namespace kubetrain
