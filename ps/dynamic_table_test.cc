#include "ps/dynamic_table.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "core/memory_budget.h"
#include "core/model.h"

namespace kubetrain {
namespace {

// A model with one embedding table "embedding.c" of dim 8 (variable `table`).
struct Fixture {
  explicit Fixture(const char* optimizer = "adagrad", int64_t dim = 8) : dim(dim) {
    ModelSpec spec;
    spec.type = "layers";
    spec.input_shape = {1};  // one dense feature (and one lookup id)
    LayerSpec dense;
    dense.units = 1;
    spec.layers = {dense};
    spec.head = HeadType::kSigmoid;
    spec.num_classes = 2;
    spec.sparse_inputs = {{"c", 10, 1}};
    spec.embeddings = {{"c", static_cast<int>(dim), Combiner::kSum}};
    model = std::make_unique<Model>(*Model::Create(spec));
    table = model->tables()[0];
    opt.type = optimizer;
    opt.learning_rate = 0.1;
  }
  std::unique_ptr<DynamicTable> Make(uint64_t seed = 1, int64_t max_rows = 0) const {
    auto ro = RowOptimizer::Create(opt, 0, dim);
    EXPECT_TRUE(ro.ok()) << ro.status();
    const Model* m = model.get();
    const int t = table;
    return std::make_unique<DynamicTable>(
        dim, max_rows, [m, t, seed](int64_t id, float* out) { m->InitialRow(t, seed, id, out); },
        std::move(*ro));
  }
  std::vector<float> Row(const DynamicTable& d, int64_t id) const {
    std::vector<float> out(dim);
    d.Read({id}, out.data());
    return out;
  }
  std::vector<float> Init(int64_t id, uint64_t seed = 1) const {
    std::vector<float> out(dim);
    model->InitialRow(table, seed, id, out.data());
    return out;
  }
  // One lazy optimizer step on `ids` with gradient `g` per element.
  void Step(DynamicTable* d, const std::vector<int64_t>& ids, float g, int64_t step) const {
    const std::vector<int64_t> rows = d->Touch(ids);
    std::vector<float> grad(ids.size() * dim, g), out(ids.size() * dim);
    ASSERT_TRUE(d->optimizer()->Stage(d->values(), rows, grad.data(), step, out.data()));
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(out.data() + i * dim, dim, d->mutable_values() + rows[i] * dim);
    }
    d->optimizer()->Commit(rows);
  }
  int64_t dim;
  std::unique_ptr<Model> model;
  int table = 0;
  OptimizerSpec opt;
};

// id -> {value, slot 0, slot 1, ...} of an export.
std::map<int64_t, std::vector<std::vector<float>>> ById(const DynamicTable::Rows& rows,
                                                        int64_t dim) {
  std::map<int64_t, std::vector<std::vector<float>>> out;
  for (size_t i = 0; i < rows.ids.size(); ++i) {
    auto& r = out[rows.ids[i]];
    r.emplace_back(rows.values.begin() + i * dim, rows.values.begin() + (i + 1) * dim);
    for (const auto& s : rows.slots) r.emplace_back(s.begin() + i * dim, s.begin() + (i + 1) * dim);
  }
  return out;
}

TEST(DynamicTableTest, InitialRowsAreAFunctionOfSeedTableAndIdOnly) {
  Fixture f;
  const int64_t big = (int64_t{1} << 62) + 12345;  // a hashed id: no modulo, any 64-bit value
  const std::vector<int64_t> ids = {7, big, -3};
  std::vector<std::vector<float>> first;
  {
    auto d = f.Make();
    d->Touch(ids);
    for (int64_t id : ids) first.push_back(f.Row(*d, id));
  }
  // A re-created table (a restarted PS) creates the rows identically, in
  // another order, and reads an unseen id as the same value without creating it.
  auto d = f.Make();
  EXPECT_EQ(f.Row(*d, big), first[1]);
  EXPECT_EQ(d->size(), 0);
  d->Touch({-3, 99, big, 7});
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(f.Row(*d, ids[i]), first[i]);
  const double limit = 1.0 / std::sqrt(8.0);
  for (float v : first[1]) EXPECT_LE(std::abs(v), limit);
  EXPECT_NE(first[0], first[1]);
  EXPECT_NE(f.Init(7, 1), f.Init(7, 2));  // the seed matters
  EXPECT_EQ(d->rows_created(), 4);
}

TEST(DynamicTableTest, EvictsTheLeastRecentlyUsedRowAndCountsIt) {
  Fixture f("sgd");
  auto d = f.Make(1, 3);
  d->Touch({1, 2, 3});
  f.Step(d.get(), {2}, 1.0f, 1);  // 2 trained: no longer its initial value
  EXPECT_NE(f.Row(*d, 2), f.Init(2));
  d->Touch({1});  // order now (most recent first): 1 2 3
  d->Touch({4});  // evicts 3
  EXPECT_EQ(d->size(), 3);
  EXPECT_EQ(d->rows_evicted(), 1);
  d->Touch({5});  // evicts 2, the least recent now
  EXPECT_EQ(d->rows_evicted(), 2);
  EXPECT_EQ(d->rows_created(), 5);
  auto held = d->Export();
  EXPECT_EQ(held.ids, (std::vector<int64_t>{1, 4, 5}));
  // An evicted row comes back untrained: its initial value again.
  d->Touch({2});
  EXPECT_EQ(f.Row(*d, 2), f.Init(2));
  EXPECT_EQ(d->rows_evicted(), 3);
  EXPECT_EQ(d->rows_created(), 6);
}

TEST(DynamicTableTest, NeverEvictsARowOfTheSameTouch) {
  Fixture f("sgd");
  auto d = f.Make(1, 2);
  const std::vector<int64_t> rows = d->Touch({1, 2, 3, 2});
  EXPECT_EQ(d->rows_evicted(), 0);
  EXPECT_EQ(d->size(), 3);  // past max_rows until the next touch
  EXPECT_EQ(rows[1], rows[3]);
  EXPECT_NE(rows[0], rows[1]);
  EXPECT_NE(rows[0], rows[2]);
  EXPECT_NE(rows[1], rows[2]);
  for (int64_t id : {1, 2, 3}) EXPECT_EQ(f.Row(*d, id), f.Init(id));
  d->Touch({4});  // trims back to 2: evicts 1 and 3 (2 was touched last)
  EXPECT_EQ(d->size(), 2);
  EXPECT_EQ(d->rows_evicted(), 2);
  EXPECT_EQ(d->Export().ids, (std::vector<int64_t>{2, 4}));
}

// Lazy: the touched rows end as the dense row optimizer leaves them, the
// other rows (values and slots) do not move.
TEST(DynamicTableTest, LazyOptimizerTouchesOnlyTheTouchedRows) {
  for (const char* type : {"sgd", "adagrad", "adam", "ftrl"}) {
    Fixture f(type);
    auto d = f.Make();
    d->Touch({10, 20, 30});
    const auto before = ById(d->Export(), f.dim);
    f.Step(d.get(), {30, 10}, 0.5f, 1);
    const auto after = ById(d->Export(), f.dim);
    // Reference: the same rule on a 3-row table (rows: ids 10, 20, 30).
    auto ref = RowOptimizer::Create(f.opt, 3, f.dim);
    ASSERT_TRUE(ref.ok());
    std::vector<float> table;
    for (int64_t id : {10, 20, 30}) {
      table.insert(table.end(), before.at(id)[0].begin(), before.at(id)[0].end());
    }
    std::vector<float> grad(2 * f.dim, 0.5f), out(2 * f.dim);
    ASSERT_TRUE((*ref)->Stage(table.data(), {2, 0}, grad.data(), 1, out.data()));
    (*ref)->Commit({2, 0});
    std::copy_n(out.data(), f.dim, table.data() + 2 * f.dim);
    std::copy_n(out.data() + f.dim, f.dim, table.data());
    const std::vector<int64_t> ids = {10, 20, 30};
    for (int i = 0; i < 3; ++i) {
      const auto& row = after.at(ids[i]);
      EXPECT_EQ(row[0],
                std::vector<float>(table.begin() + i * f.dim, table.begin() + (i + 1) * f.dim))
          << type << " id " << ids[i];
      for (size_t k = 1; k < row.size(); ++k) {
        const std::vector<float>& slot = *(*ref)->Slots()[k - 1];
        EXPECT_EQ(row[k],
                  std::vector<float>(slot.begin() + i * f.dim, slot.begin() + (i + 1) * f.dim))
            << type << " id " << ids[i] << " slot " << k - 1;
      }
    }
    EXPECT_EQ(after.at(20), before.at(20)) << type;  // untouched: value and slots
    EXPECT_NE(after.at(10), before.at(10)) << type;
  }
}

TEST(DynamicTableTest, ExportImportRoundTripsRowsAndSlots) {
  Fixture f("adam");
  auto d = f.Make(1, 100);
  std::mt19937_64 rng(3);
  for (int64_t step = 1; step <= 20; ++step) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 10; ++i) ids.push_back(static_cast<int64_t>(rng() % 300));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    f.Step(d.get(), ids, 0.25f, step);
  }
  const auto saved = d->Export();
  ASSERT_EQ(static_cast<int64_t>(saved.ids.size()), d->size());
  auto restored = f.Make(1, 100);
  ASSERT_TRUE(restored->Import(saved).ok());
  const auto again = restored->Export();
  EXPECT_EQ(again.ids, saved.ids);
  EXPECT_EQ(again.values, saved.values);
  EXPECT_EQ(again.slots, saved.slots);
  for (int64_t id : saved.ids) EXPECT_EQ(f.Row(*restored, id), f.Row(*d, id));
  // Training goes on from the restored state exactly as from the original.
  f.Step(d.get(), {saved.ids[0], 1000}, 1.0f, 21);
  f.Step(restored.get(), {saved.ids[0], 1000}, 1.0f, 21);
  EXPECT_EQ(restored->Export().values, d->Export().values);
  // Bad input changes nothing.
  DynamicTable::Rows bad = saved;
  bad.ids[1] = bad.ids[0];
  EXPECT_FALSE(restored->Import(bad).ok());
  bad = saved;
  bad.values.pop_back();
  EXPECT_FALSE(restored->Import(bad).ok());
  EXPECT_EQ(restored->Export().values, d->Export().values);
}

