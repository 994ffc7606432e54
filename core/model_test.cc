#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/hash.h"
#include "core/layers.h"
#include "core/thread_pool.h"
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

// ---- The layer list ----

LayerSpec Dense(int units, Activation a = Activation::kLinear) {
  LayerSpec l;
  l.type = LayerType::kDense;
  l.units = units;
  l.activation = a;
  return l;
}

LayerSpec Conv(int filters, int kernel, int stride, bool same, Activation a) {
  LayerSpec l;
  l.type = LayerType::kConv2D;
  l.filters = filters;
  l.kernel = kernel;
  l.stride = stride;
  l.same_padding = same;
  l.activation = a;
  return l;
}

LayerSpec Pool(LayerType type, int kernel, int stride) {
  LayerSpec l;
  l.type = type;
  l.kernel = kernel;
  l.stride = stride;
  return l;
}

LayerSpec Simple(LayerType type, double rate = 0) {
  LayerSpec l;
  l.type = type;
  l.rate = rate;
  return l;
}

ModelSpec Layers(Shape input, std::vector<LayerSpec> layers, HeadType head = HeadType::kSoftmax,
                 int num_classes = 3) {
  ModelSpec spec;
  spec.type = "layers";
  spec.input_shape = std::move(input);
  spec.layers = std::move(layers);
  spec.head = head;
  spec.num_classes = num_classes;
  return spec;
}

// The seed's dense/ReLU/softmax code, verbatim but for the bias gradients'
// summation order, as the reference the shorthands must match bit for bit.
float LegacyLossAndGradients(const ModelSpec& spec, const Params& params, const float* x,
                             const int32_t* y, int batch, Params* grads) {
  using ConstMatrixMap = Eigen::Map<const RowMatrix>;
  using MatrixMap = Eigen::Map<RowMatrix>;
  std::vector<int> dims = {spec.input_dim};
  dims.insert(dims.end(), spec.hidden_units.begin(), spec.hidden_units.end());
  dims.push_back(spec.num_classes);
  const int num_layers = static_cast<int>(dims.size()) - 1;
  grads->resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) (*grads)[i].resize(params[i].size());
  ConstMatrixMap input(x, batch, spec.input_dim);
  std::vector<RowMatrix> acts(num_layers);
  RowMatrix logits;
  for (int l = 0; l < num_layers; ++l) {
    ConstMatrixMap kernel(params[2 * l].data(), dims[l], dims[l + 1]);
    RowMatrix z(batch, dims[l + 1]);
    if (l == 0) {
      z.noalias() = input * kernel;
    } else {
      z.noalias() = acts[l] * kernel;
    }
    z.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(params[2 * l + 1].data(), z.cols());
    if (l + 1 < num_layers) {
      acts[l + 1] = (z.array() > 0.0f).select(z.array(), 0.0f);
    } else {
      logits = std::move(z);
    }
  }
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double loss = 0.0;
  for (int r = 0; r < batch; ++r) {
    auto row = logits.row(r);
    const int label = y[r];
    const float max = row.maxCoeff();
    const float shifted_label_logit = row(label) - max;
    row.array() = (row.array() - max).exp();
    const float sum = row.sum();
    loss += std::log(sum) - shifted_label_logit;
    row *= inv_batch / sum;
    row(label) -= inv_batch;
  }
  RowMatrix dz = std::move(logits);
  for (int l = num_layers - 1; l >= 0; --l) {
    MatrixMap dkernel((*grads)[2 * l].data(), dims[l], dims[l + 1]);
    if (l == 0) {
      dkernel.noalias() = input.transpose() * dz;
    } else {
      dkernel.noalias() = acts[l].transpose() * dz;
    }
    // Bias gradients: column sums added row by row in order (as ColumnSums
    // does; the seed's colwise().sum() gave alignment-dependent bits).
    for (int j = 0; j < dims[l + 1]; ++j) {
      float sum = 0.0f;
      for (int r = 0; r < batch; ++r) sum += dz(r, j);
      (*grads)[2 * l + 1][j] = sum;
    }
    if (l > 0) {
      ConstMatrixMap kernel(params[2 * l].data(), dims[l], dims[l + 1]);
      RowMatrix da(batch, dims[l]);
      da.noalias() = dz * kernel.transpose();
      dz = (acts[l].array() > 0.0f).select(da.array(), 0.0f);
    }
  }
  return static_cast<float>(loss / batch);
}

TEST(ModelShorthandTest, MatchesTheSeedCodeBitForBit) {
  for (const ModelSpec& spec : {Mlp(784, {64, 32}, 10), Mlp(13, {7}, 4), Softmax(784, 10)}) {
    Model model = MustCreate(spec);
    std::mt19937_64 rng(21);
    Params params = RandomParams(model, &rng);
    const int batch = 37;
    std::vector<float> x(batch * spec.input_dim);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (float& f : x) f = pixel(rng);
    std::vector<int32_t> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = (i * 7) % spec.num_classes;
    Params grads;
    const float legacy = LegacyLossAndGradients(spec, params, x.data(), y.data(), batch, &grads);
    const Params want = grads;
    const float loss = model.LossAndGradients(params, x.data(), y.data(), batch, &grads);
    const Params& got = grads;
    EXPECT_EQ(loss, legacy) << model.Summary();
    ASSERT_EQ(got.size(), want.size());
    for (size_t v = 0; v < got.size(); ++v) {
      for (size_t k = 0; k < got[v].size(); ++k) {
        if (got[v][k] != want[v][k]) {
          ADD_FAILURE() << model.variables()[v].name << "[" << k << "] " << got[v][k] - want[v][k];
          break;
        }
      }
    }
  }
}

// A rerun must give the same bits wherever the allocator puts the buffers
// (it differs from process to process): the same gradients for inputs and
// outputs at every alignment.
TEST(ModelDeterminismTest, GradientsDoNotDependOnBufferAddresses) {
  for (const ModelSpec& spec :
       {Mlp(784, {256, 128}, 10),
        Layers({7, 6, 2},
               {Conv(4, 3, 1, true, Activation::kRelu), Pool(LayerType::kMaxPool2D, 2, 2),
                Simple(LayerType::kFlatten), Simple(LayerType::kDropout, 0.3),
                Dense(19, Activation::kTanh), Dense(3)})}) {
    for (int threads : {1, 2}) {
      Model model = MustCreate(spec);
      model.SetThreads(threads);
      std::mt19937_64 rng(5);
      Params params = RandomParams(model, &rng);
      const int batch = 64;
      const int64_t dim = model.input_dim();
      std::vector<float> x(batch * dim);
      std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
      for (float& f : x) f = pixel(rng);
      std::vector<int32_t> y(batch);
      for (int i = 0; i < batch; ++i) y[i] = (i * 7) % 3;
      Params want;
      const float want_loss = model.LossAndGradients(params, x.data(), y.data(), batch, &want);
      for (int shift = 1; shift < 16; ++shift) {
        // The input at another offset, and fresh gradient buffers allocated
        // after `pad`, so they start at other addresses too.
        std::vector<float> shifted(x.size() + shift);
        std::copy(x.begin(), x.end(), shifted.begin() + shift);
        std::vector<char> pad(16 * shift + 8);
        Params params_copy = params;
        Params got;
        Batch b;
        b.x = shifted.data() + shift;
        b.labels = y.data();
        b.size = batch;
        const float loss = model.LossAndGradients(params_copy, b, 0, &got);
        EXPECT_EQ(loss, want_loss) << model.Summary() << " shift " << shift;
        ASSERT_EQ(got.size(), want.size());
        for (size_t v = 0; v < got.size(); ++v) {
          EXPECT_EQ(0, std::memcmp(got[v].data(), want[v].data(), 4 * want[v].size()))
              << model.Summary() << " " << model.variables()[v].name << " shift " << shift
              << " threads " << threads;
        }
      }
    }
  }
}

