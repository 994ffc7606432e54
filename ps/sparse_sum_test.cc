#include "ps/sparse_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kubetrain {
namespace {

// The aggregation as Shard::AggregateSparse did it before SparseRowSum (kept
// verbatim as the reference): a std::map from id to a row of doubles per
// table, pushes and rows added in order.
std::vector<SparseGrad> MapSum(const std::vector<const std::vector<SparseGrad>*>& pushes,
                               const std::vector<int64_t>& dims, double n) {
  std::vector<SparseGrad> out;
  for (int t = 0; t < static_cast<int>(dims.size()); ++t) {
    const int64_t dim = dims[t];
    // id -> its sum, in double; pushes (and rows within one) added in order.
    std::map<int64_t, std::vector<double>> sums;
    for (const auto* push : pushes) {
      for (const SparseGrad& g : *push) {
        if (g.table != t) continue;
        for (size_t i = 0; i < g.ids.size(); ++i) {
          auto& acc = sums[g.ids[i]];
          if (acc.empty()) acc.assign(dim, 0.0);
          for (int64_t k = 0; k < dim; ++k) acc[k] += g.rows[i * dim + k];
        }
      }
    }
    if (sums.empty()) continue;
    SparseGrad agg;
    agg.table = t;
    for (const auto& [id, acc] : sums) {
      agg.ids.push_back(id);
      for (double v : acc) agg.rows.push_back(static_cast<float>(v / n));
    }
    out.push_back(std::move(agg));
  }
  return out;
}

// Same tables, ids and float bits (memcmp: -0.0 and 0.0 differ).
void ExpectSameBits(absl::Span<const SparseGrad> got, const std::vector<SparseGrad>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(got[j].table, want[j].table) << what << " entry " << j;
    EXPECT_EQ(got[j].ids, want[j].ids) << what << " entry " << j;
    ASSERT_EQ(got[j].rows.size(), want[j].rows.size()) << what << " entry " << j;
    EXPECT_EQ(0, std::memcmp(got[j].rows.data(), want[j].rows.data(), want[j].rows.size() * 4))
        << what << " entry " << j;
  }
}

