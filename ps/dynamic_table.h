// The rows of one dynamic embedding table held by one PS shard: a hash map
// from 64-bit id to a row of a slab, rows created on first touch with a
// deterministic initial value (a function of (seed, table, id) only: see
// Model::InitialRow), optionally bounded to `max_rows` with eviction of the
// least recently used row.
//
// Storage per row: the value and every optimizer slot (dim floats each, in
// the slab and the RowOptimizer's slot buffers, indexed by slab row), the id
// (8 bytes), the LRU links (2 x 4 bytes) and the hash map's entry (16-byte
// slot + 1 control byte, at a load factor between 7/16 and 7/8). Bytes()
// counts all of it from the containers' capacities, so bytes per row =
// dim x 4 x (1 + slots) + kRowOverheadBytes at most, plus the slab's growth
// slack (it grows by max(256 rows, 1/8), never past max_rows). A bounded
// table filled to max_rows holds exactly what the memory check counts for it
// (DynamicTableBookkeepingBytes, core/memory_budget.h).
//
// Recency: Touch marks rows most recently used; the row evicted is the least
// recently touched one, never one touched by the same Touch call (a call that
// names more ids than max_rows grows the table past it until the next Touch
// trims it). Counts rows created and evicted.
//
// At most 2^31 - 1 rows per shard. Not thread-safe: the shard calls it under
// its own lock.
#ifndef KUBETRAIN_PS_DYNAMIC_TABLE_H_
#define KUBETRAIN_PS_DYNAMIC_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "ps/optimizer.h"

namespace kubetrain {

class DynamicTable {
 public:
  // Writes the initial value of row `id` (dim floats).
  using InitFn = std::function<void(int64_t id, float* out)>;
  // Upper bound of the bytes per row beside its dim x 4 x (1 + slots):
  // id 8 + LRU links 8 + hash map 17 / (7/16) (the lowest load factor).
  static constexpr int64_t kRowOverheadBytes = 8 + 8 + (17 * 16 + 6) / 7;

  // max_rows 0: unbounded.
  DynamicTable(int64_t dim, int64_t max_rows, InitFn init, std::unique_ptr<RowOptimizer> opt);

  int64_t dim() const { return dim_; }
  int64_t max_rows() const { return max_rows_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  int64_t rows_created() const { return created_; }
  int64_t rows_evicted() const { return evicted_; }
  // Changes whenever a row is created or evicted or the table is imported:
  // List pages taken at one generation list every held row exactly once.
  int64_t generation() const { return generation_; }
  // Bytes held: slab, slots, ids, links and the hash map, by capacity.
  int64_t Bytes() const;

  // The slab rows of `ids` (distinct or not), creating the missing ones
  // (evicting as above) and marking all most recently used.
  std::vector<int64_t> Touch(const std::vector<int64_t>& ids);
  // The same into *rows (resized to ids.size()): a reused vector, so a call
  // that creates no row allocates nothing.
  void Touch(const std::vector<int64_t>& ids, std::vector<int64_t>* rows);
  // Copies the values of `ids` into out (ids.size() x dim): a held row's
  // value, else the initial value (nothing is created, recency unchanged).
  void Read(const std::vector<int64_t>& ids, float* out) const;
  const float* values() const { return values_.data(); }
  float* mutable_values() { return values_.data(); }
  RowOptimizer* optimizer() { return opt_.get(); }

  // The held rows, least recently used first: ids, values (size x dim) and
  // each slot (size x dim), for checkpoints and model files.
  struct Rows {
    std::vector<int64_t> ids;
    std::vector<float> values;
    std::vector<std::vector<float>> slots;
  };
  Rows Export() const;
  // A page of the held rows in increasing id order (values only), for
  // listing a table a page at a time: appends the rows at positions
  // [cursor, cursor + max_rows) of that order to ids/values. Returns the
  // position to go on from, or -1 when no row is left. The order does not
  // depend on how the rows were created, so two tables holding the same rows
  // list the same pages (reproducible model files). While a listing runs
  // (from its first page until one returns -1, or the held rows change) the
  // table keeps its ids sorted: 8 bytes per row, counted in Bytes().
  int64_t List(int64_t cursor, int64_t max_rows, std::vector<int64_t>* ids,
               std::vector<float>* values);
  // Checkpoints read the held rows in place (Shard::StartCheckpoint):
  // slab rows [0, slab_rows()) are indexable (held or free); id_of gives a
  // held row's id; walked from `*tail` through `prev`, the copy CopyRecency
  // makes lists the held rows least recently used first (Export's order).
  int64_t slab_rows() const { return static_cast<int64_t>(ids_.size()); }
  int64_t id_of(int64_t slab_row) const { return ids_[slab_row]; }
  void CopyRecency(std::vector<int32_t>* prev, int32_t* tail) const;
  // Called, under the caller's lock, with a free slab row about to be given
  // to a new id, before its id, value or slots change (copy-on-write).
  void set_before_reuse(std::function<void(int64_t slab_row)> f) { before_reuse_ = std::move(f); }

  // Replaces the contents with `rows` (validated first: distinct ids, sizes,
  // slot count; nothing changes otherwise), recency as Export gave it (so
  // an exported and imported table evicts as the original would). Counters
  // are not changed.
  // Takes the vectors of `rows` over (no copy).
  absl::Status Import(Rows rows);

 private:
  static constexpr int32_t kNone = -1;
  // A new slab row (growing the slab if needed), or an evicted one.
  int64_t NewRow(int64_t touched_in_call);
  void Unlink(int32_t r);
  void PushFront(int32_t r);
  void Grow(int64_t rows);

  const int64_t dim_;
  const int64_t max_rows_;
  const InitFn init_;
  const std::unique_ptr<RowOptimizer> opt_;
  std::vector<float> values_;         // slab rows x dim
  std::vector<int64_t> ids_;          // per slab row
  std::vector<int32_t> prev_, next_;  // LRU list over slab rows (head: most recent)
  std::vector<int32_t> free_;         // slab rows evicted and not reused yet
  int32_t head_ = kNone, tail_ = kNone;
  absl::flat_hash_map<int64_t, int32_t> index_;  // id -> slab row
  int64_t created_ = 0, evicted_ = 0, generation_ = 0;
  // The held ids in increasing order while a listing runs (List), valid for
  // `sorted_generation_`; empty otherwise.
  std::vector<int64_t> sorted_ids_;
  int64_t sorted_generation_ = -1;
  std::function<void(int64_t)> before_reuse_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_DYNAMIC_TABLE_H_
