#include "cli/eval.h"

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/dataset.h"
#include "core/flags.h"
#include "core/job_spec.h"
#include "core/model_file.h"
#include "core/tabular.h"

namespace kubetrain {

std::string ModelSummary(const ModelSpec& spec) {
  auto model = Model::Create(spec);
  return model.ok() ? model->Summary() : spec.type;
}

absl::StatusOr<EvalResult> EvaluateModelFile(const std::string& model_path,
                                             const std::string& data) {
  auto file = ReadModelFile(model_path);
  if (!file.ok()) return file.status();
  auto model = Model::Create(file->spec);
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model_path, ": ", model.status().message()));
  }
  // The data as the job read it: the dataset section recorded in the file.
  TrainingSpec training;
  if (!file->dataset_yaml.empty()) {
    if (absl::Status st = ParseDatasetSection(file->dataset_yaml, &training); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": the recorded dataset: ", st.message()));
    }
  }
  absl::StatusOr<Dataset> test;
  if (training.dataset_format != "idx") {
    if (!data.empty()) training.tabular.test_files = {data};
    // The columns the model looks up by id (embeddings, the wide part) are
    // read as lookup ids, as the job's spec marked them.
    for (ColumnSpec& c : training.tabular.columns) {
      c.as_ids = std::any_of(file->spec.sparse_inputs.begin(), file->spec.sparse_inputs.end(),
                             [&c](const SparseInput& in) { return in.column == c.name; });
    }
    if (FeatureDim(training.tabular) != model->input_dim() ||
        IdSlots(training.tabular) != model->id_slots()) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_path, ": the model takes ", model->input_dim(), " input values and ",
          model->id_slots(), " lookup ids per example, its recorded dataset columns make ",
          FeatureDim(training.tabular), " and ", IdSlots(training.tabular)));
    }
    Dataset norm;
    norm.norm_mean = file->norm_mean;
    norm.norm_std = file->norm_std;
    test = LoadTabular(training.tabular, training.tabular.test_files, &norm);
  } else {
    const std::string dir = !data.empty()                 ? data
                            : !file->dataset_yaml.empty() ? training.dataset_path
                                                          : kDefaultFashionMnistDir;
    test = LoadFashionMnist(dir, /*train=*/false);
    if (test.ok() && test->feature_dim() != model->input_dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_path, ": the model takes ", model->input_dim(), " input features, the test set in ",
          dir, " has ", test->feature_dim(), " (", test->rows, "x", test->cols, " images)"));
    }
  }
  if (!test.ok()) return test.status();
  Batch batch;
  batch.x = test->images.data();
  batch.labels = test->labels.data();
  batch.targets = test->targets.empty() ? nullptr : test->targets.data();
  batch.lookup_ids = test->lookup_ids.data();
  batch.lookup_weights = test->lookup_weights.empty() ? nullptr : test->lookup_weights.data();
  batch.size = test->size;
  // Sparse models: only the rows the test set looks up, as the job's chief
  // pulls them; a dynamic table's row the file does not hold reads as its
  // initial value, as the PS serves it.
  SparseBatch lookups;
  if (model->sparse()) {
    lookups = model->Lookups(test->lookup_ids.data(), test->size,
                             test->lookup_weights.empty() ? nullptr : test->lookup_weights.data());
    if (absl::Status s = KeepTableRows(*model, CompactLookups(&lookups), &*file); !s.ok()) {
      return absl::DataLossError(absl::StrCat(model_path, ": ", s.message()));
    }
    batch.sparse = &lookups;
  }
  const EvalMetrics m = model->Evaluate(file->params, batch);
  EvalResult result;
  result.model_path = model_path;
  result.model_summary = model->Summary();
  result.job_name = file->job_name;
  result.global_step = file->global_step;
  result.examples = test->size;
  result.records_skipped = test->skipped_records;
  result.test_accuracy = m.accuracy.value_or(-1);
  result.test_auc = m.auc;
  if (m.auc) result.test_log_loss = m.log_loss;
  result.test_rmse = m.rmse;
  return result;
}

int EvalCommand(int argc, char** argv, std::FILE* out, std::FILE* err) {
  std::string data_dir;
  bool json = false;
  FlagParser parser("kubetrain eval MODEL");
  parser.String("data", &data_dir,
                "the test data: an IDX directory (t10k-*-ubyte.gz), or for a CSV model a file or "
                "glob; default: the test set recorded in the model file (else " +
                    std::string(kDefaultFashionMnistDir) + ")");
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
        {"model", result->model_path},  {"spec", result->model_summary},
        {"job_name", result->job_name}, {"global_step", result->global_step},
        {"examples", result->examples},
    };
    if (result->test_accuracy >= 0) j["test_accuracy"] = result->test_accuracy;
    if (result->test_auc) j["test_auc"] = *result->test_auc;
    if (result->test_log_loss) j["test_log_loss"] = *result->test_log_loss;
    if (result->test_rmse) j["test_rmse"] = *result->test_rmse;
    if (result->records_skipped > 0) j["records_skipped"] = result->records_skipped;
    std::fprintf(out, "%s\n", j.dump().c_str());
  } else {
    std::string figures;
    if (result->test_accuracy >= 0) {
      figures = absl::StrFormat("test accuracy %.4f", result->test_accuracy);
    }
    if (result->test_auc)
      absl::StrAppend(&figures, absl::StrFormat(", AUC %.4f", *result->test_auc));
    if (result->test_log_loss) {
      absl::StrAppend(&figures, absl::StrFormat(", log loss %.4f", *result->test_log_loss));
    }
    if (result->test_rmse)
      absl::StrAppend(&figures, absl::StrFormat("test RMSE %.4f", *result->test_rmse));
    std::fprintf(
        out, "%s\n",
        absl::StrFormat("%s: %s, global step %d, %s on %d examples%s", result->model_path,
                        result->model_summary, result->global_step, figures, result->examples,
                        result->records_skipped > 0
                            ? absl::StrCat(" (", result->records_skipped, " bad records skipped)")
                            : "")
            .c_str());
  }
  std::fflush(out);
  return 0;
}

}  // namespace kubetrain