// The fashion-mnist-cnn example's layer list (examples/fashion-mnist-cnn.yaml).
ModelSpec FashionCnn() {
  LayerSpec pool = Pool(LayerType::kMaxPool2D, 2, 2);
  return Layers({28, 28, 1},
                {Conv(32, 3, 1, true, Activation::kRelu), pool,
                 Conv(64, 3, 1, true, Activation::kRelu), pool, Simple(LayerType::kFlatten),
                 Dense(128, Activation::kRelu), Simple(LayerType::kDropout, 0.5), Dense(10)},
                HeadType::kSoftmax, 10);
}

struct StepResult {
  float loss = 0;
  Params grads;
  RowMatrix logits;
};

StepResult Step(const Model& model, const Params& params, const std::vector<float>& x,
                const std::vector<int32_t>& y) {
  StepResult r;
  Batch b;
  b.x = x.data();
  b.labels = y.data();
  b.size = static_cast<int64_t>(y.size());
  r.loss = model.LossAndGradients(params, b, 11, &r.grads);
  r.logits = model.Logits(params, b);
  return r;
}

::testing::AssertionResult SameBits(const StepResult& a, const StepResult& b) {
  if (std::memcmp(&a.loss, &b.loss, 4) != 0) {
    return ::testing::AssertionFailure() << "loss " << a.loss << " vs " << b.loss;
  }
  if (a.grads.size() != b.grads.size()) return ::testing::AssertionFailure() << "grads size";
  for (size_t v = 0; v < a.grads.size(); ++v) {
    if (a.grads[v].size() != b.grads[v].size() ||
        std::memcmp(a.grads[v].data(), b.grads[v].data(), 4 * a.grads[v].size()) != 0) {
      return ::testing::AssertionFailure() << "gradient " << v << " differs";
    }
  }
  if (a.logits.size() != b.logits.size() ||
      std::memcmp(a.logits.data(), b.logits.data(), 4 * a.logits.size()) != 0) {
    return ::testing::AssertionFailure() << "logits differ";
  }
  return ::testing::AssertionSuccess();
}

