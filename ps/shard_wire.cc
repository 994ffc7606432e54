#include "ps/shard_wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kubetrain {

absl::StatusOr<TaskId> TaskFromWire(int type, int index) {
  TaskId task;
  switch (type) {
    case v1::TASK_TYPE_WORKER:
      task = {TaskRole::kWorker, index};
      break;
    case v1::TASK_TYPE_CHIEF:
      task = {TaskRole::kChief, index};
      break;
    case v1::TASK_TYPE_EVALUATOR:
      task = {TaskRole::kEvaluator, index};
      break;
    case v1::TASK_TYPE_EXPORTER:
      task = {TaskRole::kExporter, index};
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown task_type ", type));
  }
  return task;
}

absl::Status FillShardInfo(Shard* shard, const std::string& model_fingerprint,
                           uint64_t max_chunk_bytes, const v1::InfoRequest& request,
                           v1::ShardInfo* info) {
  auto task = TaskFromWire(request.task_type(), request.worker_index());
  if (!task.ok()) return task.status();
  if (absl::Status s = shard->CheckTask(*task); !s.ok()) return s;
  const ShardOptions& o = shard->options();
  info->set_shard_index(o.shard_index);
  info->set_model_fingerprint(model_fingerprint);
  for (const auto& p : shard->parts()) {
    auto* part = info->add_parts();
    part->set_name(p.name);
    part->set_rows(p.row_end - p.row_begin);
    part->set_cols(p.cols);
    part->set_row_offset(p.row_begin);
  }
  const std::vector<Shard::TableCounts> counts = shard->TableRowCounts();
  for (size_t i = 0; i < shard->tables().size(); ++i) {
    const TablePlacement& t = shard->tables()[i];
    auto* table = info->add_tables();
    table->set_name(t.name);
    table->set_rows(t.rows);
    table->set_dim(t.dim);
    table->set_local_rows(static_cast<uint64_t>(counts[i].rows));
  }
  info->set_version(shard->version());
  info->set_target_steps(o.target_steps);
  info->set_max_chunk_bytes(max_chunk_bytes);
  info->set_mode(TrainingModeName(o.mode));
  info->set_incarnation(shard->incarnation());
  info->set_absent_workers(static_cast<int32_t>(shard->stats().absent_workers));
  if (task->role == TaskRole::kWorker) info->set_worker_clock(shard->WorkerClock(task->index));
  return absl::OkStatus();
}

void FillShardStats(const ShardStatsSnapshot& s, v1::ShardStats* out) {
  out->set_version(s.version);
  out->set_gradients_applied(s.gradients_applied);
  out->set_stale_gradients_dropped(s.stale_gradients_dropped);
  out->set_pushes_rejected(s.pushes_rejected);
  out->set_staleness_sum(s.staleness_sum);
  out->set_staleness_max(s.staleness_max);
  out->set_barrier_timeouts(s.barrier_timeouts);
  out->set_restored_version(s.restored_version);
  out->set_nonfinite_updates(s.nonfinite_updates);
  out->set_duplicate_pushes(s.duplicate_pushes);
  out->set_absent_workers(s.absent_workers);
  out->set_checkpoint_failures(s.checkpoint_failures);
  out->set_checkpoints_failing(s.checkpoint_failing ? 1 : 0);
  out->set_checkpoint_error(s.checkpoint_error);
  out->set_dynamic_rows(s.dynamic_rows);
  out->set_dynamic_rows_evicted(s.dynamic_rows_evicted);
}

v1::PullResponse::Header PullHeaderOf(const Shard::Snapshot& snapshot) {
  v1::PullResponse::Header h;
  h.set_version(snapshot.version);
  h.set_done(snapshot.done);
  h.set_waited_seconds(snapshot.waited_seconds);
  h.set_total_bytes(snapshot.bytes->size());
  h.set_incarnation(snapshot.incarnation);
  h.set_absent_workers(snapshot.absent_workers);
  return h;
}

v1::PushResponse PushResponseOf(const Shard::PushResult& result, int64_t incarnation) {
  v1::PushResponse response;
  response.set_version(result.version);
  response.set_dropped(result.dropped);
  response.set_done(result.done);
  response.set_staleness(result.staleness);
  response.set_incarnation(incarnation);
  response.set_absent_workers(result.absent_workers);
  return response;
}

absl::Status ForEachPulledChunk(
    const Shard& shard, const Shard::Snapshot& snapshot, uint64_t max_chunk_bytes,
    const std::function<absl::Status(const std::string& part, uint64_t offset, const char* data,
                                     uint64_t bytes)>& fn) {
  uint64_t base = 0;
  for (const auto& part : shard.parts()) {
    const uint64_t part_bytes = part.num_bytes();
    for (uint64_t off = 0; off < part_bytes; off += max_chunk_bytes) {
      const uint64_t n = std::min(max_chunk_bytes, part_bytes - off);
      if (absl::Status s = fn(part.name, off / 4, snapshot.bytes->data() + base + off, n);
          !s.ok()) {
        return s;
      }
    }
    base += part_bytes;
  }
  return absl::OkStatus();
}

