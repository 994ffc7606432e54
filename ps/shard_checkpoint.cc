// Shard's checkpoints: opening one (a copy of the fields and dense parts),
// keeping the table rows it holds as they were (copy-on-write), reading it
// for ps/checkpoint.h's writer, and restoring one.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
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

// The image of an open checkpoint, read by the writer: fields and dense parts
// from the copy taken when it was opened, table rows from the shard
// (Shard::ReadCheckpointRows) in the order the file holds them.
class ShardImage : public CheckpointSource {
 public:
  struct Table {
    int64_t dim = 0;
    int slots = 0;
    bool dynamic = false;
    int64_t rows = 0;  // rows the file lists: local rows, or the held rows
    // Dynamic tables: the recency list when it was opened, and the slab rows
    // least recently used first (walked from it on the first read).
    std::vector<int32_t> prev;
    int32_t tail = -1;
    std::vector<int64_t> order;
  };
  // Per part after the dense ones: its table, and whether it is "@ids".
  struct TablePart {
    int table = 0;
    bool ids = false;
  };

  ShardImage(Shard* shard, std::shared_ptr<const ShardCheckpoint> fixed, std::vector<Table> tables,
             std::vector<TablePart> table_parts)
      : shard_(shard),
        fixed_(std::move(fixed)),
        dense_parts_(fixed_->values.size()),
        tables_(std::move(tables)),
        table_parts_(std::move(table_parts)) {}
  ~ShardImage() override { shard_->CloseCheckpoint(); }

  const ShardCheckpoint& fields() const override { return *fixed_; }
  int NumSlots(size_t part) const override {
    if (part < dense_parts_) return static_cast<int>(fixed_->slots[part].size());
    const TablePart& tp = table_parts_[part - dense_parts_];
    return tp.ids ? 0 : tables_[tp.table].slots;
  }
  int64_t Granule(size_t part) const override {
    if (part < dense_parts_) return 1;
    const TablePart& tp = table_parts_[part - dense_parts_];
    return tp.ids ? kTableIdFloats : tables_[tp.table].dim;
  }
  int64_t NumFloats(size_t part, int slot) const override {
    if (part < dense_parts_) {
      const auto& v = slot < 0 ? fixed_->values[part] : fixed_->slots[part][slot];
      return static_cast<int64_t>(v.size());
    }
    const TablePart& tp = table_parts_[part - dense_parts_];
    return tables_[tp.table].rows * Granule(part);
  }
  void Read(size_t part, int slot, int64_t begin, int64_t n, float* out) override {
    if (part < dense_parts_) {
      const auto& v = slot < 0 ? fixed_->values[part] : fixed_->slots[part][slot];
      std::copy_n(v.data() + begin, n, out);
      return;
    }
    const TablePart& tp = table_parts_[part - dense_parts_];
    Table& t = tables_[tp.table];
    const int64_t granule = Granule(part);
    const int64_t first = begin / granule, count = n / granule;
    if (t.dynamic) {
      if (static_cast<int64_t>(t.order.size()) != t.rows) WalkRecency(t);
      shard_->ReadCheckpointRows(tp.table, tp.ids ? Shard::kIdSlot : slot, t.order.data() + first,
                                 count, out);
      return;
    }
    rows_.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) rows_[i] = first + i;
    shard_->ReadCheckpointRows(tp.table, slot, rows_.data(), count, out);
  }

 private:
  // Outside the shard's lock: the list was copied when the checkpoint opened.
  static void WalkRecency(Table& t) {
    t.order.clear();
    t.order.reserve(static_cast<size_t>(t.rows));
    for (int32_t r = t.tail; r >= 0; r = t.prev[r]) t.order.push_back(r);
    std::vector<int32_t>().swap(t.prev);
  }

  Shard* const shard_;
  const std::shared_ptr<const ShardCheckpoint> fixed_;
  const size_t dense_parts_;
  std::vector<Table> tables_;
  const std::vector<TablePart> table_parts_;
  std::vector<int64_t> rows_;  // scratch: the rows of one read of a fixed table
};

std::unique_ptr<CheckpointSource> Shard::StartCheckpoint() {
  absl::MutexLock l(&mu_);
  if (written_checkpoint_) return nullptr;
  pending_checkpoint_.reset();  // superseded by the current state
  return HandOutLocked(OpenCheckpointLocked());
}

