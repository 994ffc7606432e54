#include "cli/eval.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "core/model.h"
#include "core/model_file.h"
#include "core/tabular.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

bool HaveDataset() {
  return ::access(absl::StrCat(kDefaultFashionMnistDir, "/t10k-images-idx3-ubyte.gz").c_str(),
                  R_OK) == 0;
}

// Runs EvalCommand with the given arguments after "kubetrain eval".
struct EvalRun {
  int code = -1;
  std::string out, err;
};

std::string Slurp(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

EvalRun RunEval(std::vector<std::string> args) {
  args.insert(args.begin(), {"kubetrain", "eval"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  EvalRun r;
  r.code = EvalCommand(static_cast<int>(args.size()), argv.data(), out, err);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

std::string WriteZeroSoftmax(const std::string& path) {
  ModelFile f;
  auto model = Model::Create(f.spec);
  EXPECT_TRUE(model.ok());
  f.params = model->InitialParams(1);  // softmax: all zero
  f.global_step = 42;
  f.job_name = "zero";
  EXPECT_TRUE(WriteModelFile(path, f).ok());
  return path;
}

// A CSV job whose training and test file is dir/test.csv (written here
// from `csv`), parsed; its model; its test set read with `norm`'s figures.
struct CsvJob {
  TrainingSpec training;
  std::unique_ptr<Model> model;
  Dataset test;
};
void LoadCsvJob(const std::string& dir, const std::string& csv, const std::string& model,
                const std::string& columns, const Dataset& norm, CsvJob* out) {
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/test.csv", csv);
  const std::string yaml = absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: csv}
spec:
  replicaSpecs: {PS: {replicas: 1}, Worker: {replicas: 1}}
  training:
    model:
)",
                                        model, R"(    dataset:
      format: csv
      trainFiles: [)",
                                        dir, R"(/test.csv]
      testFiles: [)",
                                        dir, R"(/test.csv]
      columns:
)",
                                        columns, R"(    steps: 1
)");
  auto job = ParseTrainingJob(yaml);
  ASSERT_TRUE(job.ok()) << job.status();
  out->training = job->training;
  auto created = Model::Create(out->training.model);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(created->sparse());
  out->model = std::make_unique<Model>(std::move(*created));
  auto test = LoadTabular(out->training.tabular, out->training.tabular.test_files, &norm);
  ASSERT_TRUE(test.ok()) << test.status();
  out->test = std::move(*test);
}

// `kubetrain eval` of `path` reports `expected` on `examples` examples.
void ExpectEvalReports(const std::string& path, const EvalMetrics& expected, int64_t examples) {
  ASSERT_TRUE(expected.auc.has_value());
  auto result = EvaluateModelFile(path, "");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->examples, examples);
  EXPECT_EQ(result->test_accuracy, expected.accuracy.value());
  EXPECT_EQ(result->test_auc, expected.auc);
  EXPECT_EQ(result->test_log_loss, expected.log_loss);
}

// The model file of a CSV job (the job's dataset section and `norm`).
ModelFile FileOf(const CsvJob& job, const Dataset& norm) {
  ModelFile f;
  f.spec = job.training.model;
  f.params = job.model->InitialParams(3);
  f.global_step = 9;
  f.job_name = "csv";
  f.dataset_yaml = job.training.dataset_yaml;
  f.norm_mean = norm.norm_mean;
  f.norm_std = norm.norm_std;
  return f;
}

// The test set as a batch (whole tables unless `lookups`).
Batch AllOf(const Dataset& test, const SparseBatch* lookups = nullptr) {
  Batch all;
  all.x = test.images.data();
  all.labels = test.labels.data();
  all.lookup_ids = test.lookup_ids.data();
  all.size = test.size;
  all.sparse = lookups;
  return all;
}