// Within float rounding, norm-wise: every |a - b| <= 1e-5 of the largest
// |b| of the variable. (Entries that are sums cancelling to near zero differ
// by more than 1e-5 of themselves; measured here: < 1e-6 norm-wise.)
::testing::AssertionResult Close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  float scale = 0;
  for (float f : b) scale = std::max(scale, std::fabs(f));
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-5f * scale)) {
      return ::testing::AssertionFailure()
             << "[" << i << "] " << a[i] << " vs " << b[i] << " (largest " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// A worker with N threads: the same bits on every run with N (whichever
// thread runs which chunk), within float rounding of one thread; one thread
// is the single-threaded code (a model never given a thread count).
TEST(ModelThreadsTest, FixedThreadCountGivesFixedBitsCloseToOneThread) {
  for (const ModelSpec& spec :
       {FashionCnn(),
        Layers({7, 6, 2},
               {Conv(4, 3, 1, true, Activation::kRelu), Pool(LayerType::kAvgPool2D, 2, 2),
                Conv(5, 2, 2, false, Activation::kTanh), Simple(LayerType::kFlatten),
                Dense(19, Activation::kRelu), Dense(3)})}) {
    const Model base = MustCreate(spec);
    EXPECT_EQ(base.threads(), 1);
    // Trained-like magnitudes (He/Glorot), not RandomParams' +-0.8: on a
    // 3136-input layer those saturate the softmax and amplify rounding.
    std::mt19937_64 rng(3);
    const Params params = base.InitialParams(9);
    for (int batch : {64, 37, 2}) {
      std::vector<float> x(batch * base.input_dim());
      std::normal_distribution<float> pixel(0.0f, 1.0f);
      for (float& f : x) f = pixel(rng);
      std::vector<int32_t> y(batch);
      const int classes = static_cast<int>(base.variables().back().cols);
      for (int i = 0; i < batch; ++i) y[i] = (i * 7) % classes;
      const StepResult want = Step(base, params, x, y);
      Model one = base;
      one.SetThreads(4);
      one.SetThreads(1);
      EXPECT_EQ(one.threads(), 1);
      EXPECT_TRUE(SameBits(Step(one, params, x, y), want)) << base.Summary() << " batch " << batch;
      for (int threads : {2, 3}) {
        Model model = base;
        model.SetThreads(threads);
        EXPECT_EQ(model.threads(), threads);
        const StepResult first = Step(model, params, x, y);
        for (int rep = 0; rep < 3; ++rep) {
          EXPECT_TRUE(SameBits(Step(model, params, x, y), first))
              << base.Summary() << " batch " << batch << " threads " << threads;
        }
        // A new pool of the same size: the same bits too.
        Model again = base;
        again.SetThreads(threads);
        EXPECT_TRUE(SameBits(Step(again, params, x, y), first)) << threads;
        EXPECT_NEAR(first.loss, want.loss, 1e-5 * std::fabs(want.loss));
        for (size_t v = 0; v < want.grads.size(); ++v) {
          EXPECT_TRUE(Close(first.grads[v], want.grads[v]))
              << base.Summary() << " batch " << batch << " threads " << threads << " "
              << base.variables()[v].name;
        }
        EXPECT_TRUE(Close(
            std::vector<float>(first.logits.data(), first.logits.data() + first.logits.size()),
            std::vector<float>(want.logits.data(), want.logits.data() + want.logits.size())));
      }
    }
  }
}

// On N threads a run of conv2d/pool layers goes forward and backward as one
// job per chunk of images (core/model_images.cc). Its results are those of
// the layer kernels called one by one on a pool of N (ReLU: the activation
// and its gradient are exact at any split), bit for bit: the run changes
// how the work is handed out, not what is computed.
TEST(ModelThreadsTest, ImageRunIsTheKernelsOneByOne) {
  const ModelSpec spec = Layers(
      {8, 8, 3}, {Conv(4, 3, 1, true, Activation::kRelu), Pool(LayerType::kMaxPool2D, 2, 2),
                  Conv(5, 3, 1, false, Activation::kRelu), Simple(LayerType::kFlatten), Dense(3)});
  std::mt19937_64 rng(12);
  const Model base = MustCreate(spec);
  const Params params = base.InitialParams(4);
  for (int batch : {9, 2}) {
    std::vector<float> x(batch * base.input_dim());
    std::normal_distribution<float> pixel(0.0f, 1.0f);
    for (float& f : x) f = pixel(rng);
    std::vector<int32_t> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = i % 3;
    for (int threads : {2, 3}) {
      Model model = base;
      model.SetThreads(threads);
      Params got;
      const float loss = model.LossAndGradients(params, x.data(), y.data(), batch, &got);

      ThreadPool pool(threads);
      const WindowGeometry g0 = MakeWindowGeometry(spec.layers[0], {8, 8, 3});
      const WindowGeometry g1 = MakeWindowGeometry(spec.layers[1], {8, 8, 4});
      const WindowGeometry g2 = MakeWindowGeometry(spec.layers[2], {4, 4, 4});
      RowMatrix col0, out0, pooled, col2, out2;
      std::vector<int32_t> argmax;
      ConvForward(g0, x.data(), batch, params[0].data(), params[1].data(), 4, &col0, &out0, &pool);
      ApplyActivation(Activation::kRelu, &out0, &pool);
      MaxPoolForward(g1, out0.data(), batch, &pooled, &argmax, &pool);
      ConvForward(g2, pooled.data(), batch, params[2].data(), params[3].data(), 5, &col2, &out2,
                  &pool);
      ApplyActivation(Activation::kRelu, &out2, &pool);
      // The dense head and the softmax loss as model.cc computes them (a
      // product this small stays on one thread).
      const Eigen::Map<const RowMatrix> w(params[4].data(), 20, 3);
      RowMatrix logits = out2 * w;
      logits.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(params[5].data(), 3);
      const float inv_batch = 1.0f / static_cast<float>(batch);
      double want_loss = 0;
      for (int r = 0; r < batch; ++r) {
        auto row = logits.row(r);
        const float max = row.maxCoeff();
        const float shifted = row(y[r]) - max;
        row.array() = (row.array() - max).exp();
        const float sum = row.sum();
        want_loss += std::log(sum) - shifted;
        row *= inv_batch / sum;
        row(y[r]) -= inv_batch;
      }
      EXPECT_EQ(loss, static_cast<float>(want_loss / batch));
      Params want = params;
      Eigen::Map<RowMatrix>(want[4].data(), 20, 3).noalias() =
          Eigen::Map<const RowMatrix>(out2.data(), batch, 20).transpose() * logits;
      ColumnSums(logits.data(), batch, 3, want[5].data());
      RowMatrix d = logits * w.transpose(), d_pooled, unused;
      ActivationGradient(Activation::kRelu, out2, &d, &pool);
      ConvBackward(g2, col2, d, params[2].data(), 5, batch, want[2].data(), want[3].data(),
                   &d_pooled, &pool);
      RowMatrix d_out0;
      MaxPoolBackward(g1, d_pooled, argmax, &d_out0, &pool);
      ActivationGradient(Activation::kRelu, out0, &d_out0, &pool);
      ConvBackward(g0, col0, d_out0, params[0].data(), 4, batch, want[0].data(), want[1].data(),
                   nullptr, &pool);
      ASSERT_EQ(got.size(), want.size());
      for (size_t v = 0; v < want.size(); ++v) {
        EXPECT_EQ(got[v], want[v])
            << base.variables()[v].name << " batch " << batch << " threads " << threads;
      }
    }
  }
}

TEST(ModelShorthandTest, SummaryAndLegacyInitialisation) {
  Model mlp = MustCreate(Mlp(784, {256, 128}, 10));
  EXPECT_EQ(mlp.Summary(), "mlp 784-256-128-10");
  // The seed's Glorot-uniform draw for dense0/kernel at seed 42 (first values
  // pinned so checkpoints of old jobs keep meaning the same thing).
  const std::vector<float> k = mlp.InitialValue(0, 42);
  const float limit = std::sqrt(6.0f / (784 + 256));
  for (float f : k) ASSERT_LE(std::fabs(f), limit);
  EXPECT_EQ(MustCreate(Softmax(784, 10)).Summary(), "softmax 784-10");
}

TEST(ModelLayersTest, NamesShapesAndSummary) {
  Model m =
      MustCreate(Layers({28, 28, 1},
                        {Conv(8, 3, 1, true, Activation::kRelu), Pool(LayerType::kMaxPool2D, 2, 2),
                         Conv(16, 3, 2, false, Activation::kRelu), Simple(LayerType::kFlatten),
                         Dense(32, Activation::kRelu), Simple(LayerType::kDropout, 0.5), Dense(10)},
                        HeadType::kSoftmax, 10));
  const auto& v = m.variables();
  ASSERT_EQ(v.size(), 8u);
  EXPECT_EQ(v[0].name, "layers.0.kernel");
  EXPECT_EQ(v[0].rows, 9);
  EXPECT_EQ(v[0].cols, 8);
  EXPECT_EQ(v[1].name, "layers.0.bias");
  EXPECT_EQ(v[2].name, "layers.2.kernel");
  EXPECT_EQ(v[2].rows, 3 * 3 * 8);
  // 28 same -> 28, pool 2 -> 14, 3x3 stride 2 valid -> 6: 6*6*16 = 576.
  EXPECT_EQ(v[4].name, "layers.4.kernel");
  EXPECT_EQ(v[4].rows, 576);
  EXPECT_EQ(v[6].name, "layers.6.kernel");
  EXPECT_EQ(v[7].name, "layers.6.bias");
  EXPECT_TRUE(m.has_dropout());
  EXPECT_EQ(m.Summary(),
            "layers [28, 28, 1] conv2d(8,3x3,relu) maxpool2d(2) conv2d(16,3x3/2,relu) flatten "
            "dense(32,relu) dropout(0.5) dense(10) softmax");
}

TEST(ModelLayersTest, ShapeErrorsNameTheLayer) {
  ExpectInvalid(Layers({128}, {Dense(8, Activation::kRelu), Conv(4, 3, 1, true, Activation::kRelu),
                               Dense(3)}),
                "layers[1]: conv2d needs a 3-D input, got [8]");
  ExpectInvalid(Layers({4, 4, 2}, {Dense(3)}),
                "layers[0]: dense needs a 1-D input, got [4, 4, 2] (add a flatten layer");
  ExpectInvalid(
      Layers({4, 4, 1}, {Pool(LayerType::kMaxPool2D, 5, 5), Simple(LayerType::kFlatten), Dense(3)}),
      "layers[0]: maxpool2d window 5x5 is larger than its input [4, 4, 1]");
  ExpectInvalid(Layers({6}, {Dense(4)}), "layers[0]: dense has 4 units, the softmax head needs 3");
  ExpectInvalid(Layers({6}, {Dense(4, Activation::kRelu)}),
                "layers[0]: the last layer must be a dense layer with activation linear");
  ExpectInvalid(Layers({6}, {Dense(2)}, HeadType::kSigmoid, 2),
                "layers[0]: dense has 2 units, the sigmoid head needs 1");
  ExpectInvalid(Layers({6}, {Dense(1)}, HeadType::kSigmoid, 3), "needs binary labels");
  ExpectInvalid(Layers({6}, {Simple(LayerType::kDropout, 1.0), Dense(3)}),
                "layers[0]: dropout needs rate in [0, 1), got 1");
  ExpectInvalid(Layers({6}, {}), "needs at least one layer");
  ExpectInvalid(Layers({6, 6}, {Dense(3)}), "the input shape must be [d] or [h, w, c]");
}

TEST(ModelLayersTest, HeInitForReluGlorotOtherwise) {
  Model m = MustCreate(
      Layers({40}, {Dense(30, Activation::kRelu), Dense(20, Activation::kTanh), Dense(3)}));
  const double he = std::sqrt(6.0 / 40), glorot = std::sqrt(6.0 / (30 + 20));
  float max0 = 0, max1 = 0;
  for (float f : m.InitialValue(0, 5)) max0 = std::max(max0, std::fabs(f));
  for (float f : m.InitialValue(2, 5)) max1 = std::max(max1, std::fabs(f));
  EXPECT_LE(max0, he);
  EXPECT_GT(max0, 0.9 * he);  // 1200 draws reach close to the limit
  EXPECT_LE(max1, glorot);
  EXPECT_GT(max1, 0.9 * glorot);
  for (float f : m.InitialValue(1, 5)) EXPECT_EQ(f, 0.0f);
}

// Central finite differences on every parameter, in double-checked float.
void CheckLayerGradients(const Model& model, int batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  Params params;
  for (const VariableSpec& v : model.variables()) {
    std::vector<float> value(v.num_elements());
    for (float& f : value) f = dist(rng);
    params.push_back(std::move(value));
  }
  const int64_t dim = model.input_dim();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(batch * dim), targets(batch);
  for (float& f : x) f = normal(rng);
  for (float& f : targets) f = normal(rng);
  std::vector<int32_t> y(batch);
  const int classes = model.head() == HeadType::kSoftmax ? model.spec().num_classes : 2;
  for (int i = 0; i < batch; ++i) y[i] = i % classes;
  Batch b;
  b.x = x.data();
  b.labels = y.data();
  b.targets = targets.data();
  b.size = batch;
  const uint64_t dropout_seed = 99;
  Params grads, scratch;
  model.LossAndGradients(params, b, dropout_seed, &grads);
  const float eps = 3e-3f;
  int checked = 0;
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(grads[v].size(), params[v].size());
    for (size_t k = 0; k < params[v].size(); ++k) {
      const float saved = params[v][k];
      params[v][k] = saved + eps;
      const float plus = model.LossAndGradients(params, b, dropout_seed, &scratch);
      params[v][k] = saved - eps;
      const float minus = model.LossAndGradients(params, b, dropout_seed, &scratch);
      params[v][k] = saved;
      const float numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(grads[v][k], numeric, 2e-3f + 2e-2f * std::fabs(numeric))
          << model.Summary() << " " << model.variables()[v].name << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(ModelGradientTest, DenseActivationsAndHeads) {
  CheckLayerGradients(
      MustCreate(Layers({5}, {Dense(4, Activation::kTanh), Dense(6, Activation::kSigmoid),
                              Dense(4, Activation::kRelu), Dense(3)})),
      5, 1);
  CheckLayerGradients(
      MustCreate(Layers({5}, {Dense(4, Activation::kTanh), Dense(1)}, HeadType::kSigmoid, 2)), 6,
      2);
  CheckLayerGradients(MustCreate(Layers({5}, {Dense(4, Activation::kSigmoid), Dense(1)},
                                        HeadType::kMeanSquaredError, 0)),
                      6, 3);
}

TEST(ModelGradientTest, ConvSamePaddingStrideOneOddShape) {
  CheckLayerGradients(MustCreate(Layers({5, 7, 2}, {Conv(3, 3, 1, true, Activation::kTanh),
                                                    Conv(2, 2, 1, true, Activation::kLinear),
                                                    Simple(LayerType::kFlatten), Dense(3)})),
                      2, 4);
}

TEST(ModelGradientTest, ConvStrideTwoValidAndSame) {
  CheckLayerGradients(MustCreate(Layers({7, 6, 1}, {Conv(2, 3, 2, false, Activation::kTanh),
                                                    Conv(3, 2, 2, true, Activation::kSigmoid),
                                                    Simple(LayerType::kFlatten), Dense(3)})),
                      3, 5);
}

TEST(ModelGradientTest, PoolsFlattenAndDropout) {
  CheckLayerGradients(
      MustCreate(Layers({7, 5, 2},
                        {Conv(3, 3, 1, true, Activation::kTanh), Pool(LayerType::kMaxPool2D, 2, 2),
                         Simple(LayerType::kFlatten), Simple(LayerType::kDropout, 0.4), Dense(3)})),
      3, 6);
  CheckLayerGradients(MustCreate(Layers({7, 5, 2}, {Conv(2, 2, 1, false, Activation::kTanh),
                                                    Pool(LayerType::kAvgPool2D, 3, 2),
                                                    Simple(LayerType::kFlatten), Dense(3)})),
                      3, 7);
}

TEST(ModelDropoutTest, SeededTrainingOnlyAndScaled) {
  Model m = MustCreate(Layers({200}, {Simple(LayerType::kDropout, 0.5), Dense(3)}));
  std::mt19937_64 rng(8);
  Params params = RandomParams(m, &rng);
  std::vector<float> x(200, 1.0f);
  std::vector<int32_t> y = {1};
  Batch b;
  b.x = x.data();
  b.labels = y.data();
  b.size = 1;
  Params g1, g2, g3;
  m.LossAndGradients(params, b, 5, &g1);
  m.LossAndGradients(params, b, 5, &g2);
  m.LossAndGradients(params, b, 6, &g3);
  EXPECT_EQ(g1, g2);  // same seed, same mask
  EXPECT_NE(g1, g3);
  // The kernel gradient row of an input is 0 where it was dropped and
  // 1/(1-rate) = 2 times the logits' gradient where kept.
  int zero_rows = 0;
  for (int r = 0; r < 200; ++r) {
    if (g1[0][r * 3] == 0 && g1[0][r * 3 + 1] == 0) ++zero_rows;
  }
  EXPECT_GT(zero_rows, 60);
  EXPECT_LT(zero_rows, 140);
  // Evaluation applies no dropout: identical to the same model without it.
  Model plain = MustCreate(Layers({200}, {Dense(3)}));
  Params plain_params = {params[0], params[1]};
  EXPECT_EQ(m.Evaluate(params, b).loss, plain.Evaluate(plain_params, b).loss);
}

// Dropout on threads: the mask is one serial stream from (seed, layer
// index), the same for every thread count (a fixed seed keeps giving the
// same model); only the multiply by it is split. Example b holds feature f
// only if f % batch == b, so the kernel gradient's row f has one term and
// is zero exactly where (b, f) was dropped.
TEST(ModelDropoutTest, TheMaskDoesNotDependOnTheThreadCount) {
  const int batch = 16, dim = 4099;  // 65584 elements: split across threads
  const ModelSpec spec = Layers({dim}, {Simple(LayerType::kDropout, 0.5), Dense(3)});
  const Model base = MustCreate(spec);
  const Params params = base.InitialParams(4);
  std::vector<float> x(batch * dim, 0.0f);
  for (int f = 0; f < dim; ++f) x[(f % batch) * dim + f] = 1.0f + 0.001f * f;
  std::vector<int32_t> y(batch);
  for (int b = 0; b < batch; ++b) y[b] = b % 3;
  // The mask as model.cc draws it (layer 0, seed 11 as in Step()).
  std::mt19937_64 rng(SplitMix64(11 ^ SplitMix64(1)));
  std::vector<bool> kept(batch * dim);
  for (int64_t k = 0; k < batch * dim; ++k) {
    kept[k] = !(static_cast<double>(rng() >> 11) * 0x1.0p-53 < 0.5);
  }
  const StepResult want = Step(base, params, x, y);
  for (int threads : {1, 2, 3}) {
    Model model = base;
    model.SetThreads(threads);
    const StepResult first = Step(model, params, x, y);
    if (threads == 1) {
      EXPECT_TRUE(SameBits(first, want));
    }
    EXPECT_TRUE(SameBits(Step(model, params, x, y), first)) << threads;
    EXPECT_TRUE(Close(first.grads[0], want.grads[0])) << threads;
    int dropped = 0;
    for (int f = 0; f < dim; ++f) {
      const bool k = kept[(f % batch) * dim + f];
      dropped += !k;
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(first.grads[0][f * 3 + c] == 0.0f, !k)
            << "feature " << f << " threads " << threads;
      }
    }
    EXPECT_GT(dropped, dim / 3);
    EXPECT_LT(dropped, 2 * dim / 3);
  }
}

TEST(ModelEvaluateTest, BinaryMetricsAndRmse) {
  // Sigmoid head on one feature, kernel 1: logit = x.
  Model m = MustCreate(Layers({1}, {Dense(1)}, HeadType::kSigmoid, 2));
  Params params = {{1.0f}, {0.0f}};
  std::vector<float> x = {-2, -1, 0.5, 1, 3, -0.5};
  std::vector<int32_t> y = {0, 0, 1, 1, 1, 1};
  Batch b;
  b.x = x.data();
  b.labels = y.data();
  b.size = 6;
  EvalMetrics e = m.Evaluate(params, b);
  ASSERT_TRUE(e.accuracy && e.auc && e.log_loss);
  EXPECT_DOUBLE_EQ(*e.accuracy, 5.0 / 6);
  // Positives' scores {0.5,1,3,-0.5} vs negatives {-2,-1}: every pair ordered.
  EXPECT_DOUBLE_EQ(*e.auc, 1.0);
  double ll = 0;
  for (int i = 0; i < 6; ++i) {
    const double p = 1 / (1 + std::exp(-x[i]));
    ll -= y[i] ? std::log(p) : std::log(1 - p);
  }
  EXPECT_NEAR(*e.log_loss, ll / 6, 1e-6);  // float logits
  EXPECT_FALSE(e.rmse.has_value());
  y = {1, 0, 1, 1, 1, 1};  // one inversion out of 5 pairs, and a tie-free AUC of 4/5
  EXPECT_NEAR(*m.Evaluate(params, b).auc, 0.8, 1e-12);

  Model reg = MustCreate(Layers({1}, {Dense(1)}, HeadType::kMeanSquaredError, 0));
  std::vector<float> t = {-2, -1, 0.5, 1, 3, 0.5};  // off by 1 on the last one only
  b.targets = t.data();
  EvalMetrics r = reg.Evaluate(params, b);
  ASSERT_TRUE(r.rmse.has_value());
  EXPECT_NEAR(*r.rmse, std::sqrt(1.0 / 6), 1e-7);
  EXPECT_FALSE(r.accuracy.has_value());
}

TEST(ModelTrainingTest, SmallCnnLearnsAPattern) {
  // Class = which half of a 6x6 image is bright.
  Model m =
      MustCreate(Layers({6, 6, 1},
                        {Conv(4, 3, 1, true, Activation::kRelu), Pool(LayerType::kMaxPool2D, 2, 2),
                         Simple(LayerType::kFlatten), Dense(2)},
                        HeadType::kSoftmax, 2));
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(0.0f, 0.3f);
  const int n = 256;
  std::vector<float> x(n * 36);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = i % 2;
    for (int p = 0; p < 36; ++p) x[i * 36 + p] = u(rng) + ((p % 6 < 3) == (y[i] == 0) ? 0.7f : 0);
  }
  Params params = m.InitialParams(1), grads;
  for (int step = 0; step < 200; ++step) {
    const int start = (step * 32) % n;
    m.LossAndGradients(params, x.data() + start * 36, y.data() + start, 32, &grads);
    for (size_t v = 0; v < params.size(); ++v) {
      for (size_t k = 0; k < params[v].size(); ++k) params[v][k] -= 0.1f * grads[v][k];
    }
  }
  EXPECT_GT(m.Accuracy(params, x.data(), y.data(), n), 0.95);
}

}  // namespace

