#include "core/task_config.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dataset.h"
#include "core/memory_budget.h"

namespace kubetrain {

absl::StatusOr<Dataset> LoadExamples(const TrainingSpec& training, bool train,
                                     const Dataset* train_set) {
  if (training.dataset_format != "csv") return LoadFashionMnist(training.dataset_path, train);
  if (train) return LoadCsv(training.tabular, training.tabular.train_files, nullptr);
  std::optional<Dataset> own;
  if (train_set == nullptr) {
    auto loaded = LoadCsv(training.tabular, training.tabular.train_files, nullptr);
    if (!loaded.ok()) return loaded.status();
    own = std::move(*loaded);
    train_set = &*own;
  }
  return LoadCsv(training.tabular, training.tabular.test_files, train_set);
}

absl::StatusOr<int64_t> TrainExamples(const TrainingSpec& training) {
  if (training.dataset_format == "csv") {
    // Records that load (bad ones skipped under onBadRecord: skip).
    auto data = LoadExamples(training, /*train=*/true);
    if (!data.ok()) {
      return absl::Status(data.status().code(), absl::StrCat("spec.training.dataset.trainFiles: ",
                                                             data.status().message()));
    }
    return data->size;
  }
  auto count = CountExamples(training.dataset_path, /*train=*/true);
  if (!count.ok()) {
    return absl::Status(count.status().code(),
                        absl::StrCat("spec.training.dataset.path: ", count.status().message()));
  }
  return *count;
}

absl::StatusOr<int64_t> JobTargetSteps(const TrainingJob& job) {
  if (!job.training.epochs.has_value()) return job.TargetSteps(0);
  auto examples = TrainExamples(job.training);
  if (!examples.ok()) return examples.status();
  return job.TargetSteps(*examples);
}

absl::StatusOr<TaskConfig> LoadTaskConfig(const std::string& job_file,
                                          const std::string& tf_config_json) {
  TaskConfig c;
  auto job = LoadTrainingJobFile(job_file);
  if (!job.ok()) return job.status();
  c.job = std::move(*job);
  if (tf_config_json.empty()) {
    return absl::InvalidArgumentError(
        "TF_CONFIG is not set (neither the environment variable nor --tf_config)");
  }
  auto tf = ParseTfConfig(tf_config_json);
  if (!tf.ok()) return tf.status();
  c.tf = std::move(*tf);
  c.num_ps = static_cast<int>(c.tf.tasks("ps").size());
  c.num_workers = static_cast<int>(c.tf.tasks("worker").size());
  if (c.num_ps != c.job.num_ps() || c.num_workers != c.job.num_workers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG has ", c.num_ps, " ps and ", c.num_workers, " worker tasks, but ",
                     job_file, " asks for ", c.job.num_ps(), " and ", c.job.num_workers()));
  }
  // The PS learn from the job who the chief is; TF_CONFIG must agree.
  const int chiefs = static_cast<int>(c.tf.tasks("chief").size());
  if (chiefs != (c.job.has_chief_replica() ? 1 : 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG has ", chiefs, " chief tasks, but ", job_file,
                     c.job.has_chief_replica() ? " has a Chief replica" : " has no Chief replica"));
  }
  auto model = Model::Create(c.job.training.model);
  if (!model.ok()) return model.status();
  c.model = std::make_unique<Model>(std::move(*model));
  // Before anything is allocated: a model this task cannot hold is a
  // configuration error naming spec.training.model, not a std::bad_alloc.
  if (absl::Status s =
          CheckTaskFitsMemory(c.job, c.tf.task_type, c.tf.task_index, DetectMemoryLimit());
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(job_file, ": ", s.message()));
  }
  c.placement =
      PlaceVariables(c.model->variables(), c.num_ps, c.job.training.split_threshold_bytes);
  auto examples = TrainExamples(c.job.training);
  if (examples.ok()) {
    c.train_examples = *examples;
  } else if (c.job.training.epochs.has_value()) {
    return examples.status();  // epochs cannot be turned into steps without it
  }
  c.target_steps = c.job.TargetSteps(c.train_examples);
  return c;
}

}  // namespace kubetrain