// A restored table evicts what the original would have: recency comes back
// with the rows.
TEST(DynamicTableTest, ARestoredTableEvictsInTheOriginalsOrder) {
  Fixture f("sgd");
  auto d = f.Make(1, 3);
  d->Touch({10, 20, 30});
  d->Touch({10});  // 20 is now the least recently used
  auto restored = f.Make(1, 3);
  ASSERT_TRUE(restored->Import(d->Export()).ok());
  for (DynamicTable* t : {d.get(), restored.get()}) {
    t->Touch({40});
    std::vector<int64_t> ids = t->Export().ids;
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(ids, (std::vector<int64_t>{10, 30, 40}));
  }
}

// Every page of a listing, in order; `pages` counts them.
std::vector<int64_t> ListAll(DynamicTable* d, int64_t page_rows, std::vector<float>* values,
                             int* pages = nullptr) {
  std::vector<int64_t> ids;
  int64_t cursor = 0;
  int n = 0;
  do {
    cursor = d->List(cursor, page_rows, &ids, values);
    ++n;
  } while (cursor >= 0);
  if (pages != nullptr) *pages = n;
  return ids;
}

// List pages through the held rows in increasing id order, skipping evicted
// ones; the generation moves with every row created or evicted.
TEST(DynamicTableTest, ListPagesThroughTheHeldRowsOnlyInIdOrder) {
  Fixture f("sgd");
  auto d = f.Make(1, 4);
  d->Touch({6, 1, 5, 2, 4, 3});  // one touch may pass the bound
  const int64_t generation = d->generation();
  d->Touch({7});  // evicts 6, 1 and 5 (4 rows held again), reuses a slab row
  EXPECT_GT(d->generation(), generation);
  const int64_t bytes = d->Bytes();
  std::vector<float> values;
  int pages = 0;
  EXPECT_EQ(ListAll(d.get(), 3, &values, &pages), (std::vector<int64_t>{2, 3, 4, 7}));
  EXPECT_EQ(pages, 2);
  EXPECT_EQ(values.size(), 4u * 8);
  for (int64_t k = 0; k < 4; ++k) {
    const int64_t id = std::vector<int64_t>{2, 3, 4, 7}[k];
    EXPECT_EQ(std::vector<float>(values.begin() + k * 8, values.begin() + (k + 1) * 8),
              f.Row(*d, id));
  }
  // The sorted ids are kept while the listing runs, and dropped after its last page.
  std::vector<int64_t> ids;
  EXPECT_EQ(d->List(0, 1, &ids, &values), 1);
  EXPECT_EQ(d->Bytes(), bytes + 4 * 8);
  EXPECT_EQ(d->List(1, 10, &ids, &values), -1);
  EXPECT_EQ(d->Bytes(), bytes);
  EXPECT_EQ(d->List(0, 0, &ids, &values), 0);  // nothing listed, nothing skipped
}