// Sparse features: 3 dense features, and the lookup ids of a (vocab 5, two
// values per example) and b (vocab 4, one).
ModelSpec SparseSpec(Combiner combiner, HeadType head = HeadType::kWideAndDeep) {
  ModelSpec spec = Layers({3}, {Dense(4, Activation::kTanh), Dense(1)}, head, 2);
  spec.sparse_inputs = {{"a", 5, 2}, {"b", 4, 1}};
  spec.embeddings = {{"a", 3, combiner}, {"b", 2, Combiner::kSum}};
  if (head == HeadType::kWideAndDeep) {
    spec.wide.columns = {"b"};
    spec.wide.crossed = {{{"a", "b"}, 7}};
  }
  return spec;
}

// Rows of dense features and their lookup ids; a's ids include -1 (no
// value) and a repeated id, so combiners see 0, 1 and 2 ids (and one id
// twice).
struct SparseData {
  std::vector<float> x;
  std::vector<int64_t> ids;
  Batch batch(const std::vector<int32_t>& y) const {
    Batch b;
    b.x = x.data();
    b.lookup_ids = ids.data();
    b.labels = y.data();
    b.size = static_cast<int64_t>(y.size());
    return b;
  }
};
SparseData SparseRows(std::mt19937_64* rng, int batch) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t a_ids[][2] = {{0, 3}, {-1, 2}, {-1, -1}, {4, 4}, {1, -1}, {3, 0}};
  SparseData d;
  for (int r = 0; r < batch; ++r) {
    for (int k = 0; k < 3; ++k) d.x.push_back(normal(*rng));
    d.ids.push_back(a_ids[r % 6][0]);
    d.ids.push_back(a_ids[r % 6][1]);
    d.ids.push_back(r % 4);
  }
  return d;
}