absl::Status ServeSparsePull(Shard* shard, const v1::SparsePullRequest& request,
                             v1::SparsePullResponse* response) {
  auto task = TaskFromWire(request.task_type(), request.worker_index());
  if (!task.ok()) return task.status();
  std::vector<std::pair<int, std::vector<int64_t>>> ids;
  for (const v1::SparseRows& rows : request.tables()) {
    const int t = shard->TableIndex(rows.table());
    if (t < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse pull: unknown table \"", rows.table(), "\" on this PS shard"));
    }
    if (!rows.data().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse pull: table ", rows.table(), ": a request carries ids, no data"));
    }
    ids.emplace_back(t, std::vector<int64_t>(rows.ids().begin(), rows.ids().end()));
  }
  auto r = shard->PullRows(*task, ids, request.read_only());
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("sparse pull: ", r.status().message()));
  }
  response->set_version(r->version);
  response->set_incarnation(r->incarnation);
  for (int i = 0; i < request.tables_size(); ++i) {
    v1::SparseRows* out = response->add_tables();
    out->set_table(request.tables(i).table());
    out->set_data(reinterpret_cast<const char*>(r->rows[i].data()), r->rows[i].size() * 4);
  }
  return absl::OkStatus();
}

int64_t RowsPerMessage(int64_t dim, uint64_t max_chunk_bytes) {
  // A row's floats and its id (a varint of at most 10 bytes).
  const uint64_t row_bytes = static_cast<uint64_t>(std::max<int64_t>(1, dim)) * 4 + 10;
  return static_cast<int64_t>(std::max<uint64_t>(1, max_chunk_bytes / row_bytes));
}

absl::Status ServeListRows(Shard* shard, const v1::ListRowsRequest& request,
                           uint64_t max_chunk_bytes, v1::ListRowsResponse* response) {
  auto task = TaskFromWire(request.task_type(), request.worker_index());
  if (!task.ok()) return task.status();
  const int t = shard->TableIndex(request.table());
  if (t < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("list rows: unknown table \"", request.table(), "\" on this PS shard"));
  }
  const int64_t dim = shard->tables()[t].dim;
  const int64_t max_rows =
      std::min<int64_t>(static_cast<int64_t>(std::min<uint64_t>(request.max_rows(), INT64_MAX)),
                        RowsPerMessage(dim, max_chunk_bytes));
  auto page = shard->ListRows(
      *task, t, static_cast<int64_t>(std::min<uint64_t>(request.cursor(), INT64_MAX)), max_rows);
  if (!page.ok()) {
    return absl::Status(page.status().code(), absl::StrCat("list rows: ", page.status().message()));
  }
  v1::SparseRows* rows = response->mutable_rows();
  rows->set_table(request.table());
  rows->mutable_ids()->Add(page->ids.begin(), page->ids.end());
  rows->set_data(reinterpret_cast<const char*>(page->values.data()), page->values.size() * 4);
  response->set_next_cursor(static_cast<uint64_t>(page->next_cursor));
  response->set_done(page->done);
  response->set_total_rows(static_cast<uint64_t>(page->total_rows));
  response->set_generation(static_cast<uint64_t>(page->generation));
  response->set_version(page->version);
  response->set_incarnation(page->incarnation);
  return absl::OkStatus();
}

PushAssembler::PushAssembler(Shard* shard) : shard_(shard), filled_(shard->parts().size(), 0) {}

absl::Status PushAssembler::Refuse(absl::string_view message) {
  shard_->RecordRejectedPush();
  return absl::InvalidArgumentError(message);
}

PushAssembler::~PushAssembler() { Abandon(); }

void PushAssembler::Abandon() {
  if (!grads_.empty()) shard_->ReleaseGradientBuffers(std::move(grads_));
  grads_.clear();
  shard_->ReleaseSparse(std::move(sparse_));
  sparse_.clear();
  sparse_used_ = 0;
  have_header_ = false;
}

absl::Status PushAssembler::Add(const v1::PushRequest& message) {
  const int kinds = message.has_header() + message.has_chunk() + message.has_sparse();
  if (kinds != 1) {
    return Refuse(kinds == 0 ? "push: malformed message: neither a header, a chunk nor rows"
                             : "push: malformed message: more than one of header, chunk, rows");
  }
  if (message.has_header()) return SetHeader(message.header());
  if (message.has_sparse()) {
    const auto& sp = message.sparse();
    return AddSparse(sp.table(), sp.ids().data(), sp.ids_size(), sp.data());
  }
  const auto& c = message.chunk();
  return AddChunk(c.part(), c.offset(), c.data());
}