ShardCheckpoint Shard::Checkpoint() {
  std::unique_ptr<CheckpointSource> image;
  {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](std::unique_ptr<OpenCheckpoint>* written) { return *written == nullptr; },
        &written_checkpoint_));
    image = HandOutLocked(OpenCheckpointLocked());  // a boundary's pending one stays pending
  }
  return ReadAllOf(*image);
}

std::unique_ptr<CheckpointSource> Shard::TakePendingCheckpoint(absl::Duration wait) {
  absl::MutexLock l(&mu_);
  struct Open {
    std::unique_ptr<OpenCheckpoint>* written;
    std::unique_ptr<OpenCheckpoint>* pending;
  } open{&written_checkpoint_, &pending_checkpoint_};
  const auto ready = +[](Open* o) { return *o->pending != nullptr && *o->written == nullptr; };
  if (wait > absl::ZeroDuration()) mu_.AwaitWithTimeout(absl::Condition(ready, &open), wait);
  if (!ready(&open)) return nullptr;
  return HandOutLocked(std::move(pending_checkpoint_));
}

std::unique_ptr<Shard::OpenCheckpoint> Shard::OpenCheckpointLocked() {
  auto fixed = std::make_shared<ShardCheckpoint>();
  ShardCheckpoint& c = *fixed;
  c.job_name = options_.job_name;
  c.model_fingerprint = options_.fingerprint;
  c.shard_index = options_.shard_index;
  c.optimizer_type = options_.optimizer_type;
  c.version = version_;
  for (size_t i = 0; i < parts_.size(); ++i) {
    c.part_names.push_back(parts_[i].name);
    const float* v = PartValues(*values_, i);
    c.values.emplace_back(v, v + parts_[i].num_elements());
    std::vector<std::vector<float>> slots;
    for (auto* s : optimizer_->Slots(static_cast<int>(i))) slots.push_back(*s);
    c.slots.push_back(std::move(slots));
  }
  auto open = std::make_unique<OpenCheckpoint>();
  open->tables.resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    OpenCheckpoint::Table& table = open->tables[t];
    const int64_t dim = tables_[t].dim;
    if (DynamicTable* d = dynamic_[t].get()) {
      c.part_names.push_back(tables_[t].name + "@ids");
      table.rows = d->slab_rows();
      table.row_floats = dim * (1 + d->optimizer()->num_slots()) + 2;
      table.held = d->size();
      d->CopyRecency(&table.prev, &table.tail);
    } else {
      table.rows = table_local_rows_[t];
      table.row_floats = dim * (1 + row_opts_[t]->num_slots());
    }
    c.part_names.push_back(tables_[t].name + "@rows");
  }
  c.worker_clocks = worker_clock_;
  open->fixed = std::move(fixed);
  return open;
}

std::unique_ptr<CheckpointSource> Shard::HandOutLocked(std::unique_ptr<OpenCheckpoint> handed) {
  written_checkpoint_ = std::move(handed);
  OpenCheckpoint& open = *written_checkpoint_;
  std::vector<ShardImage::Table> tables(tables_.size());
  std::vector<ShardImage::TablePart> table_parts;
  for (size_t t = 0; t < tables_.size(); ++t) {
    ShardImage::Table& image = tables[t];
    OpenCheckpoint::Table& table = open.tables[t];
    image.dim = tables_[t].dim;
    image.dynamic = dynamic_[t] != nullptr;
    if (image.dynamic) {
      image.slots = dynamic_[t]->optimizer()->num_slots();
      image.rows = table.held;
      image.prev = std::move(table.prev);
      image.tail = table.tail;
      table_parts.push_back({static_cast<int>(t), true});
    } else {
      image.slots = row_opts_[t]->num_slots();
      image.rows = table.rows;
    }
    table_parts.push_back({static_cast<int>(t), false});
  }
  return std::make_unique<ShardImage>(this, open.fixed, std::move(tables), std::move(table_parts));
}

void Shard::SaveRowLocked(int t, int64_t row) { SaveRowsLocked(t, {row}); }

void Shard::SaveRowsLocked(int t, const std::vector<int64_t>& rows) {
  for (OpenCheckpoint* open : {written_checkpoint_.get(), pending_checkpoint_.get()}) {
    if (open) SaveRowsLocked(t, rows, open->tables[t]);
  }
}

