#include "core/placement.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kubetrain {

Placement PlaceVariables(const std::vector<VariableSpec>& variables, int num_shards,
                         int64_t split_threshold_bytes) {
  Placement placement;
  placement.num_shards = num_shards;
  std::vector<PartPlacement> units;
  for (int v = 0; v < static_cast<int>(variables.size()); ++v) {
    const VariableSpec& var = variables[v];
    if (var.table) {
      placement.tables.push_back(
          {var.name, v, var.rows, var.cols, var.wide, var.dynamic, var.max_rows});
      continue;
    }
    int64_t pieces = 1;
    if (var.num_bytes() > split_threshold_bytes && num_shards > 1) {
      pieces = std::min<int64_t>(num_shards, var.rows);
    }
    for (int64_t k = 0; k < pieces; ++k) {
      PartPlacement p;
      p.variable = v;
      p.cols = var.cols;
      p.row_begin = var.rows * k / pieces;
      p.row_end = var.rows * (k + 1) / pieces;
      p.name = pieces == 1 ? var.name : absl::StrCat(var.name, "/part", k);
      units.push_back(p);
    }
  }
  std::sort(units.begin(), units.end(), [](const PartPlacement& a, const PartPlacement& b) {
    if (a.num_bytes() != b.num_bytes()) return a.num_bytes() > b.num_bytes();
    return a.name < b.name;
  });
  std::vector<int64_t> load(num_shards, 0);
  for (auto& u : units) {
    int best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    u.shard = best;
    load[best] += u.num_bytes();
  }
  std::sort(units.begin(), units.end(), [](const PartPlacement& a, const PartPlacement& b) {
    if (a.shard != b.shard) return a.shard < b.shard;
    return a.name < b.name;
  });
  placement.parts = std::move(units);
  return placement;
}

std::vector<const PartPlacement*> Placement::PartsOfShard(int shard) const& {
  std::vector<const PartPlacement*> out;
  for (const auto& p : parts) {
    if (p.shard == shard) out.push_back(&p);
  }
  return out;
}

int64_t Placement::ShardBytes(int shard) const {
  int64_t total = 0;
  for (const auto* p : PartsOfShard(shard)) total += p->num_bytes();
  for (const auto& t : tables) total += t.ShardRows(shard, num_shards) * t.dim * 4;
  return total;
}

std::string Placement::Fingerprint() const {
  // FNV-1a over a canonical description: stable across processes and builds.
  std::string canon = absl::StrCat(num_shards, ";");
  for (const auto& p : parts) {
    absl::StrAppend(&canon, p.name, ",", p.variable, ",", p.row_begin, ",", p.row_end, ",", p.cols,
                    ",", p.shard, ";");
  }
  for (const auto& t : tables) {  // none: the fingerprints of dense-only models are unchanged
    absl::StrAppend(&canon, "table:", t.name, ",", t.variable, ",", t.rows, ",", t.dim, ",", t.wide,
                    ";");
    if (t.dynamic) absl::StrAppend(&canon, "dynamic:", t.max_rows, ";");
  }
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : canon) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string Placement::Describe() const {
  std::string out;
  for (int s = 0; s < num_shards; ++s) {
    absl::StrAppend(&out, "ps:", s, " holds ", ShardBytes(s), " bytes:");
    for (const auto* p : PartsOfShard(s)) {
      absl::StrAppend(&out, " ", p->name, "[", p->row_end - p->row_begin, "x", p->cols, "]");
    }
    for (const auto& t : tables) {
      if (t.dynamic) {
        absl::StrAppend(&out, " ", t.name, "[dynamic x", t.dim,
                        t.max_rows > 0
                            ? absl::StrCat(", at most ", t.MaxRowsPerShard(num_shards), " rows")
                            : std::string(),
                        "]");
        continue;
      }
      absl::StrAppend(&out, " ", t.name, "[", t.LocalRows(s, num_shards), " of ", t.rows, "x",
                      t.dim, " rows]");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace kubetrain