// A wide & deep CSV model (embeddings and a wide part over categorical
// columns): eval reads the test set as training does (lookup ids for the
// looked-up columns, normalisation) and reports the job's own figures.
TEST(EvalTest, WideAndDeepCsvModelReportsWhatTheJobComputes) {
  const std::string dir = NewTestDir("eval");
  std::string csv;
  const char* colors[] = {"red", "green", "blue"};
  for (int i = 0; i < 60; ++i) {
    absl::StrAppend(&csv, 0.1 * i, ",", colors[i % 3], ",s", (i * 7) % 11, ",", i % 3 == 0 ? 1 : 0,
                    "\n");
  }
  Dataset norm;
  norm.norm_mean = {3.0f, 0, 0, 0};  // per column; only x is normalised
  norm.norm_std = {1.5f, 1, 1, 1};
  CsvJob job;
  ASSERT_NO_FATAL_FAILURE(LoadCsvJob(
      dir, csv,
      R"(      embeddings: [{column: color, dim: 3}, {column: shop, dim: 2, combiner: sum}]
      wide:
        columns: [color]
        crossed: [{columns: [color, shop], hashBuckets: 13}]
      layers: [{type: dense, units: 4, activation: relu}, {type: dense, units: 1}]
      head: wideAndDeep
)",
      R"(        - {name: x, type: numeric, normalize: true}
        - {name: color, type: categorical, vocabulary: [red, green, blue]}
        - {name: shop, type: categorical, hashBuckets: 5}
        - {name: y, type: label, classes: {"0": 0, "1": 1}}
)",
      norm, &job));
  ModelFile f = FileOf(job, norm);
  for (auto& v : f.params) {
    for (size_t k = 0; k < v.size(); ++k) v[k] += 0.05f * static_cast<float>((k * 5) % 7) - 0.1f;
  }
  const std::string path = dir + "/wd.ktm";
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  ExpectEvalReports(path, job.model->Evaluate(f.params, AllOf(job.test)), 60);
}

// The rows of one dynamic table, given whole (a model file's writer lists them).
class OneTableRows : public DynamicRowSource {
 public:
  std::vector<int64_t> ids;
  std::vector<float> values;
  absl::StatusOr<int64_t> CountRows(int) override { return static_cast<int64_t>(ids.size()); }
  absl::Status ForEachPage(int, const Page& page) override {
    page(ids.data(), values.data(), static_cast<int64_t>(ids.size()));
    return absl::OkStatus();
  }
};

// A dynamic column: the model file holds the rows of some shops only; eval
// reads the others as their initial values (from the recorded seed), as the
// PS tasks serve them to the chief.
TEST(EvalTest, ADynamicTableReadsTheRowsItHoldsAndInitialValuesForTheRest) {
  const std::string dir = NewTestDir("eval");
  std::string csv;
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&csv, 0.1 * i, ",s", (i * 7) % 11, ",", i % 3 == 0 ? 1 : 0, "\n");
  }
  Dataset norm;
  norm.norm_mean = {0, 0, 0};
  norm.norm_std = {1, 1, 1};
  CsvJob job;
  ASSERT_NO_FATAL_FAILURE(LoadCsvJob(dir, csv,
                                     R"(      embeddings: [{column: shop, dim: 2, combiner: sum}]
      layers: [{type: dense, units: 1}]
      head: sigmoid
)",
                                     R"(        - {name: x, type: numeric}
        - {name: shop, type: categorical, dynamic: true}
        - {name: y, type: label, classes: {"0": 0, "1": 1}}
)",
                                     norm, &job));
  const Model& model = *job.model;
  const int table = model.tables()[0];
  ASSERT_TRUE(model.variables()[table].dynamic);
  // The file holds shops s0..s4 (trained values); s5..s10 are missing.
  OneTableRows rows;
  std::map<int64_t, std::vector<float>> held;
  for (int k = 0; k < 5; ++k) {
    const int64_t id = DynamicColumnId(absl::StrCat("s", k));
    rows.ids.push_back(id);
    held[id] = {0.5f * k - 1, 1.0f - 0.25f * k};
    rows.values.insert(rows.values.end(), held[id].begin(), held[id].end());
  }
  ModelFile f = FileOf(job, norm);
  for (auto& v : f.params) std::fill(v.begin(), v.end(), 0.5f);
  f.seed = 77;
  f.dynamic_rows = &rows;
  const std::string path = dir + "/dyn.ktm";
  ASSERT_TRUE(WriteModelFile(path, f).ok());

  // What the chief computes: the test set's rows, held or initial.
  SparseBatch lookups = model.Lookups(job.test.lookup_ids.data(), job.test.size);
  const TableIds ids = CompactLookups(&lookups);
  Params params = f.params;
  params[table].clear();
  for (int64_t id : ids[0]) {
    std::vector<float> row(2);
    if (held.count(id)) {
      row = held[id];
    } else {
      InitialTableRow(model.variables()[table], 77, id, row.data());
    }
    params[table].insert(params[table].end(), row.begin(), row.end());
  }
  ExpectEvalReports(path, model.Evaluate(params, AllOf(job.test, &lookups)), 40);
}