// Random pushes of random rows with duplicate ids across and within pushes
// (a table may even appear twice in one push), values of mixed magnitudes
// (so the order of the additions shows in the bits) and signed zeros: the
// sums are the map's, bit for bit, call after call on the same object.
TEST(SparseRowSumTest, BitIdenticalToTheMapOnRandomRows) {
  std::mt19937_64 rng(25);
  const std::vector<int64_t> dims = {16, 1, 8, 3};
  SparseRowSum sum;  // one object: its reused buffers must not leak across calls
  int duplicates = 0;
  for (int round = 0; round < 300; ++round) {
    const int workers = 1 + static_cast<int>(rng() % 4);
    std::vector<std::vector<SparseGrad>> pushes(workers);
    // Odd rounds: pushes as PsClient sends them (tables in order, each
    // table's ids distinct and sorted), so each push is one sorted run.
    const bool as_sent = round % 2 == 1;
    for (auto& push : pushes) {
      const int entries = static_cast<int>(rng() % (as_sent ? dims.size() + 1 : 6));
      for (int e = 0; e < entries; ++e) {
        SparseGrad g;
        g.table = as_sent ? e : static_cast<int>(rng() % dims.size());
        const int64_t id_space = 1 + static_cast<int64_t>(rng() % 40);
        const int rows = static_cast<int>(rng() % 30);
        for (int i = 0; i < rows; ++i) {
          // Negative and huge ids too (dynamic tables' ids are any int64).
          g.ids.push_back(rng() % 7 == 0 ? static_cast<int64_t>(rng()) : (rng() % id_space) - 3);
        }
        if (as_sent) {
          std::sort(g.ids.begin(), g.ids.end());
          g.ids.erase(std::unique(g.ids.begin(), g.ids.end()), g.ids.end());
        }
        for (size_t i = 0; i < g.ids.size(); ++i) {
          for (int64_t k = 0; k < dims[g.table]; ++k) {
            const uint64_t r = rng();
            float v;
            switch (r % 5) {
              case 0:
                v = (r & 8) ? -0.0f : 0.0f;
                break;
              case 1:
                v = std::ldexp(static_cast<float>(static_cast<int>(r >> 8) % 1000), 40);
                break;
              default:
                v = std::ldexp(static_cast<float>(static_cast<int>(r >> 8) % 100000) - 50000.0f,
                               -static_cast<int>((r >> 40) % 30));
            }
            g.rows.push_back(v);
          }
        }
        push.push_back(std::move(g));
      }
    }
    std::vector<const std::vector<SparseGrad>*> inputs;
    for (const auto& p : pushes) inputs.push_back(&p);
    const double n = static_cast<double>(1 + rng() % 4);
    const std::vector<SparseGrad> want = MapSum(inputs, dims, n);
    size_t rows = 0, distinct = 0;
    for (const auto& p : pushes)
      for (const auto& g : p) rows += g.ids.size();
    for (const auto& g : want) distinct += g.ids.size();
    duplicates += static_cast<int>(rows - distinct);
    ExpectSameBits(sum.Sum(inputs, dims, n), want, "round " + std::to_string(round));
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(duplicates, 1000);  // the rounds did exercise merging
}

// What ordering the sum's bits depend on: the same rows with the pushes in
// another order round differently here, so the test above would notice an
// aggregation that ignored the order of arrival.
TEST(SparseRowSumTest, ArrivalOrderShowsInTheBits) {
  const std::vector<int64_t> dims = {1};
  std::vector<SparseGrad> a = {{0, {5}, {1e20f}}}, b = {{0, {5}, {1.0f}}}, c = {{0, {5}, {-1e20f}}};
  SparseRowSum sum;
  const float abc = sum.Sum({&a, &b, &c}, dims, 1.0)[0].rows[0];
  const float acb = sum.Sum({&a, &c, &b}, dims, 1.0)[0].rows[0];
  EXPECT_EQ(abc, 0.0f);
  EXPECT_EQ(acb, 1.0f);
  EXPECT_EQ(MapSum({&a, &b, &c}, dims, 1.0)[0].rows[0], abc);
  EXPECT_EQ(MapSum({&a, &c, &b}, dims, 1.0)[0].rows[0], acb);
}

// Once it has seen the largest step, the object keeps its buffers: the
// result's storage does not move on a later call of the same size or smaller.
TEST(SparseRowSumTest, ReusesItsBuffers) {
  const std::vector<int64_t> dims = {4, 2};
  std::vector<SparseGrad> big = {{0, {1, 2, 3, 1}, std::vector<float>(16, 1.0f)},
                                 {1, {7, 7}, std::vector<float>(4, 2.0f)}};
  std::vector<SparseGrad> small = {{0, {3}, std::vector<float>(4, 0.5f)},
                                   {1, {9}, std::vector<float>(2, 0.25f)}};
  SparseRowSum sum;
  absl::Span<const SparseGrad> first = sum.Sum({&big}, dims, 2.0);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(first[0].rows[0], 1.0f);  // (1 + 1) / 2
  EXPECT_EQ(first[1].ids, (std::vector<int64_t>{7}));
  const float* rows0 = first[0].rows.data();
  const int64_t* ids1 = first[1].ids.data();
  absl::Span<const SparseGrad> second = sum.Sum({&small}, dims, 1.0);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].rows.data(), rows0);
  EXPECT_EQ(second[1].ids.data(), ids1);
  EXPECT_EQ(second[1].ids, (std::vector<int64_t>{9}));
  EXPECT_TRUE(sum.Sum({}, dims, 1.0).empty());
}

}  // namespace
}  // namespace kubetrain
