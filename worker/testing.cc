#include "worker/testing.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace testjob {

std::string JobYaml(const JobShape& shape) {
  std::string replicas = absl::StrCat("    PS: {replicas: ", shape.ps,
                                      "}\n    Worker: {replicas: ", shape.workers, "}\n");
  if (shape.chief) absl::StrAppend(&replicas, "    Chief: {replicas: 1}\n");
  if (shape.evaluator) absl::StrAppend(&replicas, "    Evaluator: {replicas: 1}\n");
  return absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: unit
spec:
  replicaSpecs:
)",
                      replicas, R"(  training:
    mode: )",
                      shape.mode, R"(
    model: {type: softmax}
    optimizer: {type: sgd, learningRate: 0.5}
    batchSize: 8
    steps: )",
                      shape.steps, R"(
    seed: 5
    startupTimeoutSeconds: 10
    placement: {splitThresholdBytes: 16384}
)",
                      shape.training);
}

Dataset TinyDataset(int64_t n, uint64_t seed) {
  Dataset d;
  d.size = n;
  d.images.assign(n * d.feature_dim(), 0.0f);
  d.labels.resize(n);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.3f);
  const int block = d.feature_dim() / 10;
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng() % 10);
    d.labels[i] = label;
    float* x = d.images.data() + i * d.feature_dim();
    for (int k = 0; k < d.feature_dim(); ++k) x[k] = noise(rng);
    for (int k = 0; k < block; ++k) x[label * block + k] += 0.7f;
  }
  return d;
}

Dataset DynamicDataset(int64_t n, uint64_t seed, int values) {
  Dataset d;
  d.size = n;
  d.rows = d.cols = 1;
  d.id_slots = 1;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(rng() % values);
    const float x = normal(rng);
    d.images.push_back(x);
    d.lookup_ids.push_back(static_cast<int64_t>((c + 1) * 0x9E3779B97F4A7C15ULL >> 1));
    d.labels.push_back(x + (c % 2 ? 1.5f : -1.5f) > 0 ? 1 : 0);
  }
  return d;
}

std::string DynamicJobYaml(int64_t max_rows) {
  return absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: unit-dynamic
spec:
  replicaSpecs:
    PS: {replicas: 2}
    Worker: {replicas: 2}
  training:
    mode: sync
    model:
      embeddings: [{column: c, dim: 4)",
                      max_rows > 0 ? absl::StrCat(", maxRows: ", max_rows) : "", R"(}]
      layers: [{type: dense, units: 8, activation: tanh}, {type: dense, units: 1}]
      head: sigmoid
    dataset:
      format: csv
      trainFiles: [unused-train.csv]
      testFiles: [unused-test.csv]
      columns:
        - {name: x, type: numeric}
        - {name: c, type: categorical, dynamic: true}
        - {name: y, type: label, numClasses: 2}
    optimizer: {type: adagrad, learningRate: 0.3}
    batchSize: 8
    steps: 150
    seed: 5
    startupTimeoutSeconds: 10
)");
}

absl::StatusOr<std::unique_ptr<InProcessCluster>> InProcessCluster::Create(const TaskConfig& config,
                                                                           const Clock* clock) {
  auto cluster = std::make_unique<InProcessCluster>();
  for (int i = 0; i < config.num_ps; ++i) {
    auto ps = InProcessPs::Create(config, i, clock, /*incarnation=*/100 * (i + 1));
    if (!ps.ok()) return ps.status();
    cluster->ps_.push_back(std::move(*ps));
  }
  return cluster;
}

std::vector<std::unique_ptr<ShardChannel>> InProcessCluster::Channels(
    std::vector<FaultyShardChannel*>* faulty, uint64_t max_chunk_bytes) {
  std::vector<std::unique_ptr<ShardChannel>> channels;
  if (faulty) faulty->clear();
  for (auto& ps : ps_) {
    auto channel = std::make_unique<FaultyShardChannel>(ps->NewChannel(max_chunk_bytes));
    if (faulty) faulty->push_back(channel.get());
    channels.push_back(std::move(channel));
  }
  return channels;
}

void InProcessCluster::TickAll() {
  for (auto& ps : ps_) ps->Tick();
}

}  // namespace testjob
}  // namespace kubetrain
