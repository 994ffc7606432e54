#include "core/task_config.h"

#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/dataset.h"
#include "core/memory_budget.h"

namespace kubetrain {

absl::StatusOr<TrainingSet> OpenTrainingSet(const TrainingSpec& training) {
  if (training.dataset_format == "idx") {
    auto source = OpenIdxSource(training.dataset_path, /*train=*/true);
    if (!source.ok()) return source.status();
    auto count = CountExamples(training.dataset_path, /*train=*/true);
    if (!count.ok()) return count.status();
    TrainingSet set;
    set.size = *count;
    set.source = std::move(*source);
    return set;
  }
  return OpenTabularTrainingSet(training.tabular);
}

absl::StatusOr<Dataset> LoadTestSet(const TrainingSpec& training, const TrainingSet* train_set) {
  if (training.dataset_format == "idx") return LoadFashionMnist(training.dataset_path, false);
  std::optional<TrainingSet> own;
  if (train_set == nullptr && !training.tabular.libsvm) {  // csv: the training set's mean/std
    auto opened = OpenTrainingSet(training);
    if (!opened.ok()) return opened.status();
    own = std::move(*opened);
    train_set = &*own;
  }
  Dataset norm;
  if (train_set != nullptr) {
    norm.norm_mean = train_set->norm_mean;
    norm.norm_std = train_set->norm_std;
  }
  return LoadTabular(training.tabular, training.tabular.test_files, &norm);
}

absl::StatusOr<int64_t> TrainExamples(const TrainingSpec& training) {
  if (training.dataset_format != "idx") {
    // Records that load (bad ones skipped under onBadRecord: skip).
    auto data = OpenTrainingSet(training);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat("spec.training.dataset.", training.tabular.train_files_key,
                                       ": ", data.status().message()));
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

namespace {

absl::Status InField(const std::string& field, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("spec.training.dataset.", field, ": ", s.message()));
}

// The first `records` records of the IDX training or test set.
absl::Status CheckIdxSet(const std::string& dir, bool train, int64_t records) {
  auto source = OpenIdxSource(dir, train);
  if (!source.ok()) return source.status();
  auto reader = (*source)->Open();
  if (!reader.ok()) return reader.status();
  Record r;
  for (int64_t n = 0; n < records; ++n) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  return absl::OkStatus();
}

// Each pattern of one file list (`key`: the field it was given as), each
// file's first `records` records.
absl::Status CheckTabularSet(const TabularSpec& spec, const std::vector<std::string>& patterns,
                             const std::string& key, int64_t records) {
  int64_t loaded = 0;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string field =
        key == "trainFiles" || key == "testFiles" ? absl::StrCat(key, "[", i, "]") : key;
    auto files = ExpandFiles({patterns[i]});
    if (!files.ok()) return InField(field, files.status());
    for (const std::string& file : *files) {
      auto n = CheckTabularFile(spec, file, records);
      if (!n.ok()) return InField(field, n.status());
      loaded += *n;
    }
  }
  if (loaded == 0) {
    return InField(key,
                   absl::InvalidArgumentError(absl::StrCat(
                       absl::StrJoin(patterns, ", "), ": no records",
                       spec.skip_bad_records ? " (onBadRecord: skip passed over every one)" : "")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDatasetFiles(const TrainingSpec& training, int64_t records) {
  if (training.dataset_format == "idx") {
    for (bool train : {true, false}) {
      if (absl::Status s = CheckIdxSet(training.dataset_path, train, records); !s.ok()) {
        return InField("path", s);
      }
    }
    return absl::OkStatus();
  }
  const TabularSpec& t = training.tabular;
  if (absl::Status s = CheckTabularSet(t, t.train_files, t.train_files_key, records); !s.ok()) {
    return s;
  }
  return CheckTabularSet(t, t.test_files, t.test_files_key, records);
}

absl::StatusOr<int64_t> JobTargetSteps(const TrainingJob& job) {
  if (!job.training.epochs.has_value()) return job.TargetSteps(0);
  auto examples = TrainExamples(job.training);
  if (!examples.ok()) return examples.status();
  return job.TargetSteps(*examples);
}

namespace {

constexpr char kFingerprintPrefix[] = "kt1;";

std::string Num(double v) { return ShortestDouble(v); }

std::vector<std::pair<std::string, std::string>> FingerprintFields(const std::string& fp) {
  std::vector<std::pair<std::string, std::string>> fields;
  if (!absl::StartsWith(fp, kFingerprintPrefix)) return fields;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(fp).substr(sizeof(kFingerprintPrefix) - 1), ';')) {
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) continue;
    fields.emplace_back(std::string(part.substr(0, eq)), std::string(part.substr(eq + 1)));
  }
  return fields;
}

// The fields of optimizer `o` that every task must agree on, each named
// `prefix` + its spec key (only those of its type: a job's fingerprint does
// not change with fields its optimizer ignores).
void AppendOptimizerFields(const std::string& prefix, const OptimizerSpec& o,
                           std::vector<std::string>* fields) {
  auto add = [&](const char* key, const std::string& value) {
    fields->push_back(absl::StrCat(prefix, key, "=", value));
  };
  add("type", o.type);
  add("learningRate", Num(o.learning_rate));
  if (o.type == "momentum") {
    add("momentum", Num(o.momentum));
    add("nesterov", o.nesterov ? "true" : "false");
  }
  if (o.type == "adam") {
    add("beta1", Num(o.beta1));
    add("beta2", Num(o.beta2));
  }
  if (o.type == "adam" || o.type == "adagrad") add("epsilon", Num(o.epsilon));
  if (o.type == "adagrad" || o.type == "ftrl")
    add("initialAccumulator", Num(o.initial_accumulator));
  if (o.type == "ftrl") {
    add("l1", Num(o.l1));
    add("l2", Num(o.l2));
    add("learningRatePower", Num(o.learning_rate_power));
  }
}

}  // namespace

std::string JobFingerprint(const TaskConfig& c) {
  const TrainingSpec& t = c.job.training;
  std::vector<std::string> fields = {
      absl::StrCat("placement=", c.placement.Fingerprint()),
      absl::StrCat("model=", t.model.type, "[", absl::StrJoin(t.model.hidden_units, ","), "]"),
      absl::StrCat("mode=", TrainingModeName(t.mode)),
      absl::StrCat("replicasToAggregate=", c.job.effective_replicas_to_aggregate()),
      absl::StrCat("maxStaleness=", t.max_staleness.has_value() ? absl::StrCat(*t.max_staleness)
                                                                : std::string("none")),
      absl::StrCat("batchSize=", t.batch_size),
      absl::StrCat("seed=", t.seed),
      absl::StrCat("targetSteps=", c.target_steps),
      absl::StrCat("ps=", c.num_ps),
      absl::StrCat("workers=", c.num_workers),
      absl::StrCat("chief=", c.job.has_chief_replica() ? 1 : 0),
      absl::StrCat("chunkBytes=", t.chunk_bytes),
      absl::StrCat("barrierTimeoutSeconds=", Num(t.barrier_timeout_seconds)),
  };
  AppendOptimizerFields("optimizer.", t.optimizer, &fields);
  if (t.wide_optimizer.has_value()) {
    AppendOptimizerFields("model.wide.optimizer.", *t.wide_optimizer, &fields);
  }
  return absl::StrCat(kFingerprintPrefix, absl::StrJoin(fields, ";"));
}

std::string DescribeFingerprintDifference(const std::string& theirs, const std::string& ours) {
  const auto a = FingerprintFields(theirs);
  const auto b = FingerprintFields(ours);
  if (a.empty() || b.empty()) return "";
  std::map<std::string, std::string> mine(b.begin(), b.end());
  std::vector<std::string> diffs;
  for (const auto& [key, value] : a) {
    auto it = mine.find(key);
    const std::string here = it == mine.end() ? "unset" : it->second;
    if (here != value) diffs.push_back(absl::StrCat(key, ": ", value, " there, ", here, " here"));
    if (it != mine.end()) mine.erase(it);
  }
  for (const auto& [key, value] : mine) {
    diffs.push_back(absl::StrCat(key, ": unset there, ", value, " here"));
  }
  return absl::StrJoin(diffs, "; ");
}

std::vector<std::string> FingerprintsIn(const std::string& text) {
  std::vector<std::string> found;
  for (size_t pos = text.find(kFingerprintPrefix); pos != std::string::npos;
       pos = text.find(kFingerprintPrefix, pos + 1)) {
    size_t end = pos;
    while (end < text.size() && !absl::ascii_isspace(text[end]) && text[end] != ':' &&
           text[end] != ',' && text[end] != ')')
      ++end;
    found.push_back(text.substr(pos, end - pos));
  }
  return found;
}

absl::Status ExplainFingerprintMismatch(const absl::Status& s, const std::string& ours,
                                        const std::string& advice) {
  if (!absl::IsFailedPrecondition(s)) return s;
  // The refusal quotes the PS's fingerprint and ours; say which fields differ.
  for (const std::string& theirs : FingerprintsIn(std::string(s.message()))) {
    const std::string diff = DescribeFingerprintDifference(theirs, ours);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(s.message(), " (differs: ", diff, "; ", advice, ")"));
    }
  }
  return s;
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
  c.fingerprint = JobFingerprint(c);
  return c;
}

}  // namespace kubetrain