// The order of a listing depends only on the rows held: two tables that
// created the same rows in other orders, with evictions in between (other
// slab rows), list the same ids and values page for page.
TEST(DynamicTableTest, TablesHoldingTheSameRowsListTheSamePages) {
  Fixture f("adagrad");
  auto a = f.Make(1, 300);
  auto b = f.Make(1, 300);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 500; ++i)
    ids.push_back(static_cast<int64_t>((i + 1) * 0x9e3779b97f4a7c15ULL >> 1));
  std::vector<int64_t> shuffled = ids;
  std::mt19937_64 rng(5);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (size_t i = 0; i < ids.size(); i += 50) {
    a->Touch(std::vector<int64_t>(ids.begin() + i, ids.begin() + i + 50));
    b->Touch(std::vector<int64_t>(shuffled.begin() + i, shuffled.begin() + i + 50));
  }
  // The last 300 of `ids` in both (b holds others: touch those again, in another order).
  const std::vector<int64_t> keep(ids.end() - 300, ids.end());
  std::vector<int64_t> keep_reversed(keep.rbegin(), keep.rend());
  a->Touch(keep);
  b->Touch(keep_reversed);
  ASSERT_EQ(a->size(), 300);
  ASSERT_EQ(b->size(), 300);
  std::vector<float> va, vb;
  const std::vector<int64_t> la = ListAll(a.get(), 7, &va), lb = ListAll(b.get(), 7, &vb);
  EXPECT_EQ(la, lb);
  EXPECT_TRUE(std::is_sorted(la.begin(), la.end()));
  std::vector<int64_t> sorted_keep = keep;
  std::sort(sorted_keep.begin(), sorted_keep.end());
  EXPECT_EQ(la, sorted_keep);
  EXPECT_EQ(va, vb);  // initial values depend on the id only
}

