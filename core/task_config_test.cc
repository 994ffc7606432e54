// LoadTaskConfig: the dataset size, and TF_CONFIG must agree with the job on its tasks.
#include "core/task_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "core/testing/temp_files.h"

namespace kubetrain {
namespace {

constexpr char kTfConfig[] =
    R"({"cluster":{"ps":["127.0.0.1:2222"],"worker":["127.0.0.1:2223"]},"task":{"type":"worker","index":0}})";

// A job file whose dataset lives in `data_dir`; `size` is "steps: N" or "epochs: N".
std::string WriteJob(const std::string& dir, const std::string& data_dir, const std::string& size) {
  const std::string path = dir + "/job.yaml";
  WriteFile(path,
            "apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: {name: t}\n"
            "spec:\n  replicaSpecs: {PS: {replicas: 1}, Worker: {replicas: 1}}\n"
            "  training:\n    batchSize: 10\n    " +
                size +
                "\n"
                "    dataset: {name: fashion-mnist, path: " +
                data_dir + "}\n");
  return path;
}

// An IDX1 label file header promising `count` labels (the body is not read).
void WriteLabelHeader(const std::string& data_dir, uint32_t count) {
  ASSERT_EQ(::mkdir(data_dir.c_str(), 0755), 0);
  std::string header = {0,
                        0,
                        8,
                        1,
                        static_cast<char>(count >> 24),
                        static_cast<char>(count >> 16),
                        static_cast<char>(count >> 8),
                        static_cast<char>(count)};
  WriteFile(data_dir + "/train-labels-idx1-ubyte", header);
  // The dataset directory holds gzip files (train-labels-idx1-ubyte.gz).
  ASSERT_EQ(std::system(("gzip -c " + data_dir + "/train-labels-idx1-ubyte > " + data_dir +
                         "/train-labels-idx1-ubyte.gz")
                            .c_str()),
            0);
}

TEST(TaskConfigTest, EpochsUseTheDatasetsRealSize) {
  const std::string dir = NewTestDir("taskconfig");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteLabelHeader(dir + "/data", 1000);
  auto c = LoadTaskConfig(WriteJob(dir, dir + "/data", "epochs: 2"), kTfConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_examples, 1000);
  EXPECT_EQ(c->target_steps, 200);  // 2 x 1000 / (10 x 1 worker)
  TrainingSpec spec;
  spec.dataset_path = dir + "/data";
  EXPECT_EQ(*TrainExamples(spec), 1000);
  EXPECT_EQ(*JobTargetSteps(c->job), 200);
}

TEST(TaskConfigTest, MissingDataFailsOnlyWhenEpochsNeedIt) {
  const std::string dir = NewTestDir("taskconfig");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  auto with_steps = LoadTaskConfig(WriteJob(dir, dir + "/none", "steps: 7"), kTfConfig);
  ASSERT_TRUE(with_steps.ok()) << with_steps.status();
  EXPECT_EQ(with_steps->target_steps, 7);
  EXPECT_EQ(with_steps->train_examples, 0);
  auto with_epochs = LoadTaskConfig(WriteJob(dir, dir + "/none", "epochs: 1"), kTfConfig);
  ASSERT_FALSE(with_epochs.ok());
  EXPECT_CONTAINS(std::string(with_epochs.status().message()), "spec.training.dataset.path");
  EXPECT_CONTAINS(std::string(with_epochs.status().message()), "train-labels-idx1-ubyte.gz");
  EXPECT_EQ(*JobTargetSteps(with_steps->job), 7);  // steps need no data
}

constexpr char kJob[] = R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: tc}
spec:
  replicaSpecs:
    PS: {replicas: 1}
    Worker: {replicas: 2}
CHIEF  training:
    model: {type: softmax}
    steps: 10
)";

absl::StatusOr<TaskConfig> Load(bool job_has_chief, const std::string& tf_config) {
  const std::string dir = NewTestDir("taskconfig");
  mkdir(dir.c_str(), 0755);
  std::string yaml = kJob;
  yaml.replace(yaml.find("CHIEF"), 5, job_has_chief ? "    Chief: {replicas: 1}\n" : "");
  WriteFile(dir + "/job.yaml", yaml);
  return LoadTaskConfig(dir + "/job.yaml", tf_config);
}

constexpr char kWithChief[] =
    R"({"cluster":{"ps":["h:1"],"worker":["h:2","h:3"],"chief":["h:4"]},"task":{"type":"chief","index":0}})";
constexpr char kWithoutChief[] =
    R"({"cluster":{"ps":["h:1"],"worker":["h:2","h:3"]},"task":{"type":"worker","index":1}})";

