#include "ps/sparse_sum.h"

#include <algorithm>

namespace kubetrain {
bool SparseRowSum::Before(const Key& a, const Key& b) {
  if (a.table != b.table) return a.table < b.table;
  if (a.id != b.id) return a.id < b.id;
  return a.arrival < b.arrival;
}

void SparseRowSum::SortKeys() {
  // A natural merge sort: the keys are cut into their ascending runs, and
  // neighbouring runs are merged into tmp_ (reused; std::stable_sort and
  // std::inplace_merge would take a buffer every call) until one is left.
  // A worker sends each table's ids distinct and sorted, tables in order
  // (PsClient), so a push is one run: one push (async, or sync with one
  // worker) costs one pass over the keys, w workers log2(w) merges.
  runs_.clear();
  runs_.reserve(keys_.size() + 1);  // at most one run per key, whatever the order
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (i == 0 || Before(keys_[i], keys_[i - 1])) runs_.push_back(i);
  }
  runs_.push_back(keys_.size());  // runs_: the starts, then the end
  while (runs_.size() > 2) {
    tmp_.resize(keys_.size());
    const size_t starts = runs_.size() - 1;
    size_t merged = 0;
    for (size_t r = 0; r < starts; r += 2) {
      // Runs r and r + 1 (none past the last: a lone run is copied).
      const size_t a = runs_[r], m = runs_[r + 1], b = r + 2 <= starts ? runs_[r + 2] : m;
      std::merge(keys_.begin() + a, keys_.begin() + m, keys_.begin() + m, keys_.begin() + b,
                 tmp_.begin() + a, Before);
      runs_[merged++] = a;  // read already: later iterations read from r + 2 on
    }
    runs_[merged++] = keys_.size();
    runs_.resize(merged);
    keys_.swap(tmp_);
  }
}

absl::Span<const SparseGrad> SparseRowSum::Sum(
    absl::Span<const std::vector<SparseGrad>* const> pushes, absl::Span<const int64_t> dims,
    double n) {
  keys_.clear();
  rows_.clear();
  for (const std::vector<SparseGrad>* push : pushes) {
    for (const SparseGrad& g : *push) {
      const int64_t dim = dims[g.table];
      for (size_t i = 0; i < g.ids.size(); ++i) {
        keys_.push_back(
            {static_cast<uint32_t>(g.table), static_cast<uint32_t>(rows_.size()), g.ids[i]});
        rows_.push_back(g.rows.data() + i * dim);
      }
    }
  }
  SortKeys();
  used_ = 0;
  for (size_t at = 0; at < keys_.size();) {
    const uint32_t table = keys_[at].table;
    size_t end = at;
    while (end < keys_.size() && keys_[end].table == table) ++end;
    const int64_t dim = dims[table];
    if (used_ == out_.size()) out_.emplace_back();
    SparseGrad& out = out_[used_++];
    out.table = static_cast<int>(table);
    out.ids.clear();
    out.rows.clear();
    // At most one id per row: the capacity of the step with the most rows,
    // whatever the share of duplicates.
    out.ids.reserve(end - at);
    out.rows.reserve((end - at) * dim);
    acc_.resize(dim);
    for (size_t i = at; i < end;) {
      const int64_t id = keys_[i].id;
      std::fill(acc_.begin(), acc_.end(), 0.0);
      for (; i < end && keys_[i].id == id; ++i) {
        const float* row = rows_[keys_[i].arrival];
        for (int64_t k = 0; k < dim; ++k) acc_[k] += row[k];
      }
      out.ids.push_back(id);
      for (int64_t k = 0; k < dim; ++k) out.rows.push_back(static_cast<float>(acc_[k] / n));
    }
    at = end;
  }
  return absl::MakeConstSpan(out_.data(), used_);
}

}  // namespace kubetrain
