// Checkpoints taken in place (Shard::StartCheckpoint): what an open
// checkpoint reads and writes is the state when it opened, bit for bit,
// however the tables change meanwhile, at the cost of the rows changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ps/checkpoint.h"
#include "ps/shard.h"
#include "ps/shard_test_fixtures.h"

namespace kubetrain {
namespace {

std::string TempDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The file WriteShardCheckpoint makes of `source`, as bytes.
std::string WrittenBytes(CheckpointSource& source, const std::string& name) {
  const std::string dir = TempDir(name);
  EXPECT_TRUE(WriteShardCheckpoint(dir, source).ok());
  char file[32];
  std::snprintf(file, sizeof(file), "/ckpt-%012lld.ktc",
                static_cast<long long>(source.fields().version));
  return FileBytes(ShardCheckpointDir(dir, source.fields().shard_index) + file);
}

void ExpectSameState(const ShardCheckpoint& a, const ShardCheckpoint& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.part_names, b.part_names);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.worker_clocks, b.worker_clocks);
}

Shard::SparseGrad Grad(const std::vector<int64_t>& ids, float g) {
  return {0, ids, std::vector<float>(ids.size() * 16, g)};
}

TEST(ShardCheckpointInPlaceTest, AFixedTablesCheckpointIsTheStateWhenItOpened) {
  TableFixture f("adagrad", 1, TrainingMode::kAsync);
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {Grad({0, 6}, 0.5f)}).ok());
  const ShardCheckpoint then = f.shard->Checkpoint();
  InMemoryCheckpointSource then_source(then);
  const std::string then_bytes = WrittenBytes(then_source, "fixed_then");

  std::unique_ptr<CheckpointSource> open = f.shard->StartCheckpoint();
  ASSERT_NE(open, nullptr);
  EXPECT_EQ(open->fields().version, 1);
  const std::vector<float> before = f.Rows(kLocalIds);
  std::vector<std::vector<float>> dense = f.DenseGrads();
  for (auto& g : dense) g.assign(g.size(), 0.25f);
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, dense, {Grad({0, 2}, 1.0f)}).ok());
  ASSERT_TRUE(f.shard->Push({0, 2, 3}, dense, {Grad({2, 4}, -1.0f)}).ok());
  ASSERT_NE(f.Rows(kLocalIds), before);  // training went on

  // The rows changed while it was open were copied once each: 0, 2 and 4.
  EXPECT_EQ(f.shard->stats().checkpoint_rows_copied, 3);
  EXPECT_EQ(WrittenBytes(*open, "fixed_open"), then_bytes);
  // Read again (a retry after a full disk reads it twice): the same.
  ASSERT_TRUE(f.shard->Push({0, 3, 4}, dense, {Grad({8}, 1.0f)}).ok());
  ExpectSameState(ReadAllOf(*open), then);
  EXPECT_EQ(f.shard->stats().checkpoint_rows_copied, 4);

  // Once closed, updates copy nothing.
  open.reset();
  ASSERT_TRUE(f.shard->Push({0, 4, 5}, dense, {Grad({0, 2, 4, 6, 8}, 1.0f)}).ok());
  EXPECT_EQ(f.shard->stats().checkpoint_rows_copied, 4);
}

TEST(ShardCheckpointInPlaceTest, ADynamicTablesCheckpointKeepsItsRowsIdsAndRecency) {
  DynamicFixture f("adam", 6);  // 3 rows on each of the 2 shards
  f.Rows({2, 4, 6});
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {Grad({4, 2}, 0.5f)}).ok());
  const ShardCheckpoint then = f.shard->Checkpoint();
  InMemoryCheckpointSource then_source(then);
  const std::string then_bytes = WrittenBytes(then_source, "dynamic_then");

  std::unique_ptr<CheckpointSource> open = f.shard->StartCheckpoint();
  ASSERT_NE(open, nullptr);
  // Evictions give the slab rows of 6 and then 4 to new ids; 2 is updated.
  f.Rows({8});
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.DenseGrads(), {Grad({10, 2}, 1.0f)}).ok());
  EXPECT_EQ(f.shard->TableRowCounts()[0].evicted, 2);
  EXPECT_EQ(f.shard->stats().checkpoint_rows_copied, 3);

  EXPECT_EQ(WrittenBytes(*open, "dynamic_open"), then_bytes);
  ExpectSameState(ReadAllOf(*open), then);
  open.reset();

  // Restored from it, a shard holds the rows of then, in the same recency:
  // the next new id evicts 6, the least recently used then (4 and 2 were
  // pushed after it), and keeps 4's trained row.
  std::unique_ptr<Shard> restarted = f.Make();
  ASSERT_TRUE(restarted->Restore(then).ok());
  f.Rows({12}, restarted.get());
  EXPECT_EQ(restarted->TableRowCounts()[0].evicted, 1);
  EXPECT_EQ(f.Read({6}, restarted.get()), f.Init(6));  // evicted: reads as initial
  EXPECT_NE(f.Read({4}, restarted.get()), f.Init(4));
}