TEST(TaskConfigTest, TheChiefTaskMustMatchTheJobsChiefReplica) {
  auto ok = Load(true, kWithChief);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->num_workers, 2);  // the chief is not a worker
  EXPECT_TRUE(ok->job.IsChiefTask(ok->tf.task_type, ok->tf.task_index));
  ASSERT_TRUE(Load(false, kWithoutChief).ok());

  auto missing = Load(true, kWithoutChief);
  ASSERT_FALSE(missing.ok());
  EXPECT_CONTAINS(std::string(missing.status().message()), "TF_CONFIG has 0 chief tasks, but ");
  EXPECT_CONTAINS(std::string(missing.status().message()), "has a Chief replica");
  auto extra = Load(false, kWithChief);
  ASSERT_FALSE(extra.ok());
  EXPECT_CONTAINS(std::string(extra.status().message()), "has no Chief replica");
}

TEST(TaskConfigTest, TheFingerprintCoversWhatEveryTaskMustAgreeOn) {
  const std::string dir = NewTestDir("fingerprint");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string base = WriteJob(dir, dir + "/absent", "steps: 10");
  auto a = LoadTaskConfig(base, kTfConfig);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->fingerprint, JobFingerprint(*a));
  EXPECT_TRUE(absl::StartsWith(a->fingerprint, "kt1;placement=")) << a->fingerprint;
  EXPECT_EQ(a->fingerprint.find(' '), std::string::npos);
  EXPECT_EQ(a->fingerprint.find(':'), std::string::npos);
  EXPECT_EQ(DescribeFingerprintDifference(a->fingerprint, a->fingerprint), "");
  // Each of these changes a field the tasks must agree on.
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"    seed: 9\n", "seed: 1 there, 9 here"},
      {"    optimizer: {type: adam, learningRate: 0.5, epsilon: 0.001}\n",
       "optimizer.type: sgd there, adam here"},
      {"    optimizer: {learningRate: 0.5}\n", "optimizer.learningRate: 0.01"},
      {"    mode: async\n", "mode: sync there, async here"},
      {"    model: {type: mlp, hiddenUnits: [8]}\n", "model: softmax[] there, mlp[8] here"},
      {"    transport: {chunkBytes: 8192}\n", "chunkBytes: 1048576 there, 8192 here"},
      {"    barrierTimeoutSeconds: 3\n", "barrierTimeoutSeconds: 0 there, 3 here"},
  };
  for (const auto& [extra, expected] : changes) {
    const std::string path = dir + "/other.yaml";
    WriteFile(path, ReadFile(base) + extra);
    auto b = LoadTaskConfig(path, kTfConfig);
    ASSERT_TRUE(b.ok()) << extra << b.status();
    EXPECT_NE(a->fingerprint, b->fingerprint) << extra;
    EXPECT_CONTAINS(DescribeFingerprintDifference(a->fingerprint, b->fingerprint), expected);
  }
  // FTRL's hyper-parameters, the wide part's optimizer's too: a PS restoring
  // a checkpoint of other ones would apply another rule to the same state.
  const std::string ftrl = "    optimizer: {type: ftrl, learningRate: 0.5, l1: 0.1, l2: 0.2}\n";
  WriteFile(dir + "/ftrl.yaml", ReadFile(base) + ftrl);
  auto f = LoadTaskConfig(dir + "/ftrl.yaml", kTfConfig);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::vector<std::pair<std::string, std::string>> ftrl_changes = {
      {"l1: 0.1", "optimizer.l1: 0.1 there, 0.3 here"},
      {"l2: 0.2", "optimizer.l2: 0.2 there, 0.3 here"},
      {"l2: 0.2", "optimizer.learningRatePower: -0.5 there, -0.25 here"},
      {"l2: 0.2", "optimizer.initialAccumulator: 0.1 there, 1 here"},
  };
  const std::vector<std::string> replacements = {
      "l1: 0.3", "l2: 0.3", "l2: 0.2, learningRatePower: -0.25", "l2: 0.2, initialAccumulator: 1"};
  for (size_t i = 0; i < ftrl_changes.size(); ++i) {
    std::string text = ReadFile(base) + ftrl;
    text.replace(text.find(ftrl_changes[i].first), ftrl_changes[i].first.size(), replacements[i]);
    WriteFile(dir + "/other.yaml", text);
    auto b = LoadTaskConfig(dir + "/other.yaml", kTfConfig);
    ASSERT_TRUE(b.ok()) << text << b.status();
    EXPECT_EQ(DescribeFingerprintDifference(f->fingerprint, b->fingerprint),
              ftrl_changes[i].second);
  }
  const std::string plain_ftrl = f->fingerprint;
  OptimizerSpec wide_ftrl;
  wide_ftrl.type = "ftrl";
  wide_ftrl.l1 = 0.5;
  f->job.training.wide_optimizer = wide_ftrl;
  const std::string wide = JobFingerprint(*f);
  f->job.training.wide_optimizer->l1 = 0.25;
  EXPECT_EQ(DescribeFingerprintDifference(wide, JobFingerprint(*f)),
            "model.wide.optimizer.l1: 0.5 there, 0.25 here");
  EXPECT_CONTAINS(DescribeFingerprintDifference(plain_ftrl, wide),
                  "model.wide.optimizer.type: unset there, ftrl here");
  // Steps and batch size: in the same file line.
  WriteFile(dir + "/other.yaml",
            ReadFile(base).replace(ReadFile(base).find("steps: 10"), 9, "steps: 11"));
  auto steps = LoadTaskConfig(dir + "/other.yaml", kTfConfig);
  ASSERT_TRUE(steps.ok());
  EXPECT_CONTAINS(DescribeFingerprintDifference(a->fingerprint, steps->fingerprint),
                  "targetSteps: 10 there, 11 here");
  // Found inside a message, as a handshake error quotes them.
  const std::string msg = "ps:0 holds model/placement " + a->fingerprint + " as shard 0, expects " +
                          steps->fingerprint + ": different specs";
  EXPECT_EQ(FingerprintsIn(msg), (std::vector<std::string>{a->fingerprint, steps->fingerprint}));
  EXPECT_EQ(DescribeFingerprintDifference("abc", a->fingerprint), "");
}

