#include "ps/dynamic_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kubetrain {

DynamicTable::DynamicTable(int64_t dim, int64_t max_rows, InitFn init,
                           std::unique_ptr<RowOptimizer> opt)
    : dim_(dim), max_rows_(max_rows), init_(std::move(init)), opt_(std::move(opt)) {}

int64_t DynamicTable::Bytes() const {
  int64_t floats = static_cast<int64_t>(values_.capacity());
  for (const std::vector<float>* s : const_cast<RowOptimizer*>(opt_.get())->Slots()) {
    floats += static_cast<int64_t>(s->capacity());
  }
  const int64_t slot_bytes = sizeof(std::pair<const int64_t, int32_t>) + 1;  // + control byte
  return floats * 4 + static_cast<int64_t>(ids_.capacity() * sizeof(int64_t)) +
         static_cast<int64_t>((prev_.capacity() + next_.capacity()) * sizeof(int32_t)) +
         static_cast<int64_t>(free_.capacity() * sizeof(int32_t)) +
         static_cast<int64_t>(sorted_ids_.capacity() * sizeof(int64_t)) +
         static_cast<int64_t>(index_.capacity()) * slot_bytes;
}

void DynamicTable::Unlink(int32_t r) {
  if (prev_[r] != kNone) next_[prev_[r]] = next_[r];
  if (next_[r] != kNone) prev_[next_[r]] = prev_[r];
  if (head_ == r) head_ = next_[r];
  if (tail_ == r) tail_ = prev_[r];
  prev_[r] = next_[r] = kNone;
}

void DynamicTable::PushFront(int32_t r) {
  prev_[r] = kNone;
  next_[r] = head_;
  if (head_ != kNone) prev_[head_] = r;
  head_ = r;
  if (tail_ == kNone) tail_ = r;
}

void DynamicTable::Grow(int64_t rows) {
  const int64_t cap = static_cast<int64_t>(ids_.capacity());
  if (rows > cap) {
    int64_t next = cap + std::max<int64_t>(256, cap / 8);
    if (max_rows_ > 0) next = std::min(next, max_rows_);
    next = std::max(next, rows);
    values_.reserve(next * dim_);
    ids_.reserve(next);
    prev_.reserve(next);
    next_.reserve(next);
    opt_->Resize(rows, next);
  } else {
    opt_->Resize(rows, cap);
  }
  values_.resize(rows * dim_);
  ids_.resize(rows);
  prev_.resize(rows, kNone);
  next_.resize(rows, kNone);
}

int64_t DynamicTable::NewRow(int64_t touched_in_call) {
  // Evict while full: the tail is not a row of this call as long as more
  // rows are held than the call touched (touched_in_call counts repeats,
  // so it errs on the side of keeping).
  while (max_rows_ > 0 && size() >= max_rows_ && size() > touched_in_call) {
    const int32_t victim = tail_;
    Unlink(victim);
    index_.erase(ids_[victim]);
    free_.push_back(victim);
    ++evicted_;
    ++generation_;
  }
  int64_t r;
  if (!free_.empty()) {
    r = free_.back();
    free_.pop_back();
    if (before_reuse_) before_reuse_(r);
    opt_->ResetRow(r);
  } else {
    r = static_cast<int64_t>(ids_.size());
    Grow(r + 1);
  }
  return r;
}

std::vector<int64_t> DynamicTable::Touch(const std::vector<int64_t>& ids) {
  std::vector<int64_t> rows;
  Touch(ids, &rows);
  return rows;
}

void DynamicTable::Touch(const std::vector<int64_t>& ids, std::vector<int64_t>* out) {
  std::vector<int64_t>& rows = *out;
  rows.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = index_.find(ids[i]);
    int64_t r;
    if (it != index_.end()) {
      r = it->second;
      Unlink(static_cast<int32_t>(r));
    } else {
      r = NewRow(static_cast<int64_t>(i));
      ids_[r] = ids[i];
      init_(ids[i], values_.data() + r * dim_);
      index_.emplace(ids[i], static_cast<int32_t>(r));
      ++created_;
      ++generation_;
    }
    PushFront(static_cast<int32_t>(r));
    rows[i] = r;
  }
}

