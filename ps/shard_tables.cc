// Shard's embedding tables: row pulls, listing, sparse gradient checks and
// aggregation. Their state and locking are declared in ps/shard.h.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ps/shard.h"

namespace kubetrain {
namespace {

// INVALID_ARGUMENT unless every id is a row of `table` held by `shard`.
absl::Status CheckIds(const TablePlacement& table, int shard, int num_shards,
                      const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    if (!table.dynamic && (id < 0 || id >= table.rows)) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", table.name, ": id ", id, " out of range [0, ", table.rows, ")"));
    }
    if (TableShardOfRow(id, num_shards) != shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", table.name, ": id ", id, " lives on ps:", TableShardOfRow(id, num_shards),
          " (id mod ", num_shards, (table.dynamic ? ", unsigned" : ""), "), not on ps:", shard));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int Shard::TableIndex(const std::string& name) const {
  for (size_t i = 0; i < tables_.size(); ++i) {
    if (tables_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int64_t> Shard::TableBytes() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> bytes(tables_.size());
  for (size_t i = 0; i < tables_.size(); ++i) {
    if (dynamic_[i]) {
      bytes[i] = dynamic_[i]->Bytes();
      continue;
    }
    int64_t floats = static_cast<int64_t>(table_values_[i].size());
    for (const std::vector<float>* slot : row_opts_[i]->Slots()) {
      floats += static_cast<int64_t>(slot->size());
    }
    bytes[i] = floats * 4;
  }
  return bytes;
}

std::vector<Shard::TableCounts> Shard::TableRowCounts() const {
  absl::MutexLock lock(&mu_);
  std::vector<TableCounts> out(tables_.size());
  for (size_t i = 0; i < tables_.size(); ++i) {
    if (dynamic_[i]) {
      out[i] = {dynamic_[i]->size(), dynamic_[i]->rows_created(), dynamic_[i]->rows_evicted()};
    } else {
      out[i].rows = table_local_rows_[i];
    }
  }
  return out;
}

absl::StatusOr<Shard::RowsResult> Shard::PullRows(
    const TaskId& task, const std::vector<std::pair<int, std::vector<int64_t>>>& ids,
    bool read_only) {
  if (absl::Status valid = CheckTask(task); !valid.ok()) return valid;
  for (const auto& [t, list] : ids) {
    if (t < 0 || t >= static_cast<int>(tables_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("unknown table index ", t));
    }
    if (absl::Status s = CheckIds(tables_[t], options_.shard_index, options_.num_shards, list);
        !s.ok()) {
      return s;
    }
  }
  RowsResult r;
  absl::MutexLock l(&mu_);
  if (task.role == TaskRole::kWorker) last_seen_[task.index] = clock_->Now();
  r.version = version_;
  r.incarnation = options_.incarnation;
  const bool trains = task.role == TaskRole::kWorker && !read_only && !Done();
  for (const auto& [t, list] : ids) {
    const int64_t dim = tables_[t].dim;
    std::vector<float> rows(list.size() * dim);
    if (DynamicTable* d = dynamic_[t].get()) {
      if (trains) {
        const std::vector<int64_t> held = d->Touch(list);  // creates the missing rows
        for (size_t i = 0; i < list.size(); ++i) {
          std::copy_n(d->values() + held[i] * dim, dim, rows.data() + i * dim);
        }
      } else {
        d->Read(list, rows.data());  // readers create nothing
      }
      r.rows.push_back(std::move(rows));
      continue;
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const int64_t local = TableLocalRow(list[i], options_.num_shards);
      std::copy_n(table_values_[t].data() + local * dim, dim, rows.data() + i * dim);
    }
    r.rows.push_back(std::move(rows));
  }
  return r;
}

absl::StatusOr<Shard::RowsPage> Shard::ListRows(const TaskId& task, int table, int64_t cursor,
                                                int64_t max_rows) {
  if (absl::Status valid = CheckTask(task); !valid.ok()) return valid;
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown table index ", table));
  }
  if (cursor < 0 || max_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("list rows of ", tables_[table].name,
                                                   ": cursor ", cursor, ", max_rows ", max_rows,
                                                   " (both must be >= 0)"));
  }
  absl::MutexLock l(&mu_);
  DynamicTable* d = dynamic_[table].get();
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("table ", tables_[table].name,
                                                   " is not dynamic: pull its rows by id (0..",
                                                   tables_[table].rows - 1, ")"));
  }
  RowsPage page;
  page.version = version_;
  page.incarnation = options_.incarnation;
  page.total_rows = d->size();
  page.generation = d->generation();
  if (max_rows > 0) {
    page.next_cursor = d->List(cursor, max_rows, &page.ids, &page.values);
    page.done = page.next_cursor < 0;
    if (page.done) page.next_cursor = 0;
  } else {
    page.next_cursor = cursor;
  }
  return page;
}