// A csv or libsvm job over files in `dir`: `dataset` is the rest of the
// dataset section (files, schema).
TrainingSpec TabularJob(const std::string& dir, const std::string& dataset) {
  const std::string path = dir + "/tab.yaml";
  WriteFile(path,
            "apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: {name: t}\n"
            "spec:\n  replicaSpecs: {PS: {replicas: 1}, Worker: {replicas: 1}}\n"
            "  training:\n    batchSize: 10\n    steps: 5\n"
            "    model: {layers: [{type: dense, units: 1}], head: sigmoid}\n"
            "    dataset:\n" +
                dataset);
  auto job = LoadTrainingJobFile(path);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->training : TrainingSpec{};
}

std::string CsvDataset(const std::string& train, const std::string& test,
                       const std::string& more = "") {
  return "      format: csv\n      " + train + "\n      " + test + "\n" + more +
         "      columns:\n"
         "        - {name: age, type: numeric}\n"
         "        - {name: income, type: label, classes: {'<=50K': 0, '>50K': 1}}\n";
}

std::string Rows(int n) {
  std::string rows;
  for (int i = 0; i < n; ++i)
    rows += absl::StrCat(20 + i % 50, ",", i % 2 ? ">50K" : "<=50K", "\n");
  return rows;
}

TEST(CheckDatasetFilesTest, CsvRecordsAreCheckedAgainstTheSchemaNamingFieldAndLine) {
  const std::string dir = NewTestDir("datacheck");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/train.csv", Rows(300));
  WriteFile(dir + "/test.csv", Rows(2) + "x,>50K\n" + Rows(5));
  TrainingSpec t =
      TabularJob(dir, CsvDataset("path: " + dir + "/train.csv", "testPath: " + dir + "/test.csv"));
  absl::Status s = CheckDatasetFiles(t);
  EXPECT_EQ(s.message(), "spec.training.dataset.testPath: " + dir +
                             "/test.csv:3: column 'age': expected a number, got \"x\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // A label outside its classes, and a wrong field count, in the training file.
  WriteFile(dir + "/test.csv", Rows(5));
  WriteFile(dir + "/train.csv", Rows(3) + "30,rich\n");
  EXPECT_EQ(CheckDatasetFiles(t).message(),
            "spec.training.dataset.path: " + dir +
                "/train.csv:4: column 'income': label \"rich\" is not one of the classes");
  WriteFile(dir + "/train.csv", "30\n");
  EXPECT_EQ(CheckDatasetFiles(t).message(), "spec.training.dataset.path: " + dir +
                                                "/train.csv:1: expected 2 fields (one per "
                                                "column), got 1");
}

TEST(CheckDatasetFilesTest, OnlyTheFirstRecordsAreRead) {
  const std::string dir = NewTestDir("datacheck");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/train.csv", Rows(kDataCheckRecords) + "x,>50K\n");
  WriteFile(dir + "/test.csv", Rows(3));
  TrainingSpec t =
      TabularJob(dir, CsvDataset("path: " + dir + "/train.csv", "testPath: " + dir + "/test.csv"));
  EXPECT_TRUE(CheckDatasetFiles(t).ok()) << CheckDatasetFiles(t);
  EXPECT_EQ(CheckDatasetFiles(t, kDataCheckRecords + 1).message(),
            absl::StrCat("spec.training.dataset.path: ", dir, "/train.csv:", kDataCheckRecords + 1,
                         ": column 'age': expected a number, got \"x\""));
}

TEST(CheckDatasetFilesTest, MissingFilesNameTheFieldAndTheListEntry) {
  const std::string dir = NewTestDir("datacheck");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/a.csv", Rows(3));
  WriteFile(dir + "/b.csv.gz", "not gzip at all, and not csv either\n");
  TrainingSpec t =
      TabularJob(dir, CsvDataset("path: " + dir + "/a.csv", "testPath: " + dir + "/absent.csv"));
  absl::Status s = CheckDatasetFiles(t);
  EXPECT_EQ(s.message(), "spec.training.dataset.testPath: " + dir + "/absent.csv: no such file");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  t = TabularJob(dir, CsvDataset("trainFiles: [" + dir + "/a.csv, " + dir + "/none-*.csv]",
                                 "testFiles: [" + dir + "/a.csv]"));
  EXPECT_EQ(CheckDatasetFiles(t).message(),
            "spec.training.dataset.trainFiles[1]: " + dir + "/none-*.csv: no such file");
  // A directory where a file should be.
  ASSERT_EQ(::mkdir((dir + "/d.csv").c_str(), 0755), 0);
  t = TabularJob(dir, CsvDataset("path: " + dir + "/a.csv", "testFiles: [" + dir + "/d.csv]"));
  s = CheckDatasetFiles(t);
  EXPECT_TRUE(
      absl::StartsWith(s.message(), "spec.training.dataset.testFiles[0]: " + dir + "/d.csv: "))
      << s;
  EXPECT_FALSE(s.ok());
}

TEST(CheckDatasetFilesTest, SkippedRecordsPassButASetWithNoneThatLoadFails) {
  const std::string dir = NewTestDir("datacheck");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/train.csv", "x,>50K\n" + Rows(3));
  WriteFile(dir + "/test.csv", "x,>50K\ny,<=50K\n");
  TrainingSpec t =
      TabularJob(dir, CsvDataset("path: " + dir + "/train.csv", "testPath: " + dir + "/test.csv",
                                 "      onBadRecord: skip\n"));
  EXPECT_EQ(CheckDatasetFiles(t).message(),
            "spec.training.dataset.testPath: " + dir +
                "/test.csv: no records (onBadRecord: skip passed over every one)");
  WriteFile(dir + "/test.csv", "x,>50K\n" + Rows(1));
  EXPECT_TRUE(CheckDatasetFiles(t).ok()) << CheckDatasetFiles(t);
}

TEST(CheckDatasetFilesTest, LibsvmIndicesMustBeInRange) {
  const std::string dir = NewTestDir("datacheck");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/train.svm", "+1 1:0.5 4:1\n-1 2:1\n");
  WriteFile(dir + "/test.svm", "+1 1:1\n-1 5:1\n");
  TrainingSpec t = TabularJob(dir, "      format: libsvm\n      trainFiles: [" + dir +
                                       "/train.svm]\n      testFiles: [" + dir +
                                       "/test.svm]\n      numFeatures: 4\n");
  absl::Status s = CheckDatasetFiles(t);
  EXPECT_TRUE(
      absl::StartsWith(s.message(), "spec.training.dataset.testFiles[0]: " + dir + "/test.svm:2: "))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "5")) << s;
  WriteFile(dir + "/test.svm", "+1 1:1\n-1 4:1\n");
  EXPECT_TRUE(CheckDatasetFiles(t).ok()) << CheckDatasetFiles(t);
}

