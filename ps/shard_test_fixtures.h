// Test fixtures of a shard holding an embedding table (fixed or dynamic),
// shared by shard_test.cc and shard_checkpoint_test.cc.
#ifndef KUBETRAIN_PS_SHARD_TEST_FIXTURES_H_
#define KUBETRAIN_PS_SHARD_TEST_FIXTURES_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/model.h"
#include "core/placement.h"
#include "ps/shard.h"

namespace kubetrain {

// A model with one dense feature and a 10 x 16 embedding table "c", placed
// over 2 PS tasks; the fixture's shard is ps:0 (ids 0, 2, 4, 6, 8).
struct TableFixture {
  explicit TableFixture(const std::string& optimizer, int workers = 2,
                        TrainingMode mode = TrainingMode::kSync) {
    ModelSpec spec;
    spec.type = "layers";
    spec.input_shape = {1};  // one dense feature (and one lookup id)
    LayerSpec dense;
    dense.units = 1;
    spec.layers = {dense};
    spec.head = HeadType::kSigmoid;
    spec.num_classes = 2;
    spec.sparse_inputs = {{"c", 10, 1}};
    spec.embeddings = {{"c", 16, Combiner::kSum}};
    model = std::make_unique<Model>(*Model::Create(spec));
    placement = PlaceVariables(model->variables(), 2, 1 << 20);
    options.num_workers = workers;
    options.mode = mode;
    options.replicas_to_aggregate = mode == TrainingMode::kSync ? workers : 1;
    options.target_steps = 100;
    opt.type = optimizer;
    opt.learning_rate = 0.1;
    shard = Make();
  }
  std::unique_ptr<Shard> Make() {
    auto s = Shard::Create(options, *model, placement, opt, &clock, ShardMetrics{});
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  std::vector<std::vector<float>> DenseGrads() const {
    std::vector<std::vector<float>> g;
    for (const auto& p : shard->parts()) g.emplace_back(p.num_elements(), 0.0f);
    return g;
  }
  // Rows of the table for `ids` (held by shard 0).
  std::vector<float> Rows(const std::vector<int64_t>& ids, Shard* s = nullptr) {
    auto r = (s ? s : shard.get())->PullRows({TaskRole::kWorker, 0}, {{0, ids}});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->rows[0] : std::vector<float>();
  }
  FakeClock clock;
  std::unique_ptr<Model> model;
  Placement placement;
  ShardOptions options;
  OptimizerSpec opt;
  std::unique_ptr<Shard> shard;
};

inline const std::vector<int64_t> kLocalIds = {0, 2, 4, 6, 8};

// Dynamic tables: the fixture's table made dynamic (max_rows over the 2
// shards; shard 0 owns the ids that are even as unsigned 64-bit values).
struct DynamicFixture : TableFixture {
  DynamicFixture(const std::string& optimizer, int64_t max_rows, int workers = 1,
                 TrainingMode mode = TrainingMode::kAsync)
      : TableFixture(optimizer, workers, mode) {
    placement.tables[0].dynamic = true;
    placement.tables[0].rows = 0;
    placement.tables[0].max_rows = max_rows;
    options.has_chief_task = true;  // reads as the chief (a reader)
    shard = Make();
  }
  std::vector<float> Init(int64_t id) const {
    std::vector<float> out(16);
    model->InitialRow(model->tables()[0], 1, id, out.data());
    return out;
  }
  std::vector<float> Read(const std::vector<int64_t>& ids, Shard* s = nullptr) {
    auto r = (s ? s : shard.get())->PullRows({TaskRole::kChief, 0}, {{0, ids}});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->rows[0] : std::vector<float>();
  }
};

inline constexpr int64_t kBigId = -4;  // 0xff..fc: even as unsigned, so shard 0's

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SHARD_TEST_FIXTURES_H_
