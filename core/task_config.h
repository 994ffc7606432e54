// What a PS or worker task derives from its two inputs (the TrainingJob file
// and TF_CONFIG): the model, the placement and the number of global steps.
// Both kinds of task call this, so they cannot disagree.
#ifndef KUBETRAIN_CORE_TASK_CONFIG_H_
#define KUBETRAIN_CORE_TASK_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster_spec.h"
#include "core/dataset.h"
#include "core/job_spec.h"
#include "core/model.h"
#include "core/placement.h"

namespace kubetrain {

struct TaskConfig {
  TrainingJob job;
  TfConfig tf;
  std::unique_ptr<Model> model;
  Placement placement;
  int num_ps = 0;
  int num_workers = 0;
  // Training-set size, read from the dataset files (CountExamples). 0 when
  // they cannot be read and the job does not need it (it gives `steps`): the
  // task that loads the data then reports the file at fault.
  int64_t train_examples = 0;
  int64_t target_steps = 0;
  // JobFingerprint(*this): what the PS tasks hand out in GetInfo and every
  // worker, chief and evaluator requires (PS checkpoints keep the
  // placement's own fingerprint, so a resumed job may change e.g. its
  // learning rate).
  std::string fingerprint;
};

// Everything every task of a job must agree on, as one string of
// "key=value" fields joined by ';' after the prefix "kt1;" (no spaces or
// ':', so it reads as one token inside a message): the placement's hash (model
// variables, parts, shards), the model, mode, replicasToAggregate,
// maxStaleness, batch size, seed, target steps, task counts, chunk size,
// barrier timeout and the optimizer's type and settings. Two tasks started
// with specs that differ in any of these disagree.
std::string JobFingerprint(const TaskConfig& config);

// "seed: 7 on the PS, 3 here; optimizer.learningRate: ..." for two
// JobFingerprints that differ ("" if they do not, or if either is not one).
std::string DescribeFingerprintDifference(const std::string& theirs, const std::string& ours);

// Every JobFingerprint token found in `text` (e.g. an error message).
std::vector<std::string> FingerprintsIn(const std::string& text);

// A refused handshake (a PS holding another job fingerprint) with the fields
// that differ named, then `advice`: "... (differs: seed: 7 on the PS, 3 here;
// <advice>)". Any other status is returned as it is.
absl::Status ExplainFingerprintMismatch(const absl::Status& s, const std::string& ours,
                                        const std::string& advice);

// Training-set size of the job's dataset, read from its files at
// spec.training.dataset.path (the label file's header): what `kubetrain
// validate`, `kubetrain run` and the tasks convert epochs to steps with.
// Errors name the field and the file.
absl::StatusOr<int64_t> TrainExamples(const TrainingSpec& training);

// The job's training set as every task streams it: IDX files from
// spec.training.dataset.path (its size from the label file's header), or CSV
// / libsvm files scanned once (core/tabular.h: size, skipped records, CSV
// normalisation; a bad record under onBadRecord: fail is the error, naming
// file:line).
absl::StatusOr<TrainingSet> OpenTrainingSet(const TrainingSpec& training);

// The job's test set, in memory (the chief and evaluator evaluate all of
// it). CSV is normalised with the training set's figures: `train_set` if
// given, else the training files are scanned for them. Errors name the
// file:line (data) or the field.
absl::StatusOr<Dataset> LoadTestSet(const TrainingSpec& training,
                                    const TrainingSet* train_set = nullptr);

// How many records of each data file CheckDatasetFiles reads.
inline constexpr int64_t kDataCheckRecords = 100;

// What can be checked of the job's data before any task starts (`kubetrain
// validate`, `kubetrain run`'s pre-flight): the training and test files
// exist and are readable, and the first `records` records of each parse
// against spec.training.dataset as the tasks will read them: IDX image and
// label headers (magic, sizes, counts) and labels; csv fields per the
// column schema (count, numbers, classes, quotes); libsvm labels and feature
// indices in range. Under onBadRecord: skip bad records are passed over (a
// set with none that load is the error). Errors name the field and the file
// or file:line: "spec.training.dataset.testPath: adult.test:17: column 'age':
// expected a number, got \"x\"".
absl::Status CheckDatasetFiles(const TrainingSpec& training, int64_t records = kDataCheckRecords);

// The global steps `job` trains: `steps`, or its epochs converted with the
// dataset's real size (TrainExamples). Reads the data only for epochs, and
// only then can it fail.
absl::StatusOr<int64_t> JobTargetSteps(const TrainingJob& job);

// Errors name the input at fault: the job file, or TF_CONFIG (e.g. its ps list
// has 3 tasks but the job asks for 2).
absl::StatusOr<TaskConfig> LoadTaskConfig(const std::string& job_file,
                                          const std::string& tf_config_json);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_TASK_CONFIG_H_