// params with each table cut down to the rows of its `unique` ids, in
// order: what a worker pulls for a batch (CompactLookups).
Params CompactTables(const Model& model, const Params& params, const TableIds& unique) {
  Params compact = params;
  for (size_t t = 0; t < model.tables().size(); ++t) {
    const int v = model.tables()[t];
    const int64_t dim = model.variables()[v].cols;
    compact[v].clear();
    for (int64_t id : unique[t]) {
      compact[v].insert(compact[v].end(), params[v].begin() + id * dim,
                        params[v].begin() + (id + 1) * dim);
    }
  }
  return compact;
}

// Every gradient of `b`'s loss at `params` against central finite differences.
void CheckGradientsOfBatch(const Model& model, Params params, const Batch& b) {
  Params grads, scratch;
  model.LossAndGradients(params, b, 0, &grads);
  const float eps = 3e-3f;
  int checked = 0;
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(grads[v].size(), params[v].size()) << model.variables()[v].name;
    for (size_t k = 0; k < params[v].size(); ++k) {
      const float saved = params[v][k];
      params[v][k] = saved + eps;
      const float plus = model.LossAndGradients(params, b, 0, &scratch);
      params[v][k] = saved - eps;
      const float minus = model.LossAndGradients(params, b, 0, &scratch);
      params[v][k] = saved;
      const float numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(grads[v][k], numeric, 2e-3f + 2e-2f * std::fabs(numeric))
          << model.Summary() << " " << model.variables()[v].name << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

void CheckSparseGradients(const Model& model, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Params params = RandomParams(model, &rng);
  const int batch = 6;
  const SparseData data = SparseRows(&rng, batch);
  std::vector<int32_t> y = {0, 1, 1, 0, 1, 0};
  CheckGradientsOfBatch(model, std::move(params), data.batch(y));
}

TEST(ModelSparseTest, LayoutNamesAndTables) {
  Model model = MustCreate(SparseSpec(Combiner::kMean));
  EXPECT_EQ(model.input_dim(), 3);
  EXPECT_EQ(model.id_slots(), 3);
  std::vector<std::string> names;
  for (const auto& v : model.variables()) names.push_back(v.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.kernel", "layers.0.bias", "layers.1.kernel",
                                             "layers.1.bias", "embedding.a", "embedding.b",
                                             "wide.b", "wide.a_x_b", "wide.bias"}));
  EXPECT_EQ(model.variables()[0].rows, 3 + 3 + 2);  // dense features + embedding dims
  EXPECT_EQ(model.tables(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(model.variables()[7].wide);
  EXPECT_EQ(model.variables()[7].rows, 7);
  EXPECT_FALSE(model.variables()[8].table);
}

TEST(ModelSparseTest, EmbeddingCombinersCrossedAndWideMatchFiniteDifferences) {
  CheckSparseGradients(MustCreate(SparseSpec(Combiner::kSum)), 21);
  CheckSparseGradients(MustCreate(SparseSpec(Combiner::kMean)), 22);
  CheckSparseGradients(MustCreate(SparseSpec(Combiner::kSqrtn)), 23);
  CheckSparseGradients(MustCreate(SparseSpec(Combiner::kMean, HeadType::kSigmoid)), 24);
}

TEST(ModelSparseTest, CombinersAndCrossedIds) {
  ModelSpec spec = SparseSpec(Combiner::kSqrtn);
  Model model = MustCreate(spec);
  std::vector<int64_t> ids = {4, 4, 1};  // a = {4, 4}, b = 1
  SparseBatch l = model.Lookups(ids.data(), 1);
  EXPECT_EQ(l[0].ids, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(l[1].ids, (std::vector<int64_t>{1}));
  ASSERT_EQ(l[3].ids.size(), 2u);  // a x b: both combinations (the same here)
  EXPECT_EQ(l[3].ids[0], l[3].ids[1]);
  // FNV-1a 64 over (4, 1) as 8-byte little-endian ids, mod 7.
  uint64_t h = 14695981039346656037ULL;
  for (uint64_t id : {4ull, 1ull}) {
    for (int b = 0; b < 8; ++b) {
      h ^= (id >> (8 * b)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
  EXPECT_EQ(l[3].ids[0], static_cast<int64_t>(h % 7));
  // A missing member gives no crossed id; so does an id outside the vocabulary.
  ids = {-1, 5, 2};
  l = model.Lookups(ids.data(), 1);
  EXPECT_TRUE(l[0].ids.empty());
  EXPECT_TRUE(l[3].ids.empty());
  // sqrtn: two equal rows sum to 2r, scaled by 1/sqrt(2).
  Params params = model.InitialParams(3);
  params[4].assign(15, 0.0f);
  params[4][12] = 1.0f;  // row 4 of embedding.a, first element
  for (auto& v : params[0]) v = 0;
  const std::vector<float> x = {0, 0, 0};
  ids = {4, 4, 1};
  // The deep input reaches the logit only through the tower; check the
  // combined value via a kernel that copies input 3 (the first of a's dims).
  params[0][3 * 4 + 0] = 1.0f;  // kernel [8, 4] row 3 -> unit 0
  params[2][0] = 1.0f;          // unit 0 -> logit
  Batch one;
  one.x = x.data();
  one.lookup_ids = ids.data();
  one.size = 1;
  RowMatrix z = model.Logits(params, one);
  EXPECT_NEAR(z(0, 0), std::tanh(2.0 / std::sqrt(2.0)), 1e-6);  // wide weights start at zero
}

// A weighted column (a libsvm dataset's features, vocab 6, 3 slots): an
// embedding with `combiner` and the wide part over it, no dense features.
ModelSpec WeightedSpec(Combiner combiner) {
  ModelSpec spec = Layers({0}, {Dense(3, Activation::kTanh), Dense(1)}, HeadType::kWideAndDeep, 2);
  SparseInput f{"features", 6, 3};
  f.weighted = true;
  spec.sparse_inputs = {f};
  spec.embeddings = {{"features", 2, combiner}};
  spec.wide.columns = {"features"};
  return spec;
}

TEST(ModelSparseTest, WeightedIdsScaleTheirRowsAndTheCombinerUsesTheWeights) {
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    Model model = MustCreate(WeightedSpec(c));
    EXPECT_EQ(model.input_dim(), 0);
    const std::vector<int64_t> ids = {1, 4, -1};
    const std::vector<float> weights = {0.5f, 2.0f, 0.0f};
    SparseBatch l = model.Lookups(ids.data(), 1, weights.data());
    EXPECT_EQ(l[0].ids, (std::vector<int64_t>{1, 4}));
    EXPECT_EQ(l[0].weights, (std::vector<float>{0.5f, 2.0f}));
    EXPECT_EQ(l[1].weights, (std::vector<float>{0.5f, 2.0f}));
    // Embedding rows r1 = (1, 0), r4 = (0, 1); the tower copies the first
    // embedding dim to the logit; wide weights w1 = 3, w4 = -1, bias 0.25.
    Params params = model.InitialParams(3);
    for (auto& v : params) std::fill(v.begin(), v.end(), 0.0f);
    auto var = [&](const std::string& name) {
      for (size_t v = 0; v < model.variables().size(); ++v) {
        if (model.variables()[v].name == name) return v;
      }
      ADD_FAILURE() << "no variable " << name;
      return size_t{0};
    };
    params[var("embedding.features")][1 * 2 + 0] = 1.0f;
    params[var("embedding.features")][4 * 2 + 1] = 1.0f;
    params[var("layers.0.kernel")][0] = 1.0f;  // input 0 -> unit 0
    params[var("layers.1.kernel")][0] = 1.0f;  // unit 0 -> logit
    params[var("wide.features")][1] = 3.0f;
    params[var("wide.features")][4] = -1.0f;
    params[var("wide.bias")][0] = 0.25f;
    Batch one;
    one.lookup_ids = ids.data();
    one.lookup_weights = weights.data();
    one.size = 1;
    const double first = 0.5 * (c == Combiner::kSum    ? 1.0
                                : c == Combiner::kMean ? 1.0 / 2.5
                                                       : 1.0 / std::sqrt(0.25 + 4.0));
    RowMatrix z = model.Logits(params, one);
    EXPECT_NEAR(z(0, 0), std::tanh(first) + 0.5 * 3.0 + 2.0 * -1.0 + 0.25, 1e-6) << CombinerName(c);
  }
}

TEST(ModelSparseTest, WeightedCombinersMatchFiniteDifferences) {
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    Model model = MustCreate(WeightedSpec(c));
    std::mt19937_64 rng(31);
    Params params = RandomParams(model, &rng);
    // 0, 1, 2 and 3 ids, a repeated one, and weights of either sign.
    const std::vector<int64_t> ids = {-1, -1, -1, 2, -1, -1, 0, 5, -1, 3, 3, 1};
    const std::vector<float> weights = {0, 0, 0, 0.7f, 0, 0, 1.5f, -0.4f, 0, 0.3f, 2.0f, 1.0f};
    const std::vector<int32_t> y = {1, 0, 1, 0};
    Batch b;
    b.lookup_ids = ids.data();
    b.lookup_weights = weights.data();
    b.labels = y.data();
    b.size = 4;
    SCOPED_TRACE(CombinerName(c));
    CheckGradientsOfBatch(model, std::move(params), b);
  }
}

TEST(ModelSparseTest, AWeightedColumnCannotBeCrossed) {
  ModelSpec spec = WeightedSpec(Combiner::kSum);
  spec.sparse_inputs.push_back({"other", 4, 1});
  spec.wide.crossed = {{{"features", "other"}, 7}};
  absl::StatusOr<Model> model = Model::Create(spec);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("wide.crossed[0].columns[0]: 'features' is a weighted"),
            std::string::npos)
      << model.status();
}

TEST(ModelSparseTest, CompactLookupsGiveTheSameLossAndRowGradients) {
  Model model = MustCreate(SparseSpec(Combiner::kMean));
  std::mt19937_64 rng(5);
  Params params = RandomParams(model, &rng);
  const int batch = 6;
  const SparseData data = SparseRows(&rng, batch);
  std::vector<int32_t> y = {1, 0, 1, 0, 1, 1};
  const Batch full = data.batch(y);
  Params grads;
  const float loss = model.LossAndGradients(params, full, 0, &grads);

  SparseBatch lookups = model.Lookups(data.ids.data(), batch);
  std::vector<std::vector<int64_t>> unique = CompactLookups(&lookups);
  const Params compact = CompactTables(model, params, unique);
  Batch b = full;
  b.sparse = &lookups;
  Params compact_grads;
  EXPECT_EQ(model.LossAndGradients(compact, b, 0, &compact_grads), loss);
  for (size_t t = 0; t < model.tables().size(); ++t) {
    const int v = model.tables()[t];
    const int64_t dim = model.variables()[v].cols;
    ASSERT_EQ(compact_grads[v].size(), unique[t].size() * dim);
    for (size_t i = 0; i < unique[t].size(); ++i) {
      for (int64_t k = 0; k < dim; ++k) {
        EXPECT_EQ(compact_grads[v][i * dim + k], grads[v][unique[t][i] * dim + k]);
      }
    }
  }
  EXPECT_EQ(compact_grads[0], grads[0]);
}

// The sparse paths on threads: the embedding gather and the wide logit split
// by examples, the gradients' scatter by table rows, so each value has the
// same terms in the same order as on one thread: the same bits with any
// pool. The deep tower here is one linear dense layer (each logit one dot
// product, each input gradient one product per element), so the table
// gradients and logits must match one thread bit for bit; the tanh tower
// (split GEMMs, tanh) gives fixed bits per thread count, close to one.
// Large enough (12288 examples, dims 16 and 8) to take the split paths.
TEST(ModelSparseTest, ThreadsGiveFixedBitsAndTablesTheOneThreadBits) {
  for (bool linear : {true, false}) {
    ModelSpec spec = Layers({3},
                            linear ? std::vector<LayerSpec>{Dense(1)}
                                   : std::vector<LayerSpec>{Dense(32, Activation::kTanh), Dense(1)},
                            HeadType::kWideAndDeep, 2);
    spec.sparse_inputs = {{"a", 1000, 3}, {"b", 50, 1}};
    spec.embeddings = {{"a", 16, Combiner::kMean}, {"b", 8, Combiner::kSqrtn}};
    spec.wide.columns = {"b"};
    spec.wide.crossed = {{{"a", "b"}, 997}};
    const Model base = MustCreate(spec);
    std::mt19937_64 rng(31);
    Params params = RandomParams(base, &rng);
    const int batch = 12288;
    SparseData data;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int64_t> a_id(-1, 999), b_id(0, 49);
    for (int r = 0; r < batch; ++r) {
      for (int k = 0; k < 3; ++k) data.x.push_back(normal(rng));
      for (int k = 0; k < 3; ++k) data.ids.push_back(a_id(rng));
      data.ids.push_back(b_id(rng));
    }
    std::vector<int32_t> y(batch);
    for (int r = 0; r < batch; ++r) y[r] = (r * 7) % 2;
    // The whole tables, and the compact ones a worker pulls.
    SparseBatch lookups = base.Lookups(data.ids.data(), batch);
    const TableIds unique = CompactLookups(&lookups);
    const Params compact = CompactTables(base, params, unique);
    Batch compact_batch = data.batch(y);
    compact_batch.sparse = &lookups;
    for (bool use_compact : {false, true}) {
      const Params& p = use_compact ? compact : params;
      const Batch b = use_compact ? compact_batch : data.batch(y);
      auto step = [&](const Model& m) {
        StepResult r;
        r.loss = m.LossAndGradients(p, b, 11, &r.grads);
        r.logits = m.Logits(p, b);
        return r;
      };
      const StepResult want = step(base);
      for (int threads : {2, 3}) {
        Model model = base;
        model.SetThreads(threads);
        const StepResult first = step(model);
        for (int rep = 0; rep < 2; ++rep) {
          EXPECT_TRUE(SameBits(step(model), first)) << threads << " compact " << use_compact;
        }
        for (size_t v = 0; v < want.grads.size(); ++v) {
          const std::string& name = base.variables()[v].name;
          if (linear && base.variables()[v].table) {
            EXPECT_EQ(
                std::memcmp(first.grads[v].data(), want.grads[v].data(), 4 * want.grads[v].size()),
                0)
                << name << " threads " << threads << " compact " << use_compact;
          }
          EXPECT_TRUE(Close(first.grads[v], want.grads[v]))
              << name << " threads " << threads << " compact " << use_compact;
        }
        if (linear) {
          EXPECT_EQ(std::memcmp(first.logits.data(), want.logits.data(), 4 * want.logits.size()), 0)
              << threads;
        }
        EXPECT_NEAR(first.loss, want.loss, 1e-5 * std::fabs(want.loss));
      }
    }
  }
}

TEST(ModelSparseTest, BadSparseSpecsNameTheField) {
  ModelSpec spec = SparseSpec(Combiner::kMean);
  spec.embeddings[1].dim = 0;
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()),
                       "embeddings[1].dim: must be > 0"));
  spec = SparseSpec(Combiner::kMean);
  spec.wide.crossed[0].columns = {"a", "nope"};
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()),
                       "wide.crossed[0].columns[1]: 'nope' is not a categorical column"));
  spec = SparseSpec(Combiner::kMean);
  spec.wide.crossed[0].columns = {"a"};
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()),
                       "wide.crossed[0].columns: a crossed column needs 2 or more"));
  spec = SparseSpec(Combiner::kMean);
  spec.head = HeadType::kSigmoid;
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()),
                       "wide: needs head wideAndDeep"));
  spec = Layers({4}, {Dense(1)}, HeadType::kWideAndDeep, 2);
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()), "needs a wide part"));
}

