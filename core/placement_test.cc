#include "core/placement.h"

#include <gtest/gtest.h>

#include <map>

namespace kubetrain {
namespace {

std::vector<VariableSpec> Vars() {
  return {{"dense0/kernel", 784, 256}, {"dense0/bias", 1, 256},    {"dense1/kernel", 256, 128},
          {"dense1/bias", 1, 128},     {"dense2/kernel", 128, 10}, {"dense2/bias", 1, 10}};
}

TEST(PlacementTest, GreedyLargestFirstOntoLeastLoaded) {
  Placement p = PlaceVariables(Vars(), 2, int64_t{1} << 30);
  // dense0/kernel (802816 B) alone on ps0; everything else (~135 KB) on ps1.
  EXPECT_EQ(p.PartsOfShard(0).size(), 1u);
  EXPECT_EQ(p.PartsOfShard(0)[0]->name, "dense0/kernel");
  EXPECT_EQ(p.PartsOfShard(1).size(), 5u);
  EXPECT_EQ(p.ShardBytes(0) + p.ShardBytes(1), (784 * 256 + 256 + 256 * 128 + 128 + 1280 + 10) * 4);
}

TEST(PlacementTest, SplitsLargeVariablesByRowsCoveringEveryRow) {
  Placement p = PlaceVariables(Vars(), 3, 100 * 1024);
  std::map<int, int64_t> rows_covered;
  for (const auto& part : p.parts) rows_covered[part.variable] += part.row_end - part.row_begin;
  auto vars = Vars();
  for (int v = 0; v < static_cast<int>(vars.size()); ++v) EXPECT_EQ(rows_covered[v], vars[v].rows);
  int kernel0_parts = 0;
  for (const auto& part : p.parts) {
    if (part.variable == 0) {
      ++kernel0_parts;
      EXPECT_NE(part.name.find("/part"), std::string::npos);
    }
  }
  EXPECT_EQ(kernel0_parts, 3);
  // The three equal parts of the big kernel land on three different shards.
  std::map<int, int> shards;
  for (const auto& part : p.parts)
    if (part.variable == 0) shards[part.shard]++;
  EXPECT_EQ(shards.size(), 3u);
}

TEST(PlacementTest, DeterministicWithStableFingerprint) {
  Placement a = PlaceVariables(Vars(), 2, 100 * 1024);
  Placement b = PlaceVariables(Vars(), 2, 100 * 1024);
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  EXPECT_EQ(a.Describe(), b.Describe());
  EXPECT_NE(a.Fingerprint(), PlaceVariables(Vars(), 3, 100 * 1024).Fingerprint());
  EXPECT_NE(a.Fingerprint(), PlaceVariables(Vars(), 2, int64_t{1} << 30).Fingerprint());
}

TEST(PlacementTest, SingleShardHoldsEverythingUnsplit) {
  Placement p = PlaceVariables(Vars(), 1, 1);
  EXPECT_EQ(p.parts.size(), Vars().size());
  for (const auto& part : p.parts) EXPECT_EQ(part.shard, 0);
}

// Tables are on every shard: a fixed one its rows id mod shards, a bounded
// dynamic one its share of maxRows (what the memory check counts); an
// unbounded dynamic table cannot be counted ahead.
TEST(PlacementTest, TablesCountTheirShareOfEachShard) {
  VariableSpec fixed{"embedding.a", 10, 4};
  fixed.table = true;
  VariableSpec bounded{"embedding.b", 0, 8};
  bounded.table = bounded.dynamic = true;
  bounded.max_rows = 1001;
  VariableSpec unbounded{"wide.c", 0, 1};
  unbounded.table = unbounded.dynamic = unbounded.wide = true;
  Placement p = PlaceVariables({fixed, bounded, unbounded}, 4, 1 << 20);
  ASSERT_EQ(p.tables.size(), 3u);
  EXPECT_EQ(p.tables[1].MaxRowsPerShard(4), 251);
  EXPECT_EQ(p.ShardBytes(0), (3 * 4 + 251 * 8) * 4);  // rows 0, 4, 8 of embedding.a
  EXPECT_EQ(p.ShardBytes(3), (2 * 4 + 251 * 8) * 4);  // rows 3, 7
  EXPECT_NE(p.Describe().find("embedding.b[dynamic x8, at most 251 rows]"), std::string::npos);
  EXPECT_NE(p.Describe().find("wide.c[dynamic x1]"), std::string::npos);
}

}  // namespace
}  // namespace kubetrain