absl::Status PushAssembler::SetHeader(const v1::PushRequest::Header& h) {
  if (have_header_) return Refuse("push: malformed message: a second header");
  const uint64_t expected = shard_->gradient_bytes();
  if (h.total_bytes() != 0 && h.total_bytes() != expected) {
    return Refuse(absl::StrCat("push: malformed header: declares ", h.total_bytes(),
                               " gradient bytes, this PS shard holds ", expected));
  }
  have_header_ = true;
  header_ = {h.worker_index(), h.version(), h.worker_clock(), h.incarnation(), h.push_id()};
  return absl::OkStatus();
}

absl::Status PushAssembler::AddChunk(absl::string_view part, uint64_t offset,
                                     absl::string_view data) {
  absl::StatusOr<char*> to = ReserveChunk(part, offset, data.size());
  if (!to.ok()) return to.status();
  std::memcpy(*to, data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<char*> PushAssembler::ReserveChunk(absl::string_view part_name, uint64_t offset,
                                                  uint64_t bytes) {
  if (!have_header_) return Refuse("push: malformed: a chunk before the header");
  const int part = shard_->PartIndex(part_name);
  if (part < 0) {
    return Refuse(absl::StrCat("push: malformed chunk: unknown variable part \"", part_name,
                               "\" on this PS shard"));
  }
  if (bytes % 4 != 0) {
    return Refuse(absl::StrCat("push: malformed chunk of ", part_name, ": ", bytes,
                               " bytes, not a whole number of float32"));
  }
  const uint64_t n = bytes / 4;
  const uint64_t size = static_cast<uint64_t>(shard_->parts()[part].num_elements());
  // Chunks of a part arrive in order, so "filled" both checks offsets and
  // proves the part is covered exactly once.
  if (offset != filled_[part] || n > size - filled_[part]) {
    return Refuse(absl::StrCat("push: malformed chunk of ", part_name, ": elements ", offset, " (+",
                               n, ") do not follow the ", filled_[part], " of ", size,
                               " received"));
  }
  if (grads_.empty()) {
    grads_ = shard_->TakePooledGradientBuffers();
    pooled_ = !grads_.empty();
    if (!pooled_) grads_.resize(filled_.size());
  }
  std::vector<float>& g = grads_[part];
  if (!pooled_) {
    // Grows with what arrived (doubling, so few copies), never past the part.
    const uint64_t need = filled_[part] + n;
    if (g.capacity() < need)
      g.reserve(std::min<uint64_t>(size, std::max<uint64_t>(need, 2 * g.capacity())));
    g.resize(need);
  }
  filled_[part] += n;
  received_bytes_ += bytes;
  return reinterpret_cast<char*>(g.data() + offset);
}

absl::Status PushAssembler::AddSparse(const std::string& table, const uint64_t* ids, size_t count,
                                      absl::string_view data) {
  if (!have_header_) return Refuse("push: malformed: rows before the header");
  const int t = shard_->TableIndex(table);
  if (t < 0) {
    return Refuse(
        absl::StrCat("push: malformed rows: unknown table \"", table, "\" on this PS shard"));
  }
  const uint64_t dim = shard_->tables()[t].dim;
  if (data.size() != count * dim * 4) {
    return Refuse(absl::StrCat("push: malformed rows of ", table, ": ", data.size(), " bytes for ",
                               count, " ids of dim ", dim, " (expected ", count * dim * 4, ")"));
  }
  if (!sparse_taken_) {
    sparse_taken_ = true;
    if (sparse_.empty()) sparse_ = shard_->TakePooledSparse();
  }
  if (sparse_used_ == sparse_.size()) sparse_.emplace_back();
  Shard::SparseGrad& g = sparse_[sparse_used_++];
  g.table = t;
  g.ids.resize(count);
  for (size_t i = 0; i < count; ++i) {
    // Larger than any table: the shard refuses it as out of range.
    g.ids[i] = ids[i] > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(ids[i]);
  }
  g.rows.resize(count * dim);
  if (!data.empty()) std::memcpy(g.rows.data(), data.data(), data.size());
  received_bytes_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<Shard::PushResult> PushAssembler::Finish() {
  if (!have_header_) return Refuse("push: incomplete: no header");
  const auto& parts = shard_->parts();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (filled_[i] != static_cast<uint64_t>(parts[i].num_elements())) {
      return Refuse(absl::StrCat("push: incomplete gradient: ", parts[i].name, " has ", filled_[i],
                                 " of ", parts[i].num_elements(), " elements"));
    }
  }
  if (grads_.empty()) grads_.resize(parts.size());  // a shard whose parts are all empty
  // Entries the pooled set had beyond this push's are dropped (a push with
  // fewer tables than the set's last one).
  sparse_.resize(sparse_used_);
  sparse_used_ = 0;
  return shard_->Push(header_, std::move(grads_), std::move(sparse_));
}

}  // namespace kubetrain
