// Shard's checkpoint image: taking a consistent copy of the parameters,
// tables and optimizer slots, and restoring one. ps/checkpoint.h writes it.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ps/shard.h"

namespace kubetrain {

void Shard::RecordCheckpointWrite(const absl::Status& result) {
  absl::MutexLock l(&mu_);
  stats_.checkpoint_failing = !result.ok();
  if (!result.ok()) {
    ++stats_.checkpoint_failures;
    stats_.checkpoint_error = std::string(result.message());
  }
}

ShardCheckpoint Shard::Checkpoint() const {
  absl::MutexLock l(&mu_);
  return CheckpointLocked();
}

std::optional<ShardCheckpoint> Shard::TakePendingCheckpoint(absl::Duration wait) {
  absl::MutexLock l(&mu_);
  if (wait > absl::ZeroDuration()) {
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::optional<ShardCheckpoint>* p) { return p->has_value(); },
                             &pending_checkpoint_),
                         wait);
  }
  std::optional<ShardCheckpoint> c = std::move(pending_checkpoint_);
  pending_checkpoint_.reset();
  return c;
}

ShardCheckpoint Shard::CheckpointLocked() const {
  ShardCheckpoint c;
  c.job_name = options_.job_name;
  c.model_fingerprint = options_.fingerprint;
  c.shard_index = options_.shard_index;
  c.optimizer_type = options_.optimizer_type;
  for (const auto& p : parts_) c.part_names.push_back(p.name);
  c.version = version_;
  c.values = values_;
  for (size_t i = 0; i < parts_.size(); ++i) {
    std::vector<std::vector<float>> slots;
    for (auto* s : optimizer_->Slots(static_cast<int>(i))) slots.push_back(*s);
    c.slots.push_back(std::move(slots));
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (dynamic_[t]) {
      DynamicTable::Rows held = dynamic_[t]->Export();  // least recently used first
      std::vector<float> ids(held.ids.size() * kTableIdFloats);
      for (size_t i = 0; i < held.ids.size(); ++i) {
        EncodeTableId(held.ids[i], ids.data() + i * kTableIdFloats);
      }
      c.part_names.push_back(tables_[t].name + "@ids");
      c.values.push_back(std::move(ids));
      c.slots.emplace_back();
      c.part_names.push_back(tables_[t].name + "@rows");
      c.values.push_back(std::move(held.values));
      c.slots.push_back(std::move(held.slots));
      continue;
    }
    c.part_names.push_back(tables_[t].name + "@rows");
    c.values.push_back(table_values_[t]);
    std::vector<std::vector<float>> slots;
    for (auto* s : row_opts_[t]->Slots()) slots.push_back(*s);
    c.slots.push_back(std::move(slots));
  }
  c.worker_clocks = worker_clock_;
  return c;
}

absl::Status Shard::Restore(const ShardCheckpoint& c) {
  size_t all = parts_.size() + tables_.size();      // the tables' parts come last
  for (const auto& d : dynamic_) all += d ? 1 : 0;  // "@ids" and "@rows"
  if (c.part_names.size() != all || c.values.size() != all || c.slots.size() != all) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint has ", c.part_names.size(), " parts, shard holds ", all));
  }
  absl::MutexLock l(&mu_);
  for (size_t i = 0; i < parts_.size(); ++i) {
    auto slots = optimizer_->Slots(static_cast<int>(i));
    if (c.part_names[i] != parts_[i].name ||
        static_cast<int64_t>(c.values[i].size()) != parts_[i].num_elements() ||
        c.slots[i].size() != slots.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint part ", c.part_names[i], " does not match ", parts_[i].name));
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      if (c.slots[i][k].size() != slots[k]->size()) {
        return absl::FailedPreconditionError(absl::StrCat("checkpoint optimizer slot ", k, " of ",
                                                          parts_[i].name, " has the wrong size"));
      }
    }
  }
  // Dynamic tables' rows as read from the checkpoint, validated by
  // DynamicTable (sizes, slots, distinct ids) before anything is loaded.
  std::vector<std::optional<DynamicTable::Rows>> dynamic_rows(tables_.size());
  for (size_t t = 0, i = parts_.size(); t < tables_.size(); ++t, ++i) {
    if (dynamic_[t]) {
      const std::vector<float>& enc = c.values[i];
      bool ok = c.part_names[i] == tables_[t].name + "@ids" && c.slots[i].empty() &&
                enc.size() % kTableIdFloats == 0 &&
                c.part_names[i + 1] == tables_[t].name + "@rows";
      DynamicTable::Rows rows;
      for (size_t k = 0; ok && k < enc.size(); k += kTableIdFloats) {
        const int64_t id = DecodeTableId(enc.data() + k);
        ok = TableShardOfRow(id, options_.num_shards) == options_.shard_index;
        rows.ids.push_back(id);
      }
      if (!ok) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint parts ", c.part_names[i], ", ", c.part_names[i + 1],
                         " do not match the ids and rows of the dynamic table ", tables_[t].name));
      }
      ++i;
      rows.values = c.values[i];
      rows.slots = c.slots[i];
      if (static_cast<int>(rows.slots.size()) != dynamic_[t]->optimizer()->num_slots() ||
          rows.values.size() != rows.ids.size() * tables_[t].dim) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint part ", c.part_names[i], " does not match the rows of ", tables_[t].name));
      }
      for (const auto& slot : rows.slots) {
        if (slot.size() != rows.values.size()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint optimizer slot of ", c.part_names[i], " has the wrong size"));
        }
      }
      std::set<int64_t> distinct(rows.ids.begin(), rows.ids.end());
      if (distinct.size() != rows.ids.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint part ", c.part_names[i - 1], " repeats an id"));
      }
      dynamic_rows[t] = std::move(rows);
      continue;
    }
    auto slots = row_opts_[t]->Slots();
    bool ok = c.part_names[i] == tables_[t].name + "@rows" &&
              c.values[i].size() == table_values_[t].size() && c.slots[i].size() == slots.size();
    for (size_t k = 0; ok && k < slots.size(); ++k) ok = c.slots[i][k].size() == slots[k]->size();
    if (!ok) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint part ", c.part_names[i], " does not match the rows of ", tables_[t].name));
    }
  }
  // Everything matches: now load.
  for (size_t i = 0; i < parts_.size(); ++i) {
    values_[i] = c.values[i];
    auto slots = optimizer_->Slots(static_cast<int>(i));
    for (size_t k = 0; k < slots.size(); ++k) *slots[k] = c.slots[i][k];
  }
  for (size_t t = 0, i = parts_.size(); t < tables_.size(); ++t, ++i) {
    if (dynamic_[t]) {
      ++i;                                                            // "@ids", then "@rows"
      absl::Status imported = dynamic_[t]->Import(*dynamic_rows[t]);  // validated above
      if (!imported.ok()) return imported;
      continue;
    }
    table_values_[t] = c.values[i];
    auto slots = row_opts_[t]->Slots();
    for (size_t k = 0; k < slots.size(); ++k) *slots[k] = c.slots[i][k];
  }
  for (const auto& [worker, clock] : c.worker_clocks) {
    if (worker_clock_.count(worker)) worker_clock_[worker] = clock;
  }
  SetVersionLocked(c.version);
  snapshot_version_ = -1;
  stats_.restored_version = c.version;
  return absl::OkStatus();
}

}  // namespace kubetrain
