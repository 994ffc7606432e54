#include "core/model.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

// gtest only (no gmock dependency in BUILD).
::testing::AssertionResult Contains(const std::string& text, const std::string& phrase) {
  if (text.find(phrase) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not contain \"" << phrase << "\"";
}

Model MustCreate(const ModelSpec& spec) {
  absl::StatusOr<Model> model = Model::Create(spec);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

ModelSpec Mlp(int input_dim, std::vector<int> hidden, int num_classes) {
  ModelSpec spec;
  spec.type = "mlp";
  spec.input_dim = input_dim;
  spec.hidden_units = std::move(hidden);
  spec.num_classes = num_classes;
  return spec;
}

ModelSpec Softmax(int input_dim, int num_classes) {
  ModelSpec spec;
  spec.type = "softmax";
  spec.input_dim = input_dim;
  spec.num_classes = num_classes;
  return spec;
}

Params RandomParams(const Model& model, std::mt19937_64* rng) {
  std::uniform_real_distribution<float> dist(-0.8f, 0.8f);
  Params params;
  for (const VariableSpec& v : model.variables()) {
    std::vector<float> value(v.num_elements());
    for (float& f : value) f = dist(*rng);
    params.push_back(std::move(value));
  }
  return params;
}

TEST(ModelCreateTest, SoftmaxLayout) {
  Model model = MustCreate(ModelSpec());
  ASSERT_EQ(model.variables().size(), 2u);
  EXPECT_EQ(model.variables()[0].name, "dense0/kernel");
  EXPECT_EQ(model.variables()[0].rows, 784);
  EXPECT_EQ(model.variables()[0].cols, 10);
  EXPECT_EQ(model.variables()[1].name, "dense0/bias");
  EXPECT_EQ(model.variables()[1].rows, 1);
  EXPECT_EQ(model.variables()[1].cols, 10);
  EXPECT_EQ(model.variables()[0].num_bytes(), 784 * 10 * 4);
}

TEST(ModelCreateTest, MlpLayout) {
  Model model = MustCreate(Mlp(784, {256, 128}, 10));
  const std::vector<VariableSpec>& vars = model.variables();
  ASSERT_EQ(vars.size(), 6u);
  const std::vector<std::string> names = {"dense0/kernel", "dense0/bias",   "dense1/kernel",
                                          "dense1/bias",   "dense2/kernel", "dense2/bias"};
  const std::vector<std::pair<int, int>> shapes = {{784, 256}, {1, 256},  {256, 128},
                                                   {1, 128},   {128, 10}, {1, 10}};
  for (size_t i = 0; i < vars.size(); ++i) {
    EXPECT_EQ(vars[i].name, names[i]);
    EXPECT_EQ(vars[i].rows, shapes[i].first) << names[i];
    EXPECT_EQ(vars[i].cols, shapes[i].second) << names[i];
  }
}

void ExpectInvalid(const ModelSpec& spec, const std::string& phrase) {
  absl::StatusOr<Model> model = Model::Create(spec);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(model.status().message()), phrase));
}

TEST(ModelCreateTest, RejectsBadSpecs) {
  ModelSpec unknown;
  unknown.type = "cnn";
  ExpectInvalid(unknown, "unknown model type \"cnn\"");

  ModelSpec softmax_hidden = Softmax(784, 10);
  softmax_hidden.hidden_units = {32};
  ExpectInvalid(softmax_hidden, "softmax\" takes no hidden_units");

  ExpectInvalid(Mlp(784, {}, 10), "needs at least one hidden_units");
  ExpectInvalid(Mlp(784, {64, 0}, 10), "hidden_units[1] is 0");
  ExpectInvalid(Mlp(784, {-3}, 10), "hidden_units[0] is -3");
  ExpectInvalid(Mlp(0, {8}, 10), "input_dim is 0");
  ExpectInvalid(Softmax(-1, 10), "input_dim is -1");
  ExpectInvalid(Softmax(784, 1), "num_classes is 1");
  ExpectInvalid(Mlp(784, {8}, 0), "num_classes is 0");
}

