#include "cli/eval.h"

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/model.h"
#include "core/model_file.h"
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