// Memory: bytes per held row stay within dim x 4 x (1 + slots) +
// kRowOverheadBytes, plus the slab's growth slack (max(256 rows, 1/8)).
TEST(DynamicTableTest, BytesPerRowAreThePayloadPlusASmallConstant) {
  for (const char* type : {"sgd", "adam"}) {
    Fixture f(type, 16);
    auto d = f.Make();
    const int64_t n = 50000;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(static_cast<int64_t>(i * 0x9e3779b97f4a7c15ULL));
      if (ids.size() == 1000) {
        d->Touch(ids);
        ids.clear();
      }
    }
    ASSERT_EQ(d->size(), n);
    const int64_t payload = 16 * 4 * (1 + d->optimizer()->num_slots());
    const int64_t slack_rows = std::max<int64_t>(256, n / 8);
    const int64_t bound =
        n * (payload + DynamicTable::kRowOverheadBytes) + slack_rows * (payload + 16);
    EXPECT_LE(d->Bytes(), bound) << type;
    EXPECT_GE(d->Bytes(), n * payload) << type;
    std::printf("%s dim 16: %.1f bytes per row, payload %lld, constant bound %lld\n", type,
                static_cast<double>(d->Bytes()) / n, static_cast<long long>(payload),
                static_cast<long long>(DynamicTable::kRowOverheadBytes));
  }
}

// A bounded table filled to its bound holds exactly the payload plus what
// the memory check counts for it (core/memory_budget.h): the slab stops at
// max_rows, and the hash map has absl's capacity for that many ids.
TEST(DynamicTableTest, AFullBoundedTableHoldsWhatTheMemoryCheckCounts) {
  for (const char* type : {"sgd", "adagrad", "adam"}) {
    for (int64_t max_rows : {3000, 50000}) {
      Fixture f(type, 16);
      auto d = f.Make(1, max_rows);
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < max_rows; ++i) {
        ids.push_back(static_cast<int64_t>((i + 1) * 0x9e3779b97f4a7c15ULL >> 1));
        if (ids.size() == 1000 || i + 1 == max_rows) {
          d->Touch(ids);
          ids.clear();
        }
      }
      ASSERT_EQ(d->size(), max_rows);
      ASSERT_EQ(d->rows_evicted(), 0);
      const int64_t payload = 16 * 4 * (1 + d->optimizer()->num_slots());
      EXPECT_EQ(d->Bytes(), max_rows * payload + DynamicTableBookkeepingBytes(max_rows))
          << type << " " << max_rows;
    }
  }
}

}  // namespace
}  // namespace kubetrain