TEST(ModelInitTest, DeterministicPerSeed) {
  Model model = MustCreate(Mlp(784, {256, 128}, 10));
  Params a = model.InitialParams(42);
  Params b = model.InitialParams(42);
  Params c = model.InitialParams(43);
  ASSERT_EQ(a.size(), model.variables().size());
  EXPECT_EQ(a, b);
  for (size_t i = 0; i < a.size(); ++i) {
    const VariableSpec& v = model.variables()[i];
    ASSERT_EQ(static_cast<int64_t>(a[i].size()), v.num_elements()) << v.name;
    EXPECT_EQ(a[i], model.InitialValue(static_cast<int>(i), 42)) << v.name;
    if (i % 2 == 0) {
      EXPECT_NE(a[i], c[i]) << v.name;
      const float limit = std::sqrt(6.0f / (v.rows + v.cols));
      double sum = 0, sum_sq = 0;
      for (float f : a[i]) {
        ASSERT_LE(std::fabs(f), limit) << v.name;
        sum += f;
        sum_sq += f * f;
      }
      // Uniform(-limit, limit): mean ~0, variance limit^2/3.
      const double n = a[i].size();
      EXPECT_NEAR(sum / n, 0.0, limit * 0.1) << v.name;
      EXPECT_NEAR(sum_sq / n, limit * limit / 3, limit * limit * 0.1) << v.name;
    } else {
      EXPECT_EQ(a[i], std::vector<float>(v.num_elements(), 0.0f)) << v.name;
    }
  }
  EXPECT_TRUE(model.InitialValue(-1, 42).empty());
  EXPECT_TRUE(model.InitialValue(6, 42).empty());
}

TEST(ModelInitTest, SoftmaxStartsAtZero) {
  Model model = MustCreate(ModelSpec());
  for (const std::vector<float>& value : model.InitialParams(7)) {
    for (float f : value) ASSERT_EQ(f, 0.0f);
  }
}

TEST(ModelLossTest, ZeroParamsGiveUniformPrediction) {
  Model model = MustCreate(Softmax(5, 4));
  Params params = model.InitialParams(1);
  std::vector<float> x = {1, 2, 3, 4, 5, -1, -2, -3, -4, -5};
  std::vector<int32_t> y = {0, 3};
  Params grads;
  const float loss = model.LossAndGradients(params, x.data(), y.data(), 2, &grads);
  EXPECT_NEAR(loss, std::log(4.0f), 1e-6);
  ASSERT_EQ(grads.size(), 2u);
  // d/d bias = mean(softmax - onehot) = 1/4 - (fraction of label c).
  EXPECT_NEAR(grads[1][0], 0.25f - 0.5f, 1e-6);
  EXPECT_NEAR(grads[1][1], 0.25f, 1e-6);
  EXPECT_NEAR(grads[1][3], 0.25f - 0.5f, 1e-6);
}

TEST(ModelLossTest, HugeLogitsStayFinite) {
  Model model = MustCreate(Softmax(2, 3));
  Params params = {{1e4f, -1e4f, 0, 0, 0, 1e4f}, {0, 0, 0}};
  std::vector<float> x = {1, 0};
  Params grads;
  std::vector<int32_t> right = {0};
  std::vector<int32_t> wrong = {1};
  EXPECT_NEAR(model.LossAndGradients(params, x.data(), right.data(), 1, &grads), 0.0f, 1e-6);
  const float loss = model.LossAndGradients(params, x.data(), wrong.data(), 1, &grads);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 2e4f, 1.0f);
  for (const auto& g : grads) {
    for (float f : g) EXPECT_TRUE(std::isfinite(f));
  }
}