void DynamicTable::Read(const std::vector<int64_t>& ids, float* out) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = index_.find(ids[i]);
    if (it != index_.end()) {
      std::copy_n(values_.data() + it->second * dim_, dim_, out + i * dim_);
    } else {
      init_(ids[i], out + i * dim_);
    }
  }
}

void DynamicTable::CopyRecency(std::vector<int32_t>* prev, int32_t* tail) const {
  *prev = prev_;
  *tail = tail_;
}

DynamicTable::Rows DynamicTable::Export() const {
  Rows out;
  auto slots = const_cast<RowOptimizer*>(opt_.get())->Slots();
  out.slots.resize(slots.size());
  out.ids.reserve(index_.size());
  out.values.reserve(index_.size() * dim_);
  for (auto& s : out.slots) s.reserve(index_.size() * dim_);
  for (int32_t r = tail_; r != kNone; r = prev_[r]) {  // least recently used first
    out.ids.push_back(ids_[r]);
    out.values.insert(out.values.end(), values_.begin() + r * dim_,
                      values_.begin() + (r + 1) * dim_);
    for (size_t k = 0; k < slots.size(); ++k) {
      out.slots[k].insert(out.slots[k].end(), slots[k]->begin() + r * dim_,
                          slots[k]->begin() + (r + 1) * dim_);
    }
  }
  return out;
}

absl::Status DynamicTable::Import(Rows rows) {
  const size_t n = rows.ids.size();
  if (rows.values.size() != n * dim_) {
    return absl::FailedPreconditionError(absl::StrCat(rows.values.size(), " values for ", n,
                                                      " rows of dim ", dim_, " (expected ",
                                                      n * dim_, ")"));
  }
  if (static_cast<int>(rows.slots.size()) != opt_->num_slots()) {
    return absl::FailedPreconditionError(absl::StrCat(rows.slots.size(), " optimizer slots, the ",
                                                      "table's optimizer has ", opt_->num_slots()));
  }
  for (const auto& s : rows.slots) {
    if (s.size() != n * dim_) {
      return absl::FailedPreconditionError("an optimizer slot has the wrong size");
    }
  }
  absl::flat_hash_map<int64_t, int32_t> index;
  index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!index.emplace(rows.ids[i], static_cast<int32_t>(i)).second) {
      return absl::FailedPreconditionError(absl::StrCat("id ", rows.ids[i], " appears twice"));
    }
  }
  // Slab row i is the i-th row of `rows`; the vectors are taken over, so a
  // restore holds the table once, not twice.
  index_ = std::move(index);
  ids_ = std::move(rows.ids);
  values_ = std::move(rows.values);
  auto slots = opt_->Slots();
  for (size_t k = 0; k < slots.size(); ++k) *slots[k] = std::move(rows.slots[k]);
  opt_->Resize(static_cast<int64_t>(n), static_cast<int64_t>(n));
  prev_.assign(n, kNone);
  next_.assign(n, kNone);
  free_.clear();
  head_ = tail_ = kNone;
  for (size_t i = 0; i < n; ++i) PushFront(static_cast<int32_t>(i));  // the last: most recent
  ++generation_;
  return absl::OkStatus();
}

int64_t DynamicTable::List(int64_t cursor, int64_t max_rows, std::vector<int64_t>* ids,
                           std::vector<float>* values) {
  if (max_rows <= 0) return std::max<int64_t>(0, cursor);
  if (sorted_generation_ != generation_) {
    sorted_ids_.clear();
    sorted_ids_.reserve(index_.size());
    for (const auto& [id, row] : index_) sorted_ids_.push_back(id);
    std::sort(sorted_ids_.begin(), sorted_ids_.end());
    sorted_generation_ = generation_;
  }
  const int64_t held = static_cast<int64_t>(sorted_ids_.size());
  int64_t p = std::max<int64_t>(0, cursor);
  for (const int64_t end = std::min(held, p + max_rows); p < end; ++p) {
    const int64_t r = index_.find(sorted_ids_[p])->second;
    ids->push_back(sorted_ids_[p]);
    values->insert(values->end(), values_.begin() + r * dim_, values_.begin() + (r + 1) * dim_);
  }
  if (p < held) return p;
  // The listing is over: the sorted ids are not kept.
  std::vector<int64_t>().swap(sorted_ids_);
  sorted_generation_ = -1;
  return -1;
}

}  // namespace kubetrain