// A dynamic column: any id >= 0, rows created on the PS; a model with one
// can only be evaluated with compact tables.
TEST(ModelSparseTest, DynamicColumnsMakeDynamicTablesWithTheirBounds) {
  ModelSpec spec = SparseSpec(Combiner::kMean);
  spec.sparse_inputs[1] = {"b", 0, 1, /*dynamic=*/true};
  spec.embeddings[1].max_rows = 1000;
  spec.wide.max_rows = 50;
  Model model = MustCreate(spec);
  EXPECT_TRUE(model.has_dynamic_tables());
  const VariableSpec& emb = model.variables()[5];
  EXPECT_EQ(emb.name, "embedding.b");
  EXPECT_TRUE(emb.dynamic);
  EXPECT_EQ(emb.rows, 0);
  EXPECT_EQ(emb.max_rows, 1000);
  const VariableSpec& wide = model.variables()[6];
  EXPECT_EQ(wide.name, "wide.b");
  EXPECT_TRUE(wide.dynamic && wide.wide);
  EXPECT_EQ(wide.max_rows, 50);
  EXPECT_FALSE(model.variables()[4].dynamic);  // embedding.a: a vocabulary
  EXPECT_FALSE(model.variables()[7].dynamic);  // the crossed column keeps its buckets
  // Ids of a dynamic column are any value >= 0 (63 bits); -1 is none.
  const int64_t big = int64_t{0x7123456789abcdef};
  std::vector<int64_t> ids = {1, -1, big};
  SparseBatch l = model.Lookups(ids.data(), 1);
  EXPECT_EQ(l[1].ids, (std::vector<int64_t>{big}));
  EXPECT_EQ(l[2].ids, (std::vector<int64_t>{big}));
  ASSERT_EQ(l[3].ids.size(), 1u);
  EXPECT_LT(l[3].ids[0], 7);

  spec.sparse_inputs[1].dynamic = false;
  spec.sparse_inputs[1].vocab = 4;
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()),
                       "embeddings[1].maxRows: only applies to a dynamic column"));
  spec.embeddings[1].max_rows = 0;
  EXPECT_TRUE(Contains(std::string(Model::Create(spec).status().message()),
                       "wide.maxRows: only applies to wide.columns that are dynamic"));
}

