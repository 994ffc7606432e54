// Gradient rows of embedding tables as a PS shard receives them, and their
// sum by id (the sync mean of a step's pushes, or one async push's rows with
// duplicate ids merged), without an allocation per step once warm (issue 25:
// ps/sparse_push_alloc_test.cc).
#ifndef KUBETRAIN_PS_SPARSE_SUM_H_
#define KUBETRAIN_PS_SPARSE_SUM_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace kubetrain {

// Gradient rows of one table in a push: ids (global, held by this shard)
// and ids.size() x dim floats.
struct SparseGrad {
  int table = 0;  // index into the shard's tables
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

// Sums gradient rows by id. Holds its scratch and its result between calls,
// so once the largest step has been seen a call allocates nothing. Not
// thread-safe (the shard calls it under its lock).
//
// Numerics (the sync rule of ps/shard.h, bit for bit what a std::map from id
// to a double row gave before): per (table, id), a row of doubles starts at
// 0.0 and every row of that id is added to it, pushes in the order given,
// rows within a push in order; the sum is divided by `n` in double and
// rounded to float32 once. Output: tables in increasing index, ids in
// increasing order within a table, each once.
//
// How: the (table, id, arrival) keys of all rows are sorted in reused
// vectors (the arrival index keeps equal ids in the order they came; a merge
// of the pushes' runs, each push's rows being sorted already in practice),
// then each run of equal ids is summed. No hash map: absl's flat_hash_map
// frees its array on clear() once it is large, which would allocate every
// step.
class SparseRowSum {
 public:
  // `dims[t]`: the row size of table t; every entry of `pushes` names a
  // table < dims.size() and holds ids.size() x dim rows (the shard has
  // validated them). Returns the sums, valid until the next call.
  absl::Span<const SparseGrad> Sum(absl::Span<const std::vector<SparseGrad>* const> pushes,
                                   absl::Span<const int64_t> dims, double n);

 private:
  struct Key {
    uint32_t table;
    uint32_t arrival;  // index into rows_
    int64_t id;
  };
  // (table, id, arrival): arrivals are distinct, so the order is total and
  // equal ids keep their order of arrival.
  static bool Before(const Key& a, const Key& b);
  // Sorts keys_ by Before without allocating once warm.
  void SortKeys();

  std::vector<Key> keys_, tmp_;
  std::vector<size_t> runs_;        // SortKeys': where the ascending runs start
  std::vector<const float*> rows_;  // by arrival: the row's dim floats
  std::vector<double> acc_;
  // The result is out_[0, used_); entries past it keep their buffers for
  // later calls (a shorter vector would free them).
  std::vector<SparseGrad> out_;
  size_t used_ = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SPARSE_SUM_H_
