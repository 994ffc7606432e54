#include "ps/sparse_sum.h"

#include <algorithm>

namespace kubetrain {

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
  // Arrivals are distinct, so the order is total and std::sort (in place,
  // unlike std::stable_sort's buffer) keeps equal ids in arrival order.
  const auto before = [](const Key& a, const Key& b) {
    if (a.table != b.table) return a.table < b.table;
    if (a.id != b.id) return a.id < b.id;
    return a.arrival < b.arrival;
  };
  // One push of a worker's distinct sorted ids (PsClient sends them so) is
  // in order already: async, and sync with one worker.
  if (!std::is_sorted(keys_.begin(), keys_.end(), before)) {
    std::sort(keys_.begin(), keys_.end(), before);
  }
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