// Checks every analytic gradient entry against central finite differences.
// Float-only API, so eps is moderate and the tolerance mixes abs and rel.
void CheckGradients(const Model& model, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Params params = RandomParams(model, &rng);
  const int batch = 4;
  const int dim = model.spec().input_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(batch * dim);
  for (float& f : x) f = normal(rng);
  std::vector<int32_t> y(batch);
  for (int i = 0; i < batch; ++i) y[i] = i % model.spec().num_classes;

  Params grads;
  model.LossAndGradients(params, x.data(), y.data(), batch, &grads);
  ASSERT_EQ(grads.size(), params.size());
  Params scratch;
  const float eps = 5e-3f;
  int checked = 0;
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(grads[v].size(), params[v].size());
    for (size_t k = 0; k < params[v].size(); ++k) {
      const float saved = params[v][k];
      params[v][k] = saved + eps;
      const float plus = model.LossAndGradients(params, x.data(), y.data(), batch, &scratch);
      params[v][k] = saved - eps;
      const float minus = model.LossAndGradients(params, x.data(), y.data(), batch, &scratch);
      params[v][k] = saved;
      const float numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(grads[v][k], numeric, 2e-3f + 2e-2f * std::fabs(numeric))
          << model.variables()[v].name << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(ModelGradientTest, SoftmaxMatchesFiniteDifferences) {
  CheckGradients(MustCreate(Softmax(6, 3)), 11);
}

TEST(ModelGradientTest, MlpMatchesFiniteDifferences) {
  CheckGradients(MustCreate(Mlp(6, {5, 4}, 3)), 12);
  CheckGradients(MustCreate(Mlp(7, {6}, 4)), 13);
}

TEST(ModelAccuracyTest, CountsArgmaxAcrossBlocks) {
  // Identity kernel: prediction = argmax(x). 2500 rows span several blocks.
  Model model = MustCreate(Softmax(3, 3));
  Params params = {{1, 0, 0, 0, 1, 0, 0, 0, 1}, {0, 0, 0}};
  const int n = 2500;
  std::vector<float> x(n * 3, 0.0f);
  std::vector<int32_t> y(n);
  int expected_correct = 0;
  for (int i = 0; i < n; ++i) {
    x[i * 3 + i % 3] = 1.0f;
    y[i] = (i % 7 == 0) ? (i + 1) % 3 : i % 3;
    if (y[i] == i % 3) ++expected_correct;
  }
  EXPECT_DOUBLE_EQ(model.Accuracy(params, x.data(), y.data(), n),
                   static_cast<double>(expected_correct) / n);
  EXPECT_EQ(model.Accuracy(params, x.data(), y.data(), 0), 0.0);
}

// Plain SGD on a linearly separable synthetic problem.
void TrainAndCheck(const Model& model) {
  const int dim = model.spec().input_dim;
  const int classes = model.spec().num_classes;
  const int n = 512;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> teacher(dim * classes);
  for (float& f : teacher) f = normal(rng);
  std::vector<float> x(n * dim);
  for (float& f : x) f = normal(rng);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) {
    int best = 0;
    float best_score = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float score = 0;
      for (int d = 0; d < dim; ++d) {
        score += x[i * dim + d] * teacher[d * classes + c];
      }
      if (score > best_score) {
        best_score = score;
        best = c;
      }
    }
    y[i] = best;
  }

  Params params = model.InitialParams(3);
  Params grads;
  const int batch = 64;
  const float lr = 0.5f;
  const float initial_loss = model.LossAndGradients(params, x.data(), y.data(), n, &grads);
  for (int step = 0; step < 400; ++step) {
    const int start = (step * batch) % n;
    model.LossAndGradients(params, x.data() + start * dim, y.data() + start, batch, &grads);
    for (size_t v = 0; v < params.size(); ++v) {
      for (size_t k = 0; k < params[v].size(); ++k) {
        params[v][k] -= lr * grads[v][k];
      }
    }
  }
  const float final_loss = model.LossAndGradients(params, x.data(), y.data(), n, &grads);
  EXPECT_LT(final_loss, 0.5f * initial_loss);
  EXPECT_GT(model.Accuracy(params, x.data(), y.data(), n), 0.9);
}

TEST(ModelTrainingTest, SoftmaxLearnsSeparableProblem) { TrainAndCheck(MustCreate(Softmax(8, 3))); }

TEST(ModelTrainingTest, MlpLearnsSeparableProblem) {
  TrainAndCheck(MustCreate(Mlp(8, {16, 8}, 3)));
}

}  // namespace
}  // namespace kubetrain