TEST(CheckDatasetFilesTest, IdxHeadersAndBothSetsAreChecked) {
  const std::string dir = NewTestDir("datacheck");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string data = dir + "/data";
  WriteLabelHeader(data, 1000);  // the training labels only
  TrainingSpec t;
  t.dataset_path = data;
  absl::Status s = CheckDatasetFiles(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(s.message(), "spec.training.dataset.path: " + data +
                                                "/train-images-idx3-ubyte.gz: cannot open"))
      << s;
  // The training set alone: the test set is named.
  const std::string real = "/usr/share/datasets/fashion-mnist";
  const std::string half = dir + "/half";
  ASSERT_EQ(::mkdir(half.c_str(), 0755), 0);
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}) {
    ASSERT_EQ(::symlink((real + "/" + name).c_str(), (half + "/" + name).c_str()), 0);
  }
  t.dataset_path = half;
  s = CheckDatasetFiles(t);
  EXPECT_TRUE(absl::StartsWith(s.message(), "spec.training.dataset.path: " + half +
                                                "/t10k-images-idx3-ubyte.gz: cannot open"))
      << s;
  // The real data: every header and the first records of both sets.
  t.dataset_path = real;
  EXPECT_TRUE(CheckDatasetFiles(t).ok()) << CheckDatasetFiles(t);
}

}  // namespace
}  // namespace kubetrain