TEST(ShardCheckpointInPlaceTest, ARestoreRefusesADynamicTableThatRepeatsAnIdAndLoadsNothing) {
  DynamicFixture f("adagrad", 100);
  f.Rows({2, 4});
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {Grad({2, 4}, 0.5f)}).ok());
  ShardCheckpoint bad = f.shard->Checkpoint();
  std::vector<float>& ids = bad.values[bad.values.size() - 2];
  ASSERT_EQ(ids.size(), 2u * kTableIdFloats);
  std::copy_n(ids.begin(), kTableIdFloats, ids.begin() + kTableIdFloats);  // 2 rows, one id
  std::unique_ptr<Shard> restarted = f.Make();
  absl::Status s = restarted->Restore(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("embedding.c@ids repeats an id"), absl::string_view::npos) << s;
  EXPECT_EQ(restarted->version(), 0);
  EXPECT_EQ(restarted->TableRowCounts()[0].rows, 0);
}

TEST(ShardCheckpointInPlaceTest, OneIsHandedOutAtATimeAndABoundaryMetMeanwhileKeepsItsVersion) {
  TableFixture f("adagrad", 1, TrainingMode::kAsync);
  TableFixture twin("adagrad", 1, TrainingMode::kAsync);  // the same pushes, no checkpoints
  f.options.checkpoint_every_steps = 2;
  f.shard = f.Make();
  auto push = [](TableFixture& x, const std::vector<int64_t>& ids) {
    const int64_t v = x.shard->version();
    ASSERT_TRUE(x.shard
                    ->Push({0, v, static_cast<uint64_t>(v + 1)}, x.DenseGrads(),
                           {Grad(ids, 1.0f + static_cast<float>(v))})
                    .ok());
  };
  const std::vector<std::vector<int64_t>> ids = {{2}, {4}, {2, 6}, {0, 4}, {4, 8}};
  push(f, ids[0]);
  EXPECT_EQ(f.shard->TakePendingCheckpoint(), nullptr);
  push(f, ids[1]);
  std::unique_ptr<CheckpointSource> at_2 = f.shard->TakePendingCheckpoint();
  ASSERT_NE(at_2, nullptr);
  EXPECT_EQ(at_2->fields().version, 2);
  EXPECT_EQ(f.shard->StartCheckpoint(), nullptr);  // one is handed out
  push(f, ids[2]);
  push(f, ids[3]);  // boundary 4, while 2 is being written
  push(f, ids[4]);  // changes rows 4 and 8 after it
  EXPECT_EQ(f.shard->TakePendingCheckpoint(), nullptr);
  at_2.reset();
  std::unique_ptr<CheckpointSource> at_4 = f.shard->TakePendingCheckpoint();
  ASSERT_NE(at_4, nullptr);
  EXPECT_EQ(at_4->fields().version, 4);
  for (int i = 0; i < 4; ++i) push(twin, ids[i]);
  ExpectSameState(ReadAllOf(*at_4), twin.shard->Checkpoint());
  at_4.reset();
  push(f, ids[0]);  // 6: a boundary

  // A whole copy taken while a boundary's checkpoint waits leaves one waiting.
  const ShardCheckpoint copy = f.shard->Checkpoint();
  EXPECT_EQ(copy.version, 6);
  std::unique_ptr<CheckpointSource> at_6 = f.shard->TakePendingCheckpoint();
  ASSERT_NE(at_6, nullptr);
  EXPECT_EQ(at_6->fields().version, 6);
  // The in-place and the in-memory checkpoint agree.
  ExpectSameState(ReadAllOf(*at_6), copy);
}

}  // namespace
}  // namespace kubetrain