TEST(ModelSparseTest, InitialTableRowsAreAFunctionOfSeedTableAndIdOnly) {
  ModelSpec spec = SparseSpec(Combiner::kMean);
  spec.sparse_inputs[1] = {"b", 0, 1, /*dynamic=*/true};
  Model model = MustCreate(spec);
  std::vector<float> a(2), b(2), c(2), wide(1);
  model.InitialRow(5, 7, int64_t{1} << 62, a.data());
  model.InitialRow(5, 7, int64_t{1} << 62, b.data());
  model.InitialRow(5, 8, int64_t{1} << 62, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (float v : a) EXPECT_LE(std::fabs(v), 1 / std::sqrt(2.0f));
  model.InitialRow(6, 7, 3, wide.data());
  EXPECT_EQ(wide[0], 0.0f);
}

// Evaluation in blocks with compact tables (what the chief and `kubetrain
// eval` do) gives the figures of whole tables exactly, over several blocks.
TEST(ModelSparseTest, EvaluateWithCompactTablesEqualsWholeTables) {
  Model model = MustCreate(SparseSpec(Combiner::kSqrtn));
  std::mt19937_64 rng(9);
  Params params = RandomParams(model, &rng);
  const int n = 2500;
  const SparseData data = SparseRows(&rng, n);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) y[i] = static_cast<int32_t>((rng() >> 7) % 2);
  const Batch whole = data.batch(y);
  const EvalMetrics want = model.Evaluate(params, whole);

  SparseBatch lookups = model.Lookups(data.ids.data(), n);
  const TableIds unique = CompactLookups(&lookups);
  const Params compact = CompactTables(model, params, unique);
  Batch b = whole;
  b.sparse = &lookups;
  const EvalMetrics got = model.Evaluate(compact, b);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.accuracy, want.accuracy);
  EXPECT_EQ(got.auc, want.auc);
  EXPECT_EQ(got.examples, n);
}

TEST(ModelSparseTest, ASparseModelMayHaveNoDenseFeatures) {
  ModelSpec spec = SparseSpec(Combiner::kMean);
  spec.input_shape = {0};
  Model model = MustCreate(spec);
  EXPECT_EQ(model.input_dim(), 0);
  EXPECT_EQ(model.variables()[0].rows, 3 + 2);  // the embeddings only
  CheckSparseGradients(model, 31);
}

}  // namespace kubetrain