absl::Status Shard::ValidateSparse(const std::vector<SparseGrad>& sparse) const {
  for (const SparseGrad& g : sparse) {
    if (g.table < 0 || g.table >= static_cast<int>(tables_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("unknown table index ", g.table));
    }
    const TablePlacement& t = tables_[g.table];
    if (absl::Status s = CheckIds(t, options_.shard_index, options_.num_shards, g.ids); !s.ok()) {
      return s;
    }
    if (g.rows.size() != g.ids.size() * t.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient rows of table ", t.name, ": ", g.rows.size(), " values for ", g.ids.size(),
          " ids of dim ", t.dim, " (expected ", g.ids.size() * t.dim, ")"));
    }
    Eigen::Map<const Eigen::ArrayXf> v(g.rows.data(), static_cast<Eigen::Index>(g.rows.size()));
    if (!((v - v) == (v - v)).all()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient rows of table ", t.name, " have a non-finite value"));
    }
  }
  return absl::OkStatus();
}

bool Shard::StageSparseLocked(absl::Span<const SparseGrad> sparse, int64_t step) {
  // Per sparse entry: its local rows and their staged values (buffers of
  // earlier steps, so a step of the same size allocates nothing).
  if (sparse_local_.size() < sparse.size()) {
    sparse_local_.resize(sparse.size());
    sparse_staged_.resize(sparse.size());
  }
  std::vector<std::vector<int64_t>>& local = sparse_local_;
  std::vector<std::vector<float>>& staged_rows = sparse_staged_;
  bool finite = true;
  for (size_t j = 0; j < sparse.size() && finite; ++j) {
    const SparseGrad& g = sparse[j];
    // SparseRowSum leaves room in ids for the rows of its largest step, before
    // duplicates were merged: reserving that much, a step with more distinct
    // ids than any before but no more rows allocates nothing either.
    const size_t room = std::max(g.ids.size(), g.ids.capacity());
    const int64_t dim = tables_[g.table].dim;
    local[j].reserve(room);
    staged_rows[j].reserve(room * dim);
    DynamicTable* d = dynamic_[g.table].get();
    RowOptimizer* opt = d ? d->optimizer() : row_opts_[g.table].get();
    opt->Reserve(static_cast<int64_t>(room));
    staged_rows[j].resize(g.rows.size());
    if (d) {
      // Rows evicted since the pull come back at their initial value (creating
      // a row may allocate: the slab, the slots and the hash map grow).
      d->Touch(g.ids, &local[j]);
      finite = opt->Stage(d->values(), local[j], g.rows.data(), step, staged_rows[j].data());
      continue;
    }
    local[j].resize(g.ids.size());
    for (size_t i = 0; i < g.ids.size(); ++i) {
      local[j][i] = TableLocalRow(g.ids[i], options_.num_shards);
    }
    finite = opt->Stage(table_values_[g.table].data(), local[j], g.rows.data(), step,
                        staged_rows[j].data());
    // A table appears once in `sparse`, so its staged slots are still these at commit.
  }
  return finite;
}

void Shard::CommitSparseLocked(absl::Span<const SparseGrad> sparse) {
  std::vector<std::vector<int64_t>>& local = sparse_local_;
  std::vector<std::vector<float>>& staged_rows = sparse_staged_;
  for (size_t j = 0; j < sparse.size(); ++j) {
    const int t = sparse[j].table;
    const int64_t dim = tables_[t].dim;
    DynamicTable* d = dynamic_[t].get();
    float* values = d ? d->mutable_values() : table_values_[t].data();
    SaveRowsLocked(t, local[j]);  // an open checkpoint keeps these rows as they were
    for (size_t i = 0; i < local[j].size(); ++i) {
      std::copy_n(staged_rows[j].data() + i * dim, dim, values + local[j][i] * dim);
    }
    (d ? d->optimizer() : row_opts_[t].get())->Commit(local[j]);
  }
}

std::vector<Shard::SparseGrad> Shard::TakePooledSparse() {
  absl::MutexLock l(&pool_mu_);
  if (sparse_pool_.empty()) return {};
  auto sparse = std::move(sparse_pool_.back());
  sparse_pool_.pop_back();
  return sparse;
}

void Shard::ReleaseSparse(std::vector<SparseGrad> sparse) {
  if (sparse.capacity() == 0) return;  // nothing worth keeping
  absl::MutexLock l(&pool_mu_);
  // As for the gradient buffers: one set per worker in flight is enough.
  if (static_cast<int>(sparse_pool_.size()) >= options_.num_workers + 1) return;
  sparse_pool_.push_back(std::move(sparse));
}

absl::Span<const Shard::SparseGrad> Shard::AggregateSparseLocked(
    absl::Span<const std::vector<SparseGrad>* const> pushes, double n) {
  return sparse_sum_.Sum(pushes, table_dims_, n);
}

}  // namespace kubetrain
