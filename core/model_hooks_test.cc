// LayerHooks (core/model.h): with hooks a step computes the same bits as
// without; await_params(v) comes before the first read of params[v], and
// gradient_ready(v) once per variable, in BackpropOrder(), after grads[v] is
// final and params[v] read for the last time. Both are proved by poisoning:
// params start as NaN and get their values only in await_params, and are
// NaN again from gradient_ready on (a read outside the window would change
// the loss or a gradient).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/model.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

LayerSpec Dense(int units, Activation a = Activation::kLinear) {
  LayerSpec l;
  l.type = LayerType::kDense;
  l.units = units;
  l.activation = a;
  return l;
}

LayerSpec Of(LayerType type, int kernel = 0, int filters = 0, double rate = 0) {
  LayerSpec l;
  l.type = type;
  l.kernel = kernel;
  l.stride = type == LayerType::kConv2D ? 1 : kernel;
  l.filters = filters;
  l.same_padding = true;
  l.activation = type == LayerType::kConv2D ? Activation::kRelu : Activation::kLinear;
  l.rate = rate;
  return l;
}

ModelSpec Layers(Shape input, std::vector<LayerSpec> layers, HeadType head, int classes) {
  ModelSpec spec;
  spec.type = "layers";
  spec.input_shape = std::move(input);
  spec.layers = std::move(layers);
  spec.head = head;
  spec.num_classes = classes;
  return spec;
}

struct Case {
  std::string name;
  ModelSpec spec;
};

std::vector<Case> Cases() {
  ModelSpec mlp;
  mlp.type = "mlp";
  mlp.input_dim = 12;
  mlp.hidden_units = {8, 6};
  mlp.num_classes = 3;
  // conv2d + pool: a run of image-by-image layers (one job per chunk on threads).
  ModelSpec cnn =
      Layers({6, 6, 1},
             {Of(LayerType::kConv2D, 3, 2), Of(LayerType::kMaxPool2D, 2), Of(LayerType::kFlatten),
              Dense(5, Activation::kRelu), Of(LayerType::kDropout, 0, 0, 0.5), Dense(3)},
             HeadType::kSoftmax, 3);
  // Wide & deep: embeddings, a wide column, a crossed column, the wide bias.
  ModelSpec wide = Layers({3}, {Dense(4, Activation::kTanh), Dense(1)}, HeadType::kWideAndDeep, 2);
  wide.sparse_inputs = {{"a", 5, 2}, {"b", 4, 1}};
  wide.embeddings = {{"a", 3, Combiner::kMean}, {"b", 2, Combiner::kSum}};
  wide.wide.columns = {"b"};
  wide.wide.crossed = {{{"a", "b"}, 7}};
  return {{"mlp", mlp}, {"cnn", cnn}, {"wide_and_deep", wide}};
}

struct Data {
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<int64_t> ids;
  Batch batch;
};

Data MakeData(const Model& model, int rows, std::mt19937_64* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Data d;
  for (int64_t i = 0; i < rows * model.input_dim(); ++i) d.x.push_back(normal(*rng));
  const int classes = model.head() == HeadType::kSoftmax ? 3 : 2;
  for (int r = 0; r < rows; ++r) d.y.push_back(static_cast<int32_t>((*rng)() % classes));
  for (int r = 0; r < rows; ++r) {  // a: two ids in [-1, 5), b: one in [0, 4)
    if (!model.sparse()) break;
    d.ids.push_back(static_cast<int64_t>((*rng)() % 6) - 1);
    d.ids.push_back(static_cast<int64_t>((*rng)() % 6) - 1);
    d.ids.push_back(static_cast<int64_t>((*rng)() % 4));
  }
  d.batch.x = d.x.data();
  d.batch.labels = d.y.data();
  d.batch.lookup_ids = model.sparse() ? d.ids.data() : nullptr;
  d.batch.size = rows;
  return d;
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

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

TEST(ModelHooksTest, HooksGateEveryReadAndWriteAndChangeNoBit) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& c : Cases()) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE(c.name + " threads " + std::to_string(threads));
      absl::StatusOr<Model> created = Model::Create(c.spec);
      ASSERT_TRUE(created.ok()) << created.status();
      Model model = *std::move(created);
      model.SetThreads(threads);
      std::mt19937_64 rng(7);
      const Params truth = RandomParams(model, &rng);
      const Data data = MakeData(model, 24, &rng);

      Params plain_grads;
      const float plain_loss = model.LossAndGradients(truth, data.batch, 3, &plain_grads);

      const int n = static_cast<int>(model.variables().size());
      Params params;  // NaN until awaited, NaN again once its gradient is ready
      for (const auto& v : truth) params.emplace_back(v.size(), nan);
      Params grads, at_ready(n);
      std::vector<int> awaited, ready;
      LayerHooks hooks;
      hooks.await_params = [&](int v) {
        ASSERT_TRUE(v >= 0 && v < n);
        // The first await only: a second must not undo the poison of a ready variable.
        for (int a : awaited) {
          if (a == v) return;
        }
        awaited.push_back(v);
        params[v] = truth[v];
      };
      hooks.gradient_ready = [&](int v) {
        ASSERT_TRUE(v >= 0 && v < n);
        ready.push_back(v);
        at_ready[v] = grads[v];
        std::fill(params[v].begin(), params[v].end(), nan);
      };
      const float loss = model.LossAndGradients(params, data.batch, 3, &grads, &hooks);

      EXPECT_EQ(std::memcmp(&loss, &plain_loss, sizeof(float)), 0) << loss << " vs " << plain_loss;
      ASSERT_EQ(grads.size(), plain_grads.size());
      for (int v = 0; v < n; ++v) {
        EXPECT_TRUE(SameBits(grads[v], plain_grads[v])) << model.variables()[v].name;
        EXPECT_TRUE(SameBits(at_ready[v], grads[v]))
            << model.variables()[v].name << " changed after gradient_ready";
      }
      // Once per variable, last layer first; every variable awaited first.
      EXPECT_EQ(ready, model.BackpropOrder());
      EXPECT_EQ(static_cast<int>(ready.size()), n);
      EXPECT_EQ(static_cast<int>(awaited.size()), n);
      // Forward order: the layers' variables in increasing order.
      std::vector<int> dense_awaited;
      for (int v : awaited) {
        if (!model.variables()[v].table && model.variables()[v].name != "wide.bias") {
          dense_awaited.push_back(v);
        }
      }
      EXPECT_TRUE(std::is_sorted(dense_awaited.begin(), dense_awaited.end()));
    }
  }
}

TEST(ModelHooksTest, AnEmptyBatchStillReadiesEveryGradient) {
  Model model = *Model::Create(Cases()[0].spec);
  std::mt19937_64 rng(1);
  const Params params = RandomParams(model, &rng);
  Batch empty;
  Params grads;
  std::vector<int> ready;
  LayerHooks hooks;
  hooks.gradient_ready = [&](int v) { ready.push_back(v); };
  EXPECT_EQ(model.LossAndGradients(params, empty, 0, &grads, &hooks), 0.0f);
  EXPECT_EQ(ready, model.BackpropOrder());
  // Last layer first: kernel then bias of the last dense layer.
  EXPECT_EQ(ready.front(), static_cast<int>(model.variables().size()) - 2);
}

}  // namespace
}  // namespace kubetrain