void Shard::SaveRowsLocked(int t, const std::vector<int64_t>& rows, OpenCheckpoint::Table& table) {
  const int64_t dim = tables_[t].dim;
  DynamicTable* d = dynamic_[t].get();
  const float* values = d ? d->values() : table_values_[t].data();
  std::vector<std::vector<float>*> slots;
  for (int64_t row : rows) {
    if (row >= table.rows || table.Saved(row) != nullptr) continue;
    if (slots.empty()) slots = (d ? d->optimizer() : row_opts_[t].get())->Slots();
    if (table.index == nullptr) {
      // Row counts stay far below 2^32 - 1: a shard's slab rows are int32.
      table.index.reset(static_cast<uint32_t*>(std::calloc(table.rows, sizeof(uint32_t))));
      if (table.index == nullptr) throw std::bad_alloc();
    }
    const int64_t at = table.saved++;
    const int block = OpenCheckpoint::Table::BlockOf(at);
    if (block == static_cast<int>(table.blocks.size())) {
      table.blocks.emplace_back(new float[(int64_t{1} << block) * table.row_floats]);
    }
    table.index[row] = static_cast<uint32_t>(at + 1);
    ++stats_.checkpoint_rows_copied;
    float* out = table.SavedAt(at);
    out = std::copy_n(values + row * dim, dim, out);
    for (const std::vector<float>* slot : slots)
      out = std::copy_n(slot->data() + row * dim, dim, out);
    if (d) {
      const int64_t id = d->id_of(row);
      std::memcpy(out, &id, sizeof(id));
    }
  }
}

void Shard::ReadCheckpointRows(int t, int slot, const int64_t* rows, int64_t n, float* out) {
  absl::MutexLock l(&mu_);
  const OpenCheckpoint::Table& table = written_checkpoint_->tables[t];
  const int64_t dim = tables_[t].dim;
  DynamicTable* d = dynamic_[t].get();
  const float* live = nullptr;
  if (slot >= 0) {
    live = (d ? d->optimizer() : row_opts_[t].get())->Slots()[slot]->data();
  } else if (slot != kIdSlot) {
    live = d ? d->values() : table_values_[t].data();
  }
  // Where a row's piece sits in a saved copy (value, slots..., id).
  const int64_t offset = slot == kIdSlot ? table.row_floats - 2 : dim * (slot < 0 ? 0 : 1 + slot);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    const float* saved = table.Saved(row);
    if (saved) saved += offset;
    if (slot == kIdSlot) {
      int64_t id = 0;
      if (saved) {
        std::memcpy(&id, saved, sizeof(id));
      } else {
        id = d->id_of(row);
      }
      EncodeTableId(id, out + i * kTableIdFloats);
      continue;
    }
    std::copy_n(saved ? saved : live + row * dim, dim, out + i * dim);
  }
}

void Shard::CloseCheckpoint() {
  absl::MutexLock l(&mu_);
  written_checkpoint_.reset();
}

absl::Status Shard::Restore(ShardCheckpoint c) {
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
      rows.ids.reserve(enc.size() / kTableIdFloats);
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
      rows.values = std::move(c.values[i]);  // c is ours: taken over, not copied
      rows.slots = std::move(c.slots[i]);
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
      // Sorted copy, not a std::set: 8 bytes an id instead of a tree node
      // (a restore of millions of rows spent seconds building the set).
      std::vector<int64_t> sorted = rows.ids;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
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
  // Everything matches: now load (into a new buffer: pulls may still read the old one).
  std::shared_ptr<std::string> values = NewValuesBuffer();
  for (size_t i = 0; i < parts_.size(); ++i) {
    std::copy(c.values[i].begin(), c.values[i].end(), PartValues(values.get(), i));
    c.values[i] = std::vector<float>();
    auto slots = optimizer_->Slots(static_cast<int>(i));
    for (size_t k = 0; k < slots.size(); ++k) *slots[k] = std::move(c.slots[i][k]);
  }
  values_ = std::move(values);
  for (size_t t = 0, i = parts_.size(); t < tables_.size(); ++t, ++i) {
    if (dynamic_[t]) {
      ++i;  // "@ids", then "@rows"
      absl::Status imported = dynamic_[t]->Import(std::move(*dynamic_rows[t]));  // validated above
      if (!imported.ok()) return imported;
      continue;
    }
    table_values_[t] = std::move(c.values[i]);
    auto slots = row_opts_[t]->Slots();
    for (size_t k = 0; k < slots.size(); ++k) *slots[k] = std::move(c.slots[i][k]);
  }
  for (const auto& [worker, clock] : c.worker_clocks) {
    if (worker_clock_.count(worker)) worker_clock_[worker] = clock;
  }
  SetVersionLocked(c.version);
  stats_.restored_version = c.version;
  return absl::OkStatus();
}

}  // namespace kubetrain
