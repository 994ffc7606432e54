// Placement of model variables on PS tasks.
//
// Variables larger than `split_threshold_bytes` are split by rows into
// min(num_shards, rows) near-equal parts named "<variable>/part<k>"; the units
// (whole variables and parts) then go greedily to PS tasks by byte size:
// largest first (ties by name), each onto the least-loaded task (ties by the
// lower index). Deterministic: every task computes the same placement from
// the same model and PS count, and the fingerprint lets them check it.
#ifndef KUBETRAIN_CORE_PLACEMENT_H_
#define KUBETRAIN_CORE_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/model.h"

namespace kubetrain {

struct PartPlacement {
  std::string name;       // "dense0/kernel" or "dense0/kernel/part1"
  int variable = 0;       // index into Model::variables()
  int64_t row_begin = 0;  // rows [row_begin, row_end) of the variable
  int64_t row_end = 0;
  int64_t cols = 0;
  int shard = 0;
  int64_t num_elements() const { return (row_end - row_begin) * cols; }
  int64_t num_bytes() const { return num_elements() * 4; }
  // Element offset of this part within the variable's row-major buffer.
  int64_t element_offset() const { return row_begin * cols; }
};

// An embedding table (VariableSpec::table) is never a part: row r lives on
// PS task r mod num_shards, as local row r / num_shards there (TensorFlow's
// "mod" partition strategy), whatever splitThresholdBytes is, so every task
// holds ~1/num_shards of every table and ids hashed into buckets spread
// evenly.
struct TablePlacement {
  std::string name;
  int variable = 0;  // index into Model::variables()
  int64_t rows = 0;
  int64_t dim = 0;
  bool wide = false;
  // A dynamic table (VariableSpec::dynamic): rows 0, ids any 64-bit value,
  // at most max_rows rows over all shards (0: no bound).
  bool dynamic = false;
  int64_t max_rows = 0;
  // Rows of the table held by `shard` of `num_shards` (fixed tables).
  int64_t LocalRows(int shard, int num_shards) const {
    return rows > shard ? (rows - shard + num_shards - 1) / num_shards : 0;
  }
  // A dynamic table's bound per shard: ceil(max_rows / num_shards), 0: none.
  int64_t MaxRowsPerShard(int num_shards) const {
    return max_rows > 0 ? (max_rows + num_shards - 1) / num_shards : 0;
  }
  // The rows `shard` holds at most: a fixed table's LocalRows, a dynamic
  // table's MaxRowsPerShard (0 for an unbounded one: not known ahead).
  int64_t ShardRows(int shard, int num_shards) const {
    return dynamic ? MaxRowsPerShard(num_shards) : LocalRows(shard, num_shards);
  }
};
// The shard of a row: its id mod num_shards, the id taken as an unsigned
// 64-bit value (a dynamic table's hashed ids use the whole range).
inline int TableShardOfRow(int64_t row, int num_shards) {
  return static_cast<int>(static_cast<uint64_t>(row) % static_cast<uint64_t>(num_shards));
}
inline int64_t TableLocalRow(int64_t row, int num_shards) { return row / num_shards; }

// A 64-bit table id as kTableIdFloats float32 values, each an integer below
// 2^22 and so exact in float32 whatever copies them: bits 0-21, 22-42 and
// 43-63. PS checkpoints store a dynamic table's ids so.
constexpr int kTableIdFloats = 3;
inline void EncodeTableId(int64_t id, float* out) {
  const auto u = static_cast<uint64_t>(id);
  out[0] = static_cast<float>(u & 0x3fffff);
  out[1] = static_cast<float>((u >> 22) & 0x1fffff);
  out[2] = static_cast<float>(u >> 43);
}
inline int64_t DecodeTableId(const float* in) {
  return static_cast<int64_t>(static_cast<uint64_t>(in[0]) | (static_cast<uint64_t>(in[1]) << 22) |
                              (static_cast<uint64_t>(in[2]) << 43));
}

struct Placement {
  int num_shards = 0;
  std::vector<PartPlacement> parts;    // sorted by (shard, name)
  std::vector<TablePlacement> tables;  // in variable order, on every shard

  std::vector<const PartPlacement*> PartsOfShard(int shard) const&;
  // The pointers would dangle: keep the Placement in a variable first.
  std::vector<const PartPlacement*> PartsOfShard(int shard) const&& = delete;
  // Bytes of values `shard` holds: its parts, its rows of the fixed tables
  // and each bounded dynamic table's maxRows share.
  int64_t ShardBytes(int shard) const;
  // A hash of model variables, part boundaries and assignment.
  std::string Fingerprint() const;
  // One line per shard, for the start-up log.
  std::string Describe() const;
};

Placement PlaceVariables(const std::vector<VariableSpec>& variables, int num_shards,
                         int64_t split_threshold_bytes);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_PLACEMENT_H_
