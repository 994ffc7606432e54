#include "cli/validate.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

struct Validated {
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

Validated Validate(const std::string& file, const std::string& memory_limit = "",
                   bool check_data = true) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  Validated v;
  v.code = ValidateCommand(file, memory_limit, check_data, out, err);
  v.out = Slurp(out);
  v.err = Slurp(err);
  return v;
}

std::string Job(const std::string& dataset_path, const std::string& length) {
  return absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: small}
spec:
  replicaSpecs:
    PS: {replicas: 1}
    Worker: {replicas: 2}
  training:
    mode: sync
    model: {type: softmax}
    batchSize: 10
    dataset: {name: fashion-mnist, path: )",
                      dataset_path, "}\n    ", length, "\n");
}

// An IDX label file (magic 0x801, big-endian count) with `n` labels, gzipped.
void WriteLabels(const std::string& path, uint32_t n) {
  std::string idx = {0, 0, 8, 1};
  for (int shift = 24; shift >= 0; shift -= 8) idx.push_back(static_cast<char>(n >> shift));
  idx.append(n, '\0');
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, idx.data(), idx.size()), static_cast<int>(idx.size()));
  gzclose(f);
}

TEST(ValidateTest, EpochsUseTheDatasetsRealSize) {
  std::string dir = NewTestDir("validate");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteLabels(dir + "/train-labels-idx1-ubyte.gz", 1000);
  std::string file = dir + "/job.yaml";
  // 2 epochs of 1000 examples, 2 sync workers x batch 10 per step: 100 steps
  // (the data check needs the images too: not made here).
  WriteFile(file, Job(dir, "epochs: 2"));
  Validated v = Validate(file, "", /*check_data=*/false);
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_CONTAINS(v.out,
                  "valid TrainingJob \"small\": sync mode, softmax model, 1 PS, 2 workers, "
                  "100 global steps");
  EXPECT_CONTAINS(v.out, file + ": data: not checked (--skip-data)");
}

TEST(ValidateTest, TheDataIsCheckedEvenWithSteps) {
  std::string dir = NewTestDir("validate");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string file = dir + "/job.yaml";
  WriteFile(file, Job(dir + "/absent", "steps: 7"));
  Validated v = Validate(file);
  EXPECT_EQ(v.code, 2);
  EXPECT_CONTAINS(v.err, "error: " + file + ": spec.training.dataset.path: " + dir +
                             "/absent/train-images-idx3-ubyte.gz: cannot open");
  EXPECT_EQ(v.out, "");
  // --skip-data: steps need no dataset.
  v = Validate(file, "", /*check_data=*/false);
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_CONTAINS(v.out, "7 global steps");
  // The real Fashion-MNIST files pass.
  WriteFile(file, Job("/usr/share/datasets/fashion-mnist", "steps: 7"));
  v = Validate(file);
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_CONTAINS(v.out,
                  file + ": data: the first 100 records of every training and test file parse");
}

TEST(ValidateTest, ABadCsvRecordNamesTheFieldAndFileLine) {
  std::string dir = NewTestDir("validate");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/train.csv", "1.5,0\n2.5,1\n");
  WriteFile(dir + "/test.csv", "1.5,0\n2.5,2\n");
  std::string file = dir + "/job.yaml";
  WriteFile(file, absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: tab}
spec:
  replicaSpecs: {PS: {replicas: 1}, Worker: {replicas: 1}}
  training:
    model: {layers: [{type: dense, units: 2}], head: softmax}
    batchSize: 1
    steps: 3
    dataset:
      format: csv
      path: )",
                               dir, "/train.csv\n      testFiles: [", dir, R"(/test.csv]
      columns:
        - {name: x, type: numeric}
        - {name: y, type: label, numClasses: 2}
)"));
  Validated v = Validate(file);
  EXPECT_EQ(v.code, 2);
  EXPECT_CONTAINS(v.err,
                  "error: " + file + ": spec.training.dataset.testFiles[0]: " + dir +
                      "/test.csv:2: column 'y': expected a class index in [0, 2), got \"2\"");
  WriteFile(dir + "/test.csv", "1.5,0\n2.5,1\n");
  v = Validate(file);
  EXPECT_EQ(v.code, 0) << v.err;
}

TEST(ValidateTest, EpochsWithoutTheDatasetNameTheFile) {
  std::string dir = NewTestDir("validate");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string file = dir + "/job.yaml";
  WriteFile(file, Job(dir + "/absent", "epochs: 1"));
  // Even without the data check, epochs need the training set's size.
  Validated v = Validate(file, "", /*check_data=*/false);
  EXPECT_EQ(v.code, 2);
  EXPECT_CONTAINS(v.err, "error: " + file + ": ");
  EXPECT_CONTAINS(v.err, "train-labels-idx1-ubyte.gz");
}

TEST(ValidateTest, ASpecErrorNamesTheFieldOnce) {
  std::string dir = NewTestDir("validate");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string file = dir + "/job.yaml";
  WriteFile(file, Job(dir, "steps: -1"));
  Validated v = Validate(file);
  EXPECT_EQ(v.code, 2);
  EXPECT_CONTAINS(v.err, "spec.training.steps");
  EXPECT_EQ(v.out, "");
}

TEST(ValidateTest, AModelThatCannotFitIsRefusedNamingTheLimit) {
  std::string dir = NewTestDir("validate");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string file = dir + "/job.yaml";
  std::string yaml = Job(dir, "steps: 7");
  yaml.replace(yaml.find("model: {type: softmax}"), 22,
               "model: {type: mlp, hiddenUnits: [65536, 65536]}");
  WriteFile(file, yaml);
  // ~16 GiB of parameters: refused against a stated limit, and against this
  // machine's memory unless it has well over 48 GiB.
  Validated v = Validate(file, "8Gi");
  EXPECT_EQ(v.code, 2);
  EXPECT_CONTAINS(v.err,
                  "error: " + file + ": spec.training.model: needs at least 48.6 GiB on ps:0");
  EXPECT_CONTAINS(v.err, "more than the 8.0 GiB of --memory-limit 8Gi");
  v = Validate(file, "1Ti", /*check_data=*/false);
  EXPECT_EQ(v.code, 0) << v.err;
  v = Validate(file, "lots");
  EXPECT_EQ(v.code, 2);
  EXPECT_CONTAINS(v.err, "--memory-limit: \"lots\" is not a memory size");
}

}  // namespace
}  // namespace kubetrain