TEST(EvalTest, ModelSummary) {
  ModelSpec spec;
  EXPECT_EQ(ModelSummary(spec), "softmax 784-10");
  spec.type = "mlp";
  spec.hidden_units = {256, 128};
  EXPECT_EQ(ModelSummary(spec), "mlp 784-256-128-10");
}

TEST(EvalTest, ZeroSoftmaxScoresOneTenth) {
  ASSERT_TRUE(HaveDataset()) << "install dataset-fashion-mnist (make deps)";
  const std::string path = WriteZeroSoftmax(NewTestDir("eval") + "/zero.ktm");
  auto result = EvaluateModelFile(path, kDefaultFashionMnistDir);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->examples, 10000);
  EXPECT_DOUBLE_EQ(result->test_accuracy, 0.1);
  EXPECT_EQ(result->global_step, 42);

  EvalRun r = RunEval({path});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            path + ": softmax 784-10, global step 42, test accuracy 0.1000 on 10000 examples\n");
}

TEST(EvalTest, Json) {
  ASSERT_TRUE(HaveDataset()) << "install dataset-fashion-mnist (make deps)";
  const std::string path = WriteZeroSoftmax(NewTestDir("eval") + "/zero.ktm");
  EvalRun r = RunEval({path, "--json", "--data", kDefaultFashionMnistDir});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["test_accuracy"].get<double>(), 0.1);
  EXPECT_EQ(j["examples"].get<int64_t>(), 10000);
  EXPECT_EQ(j["global_step"].get<int64_t>(), 42);
  EXPECT_EQ(j["model"].get<std::string>(), path);
  EXPECT_EQ(j["spec"].get<std::string>(), "softmax 784-10");
}

TEST(EvalTest, MissingModelFileIsBadInput) {
  const std::string path = NewTestDir("eval") + "/missing.ktm";
  EvalRun r = RunEval({path});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(r.out.empty());
  EXPECT_CONTAINS(r.err, "error: " + path);
}

TEST(EvalTest, CorruptModelFileIsBadInput) {
  const std::string path = NewTestDir("eval") + "/bad.ktm";
  WriteZeroSoftmax(path);
  FlipByte(path, 100, 0x01);  // a payload byte
  EvalRun r = RunEval({path});
  EXPECT_EQ(r.code, 2);
  EXPECT_CONTAINS(r.err, path + ": checksum mismatch");
}

TEST(EvalTest, MissingDatasetIsBadInput) {
  const std::string dir = NewTestDir("eval");
  const std::string path = WriteZeroSoftmax(dir + "/zero.ktm");
  EvalRun r = RunEval({path, "--data=" + dir + "/no-such-dir"});
  EXPECT_EQ(r.code, 2);
  EXPECT_CONTAINS(r.err, dir + "/no-such-dir");
}

TEST(EvalTest, UsageErrors) {
  EvalRun r = RunEval({});
  EXPECT_EQ(r.code, 2);
  EXPECT_CONTAINS(r.err, "expected exactly one model file");
  r = RunEval({"a.ktm", "--bogus"});
  EXPECT_EQ(r.code, 2);
  EXPECT_CONTAINS(r.err, "unknown flag --bogus");
  r = RunEval({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_CONTAINS(r.out, "usage: kubetrain eval MODEL");
}

}  // namespace
}  // namespace kubetrain
