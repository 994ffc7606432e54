#include "ps/shard_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kubetrain {

TaskId TaskIdFromWire(v1::TaskType type, int index) {
  switch (type) {
    case v1::TASK_TYPE_CHIEF:
      return {TaskRole::kChief, index};
    case v1::TASK_TYPE_EVALUATOR:
      return {TaskRole::kEvaluator, index};
    default:
      return {TaskRole::kWorker, index};
  }
}

void FillShardInfo(Shard* shard, const std::string& model_fingerprint, uint64_t max_chunk_bytes,
                   const v1::InfoRequest& request, v1::ShardInfo* info) {
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
  info->set_version(shard->version());
  info->set_target_steps(o.target_steps);
  info->set_max_chunk_bytes(max_chunk_bytes);
  info->set_mode(TrainingModeName(o.mode));
  info->set_incarnation(shard->incarnation());
  if (request.task_type() == v1::TASK_TYPE_WORKER) {
    info->set_worker_clock(shard->WorkerClock(request.worker_index()));
  }
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
}

PushAssembler::PushAssembler(Shard* shard) : shard_(shard) {
  grads_ = shard_->AcquireGradientBuffers();
  filled_.assign(grads_.size(), 0);
}

absl::Status PushAssembler::Add(const v1::PushRequest& message) {
  if (message.has_header()) return SetHeader(message.header());
  if (!message.has_chunk()) return absl::InvalidArgumentError("push: empty message");
  const auto& c = message.chunk();
  return AddChunk(c.part(), c.offset(), c.data());
}

absl::Status PushAssembler::SetHeader(const v1::PushRequest::Header& h) {
  if (have_header_) return absl::InvalidArgumentError("push: second header");
  have_header_ = true;
  header_ = {h.worker_index(), h.version(), h.worker_clock(), h.incarnation()};
  return absl::OkStatus();
}

absl::Status PushAssembler::AddChunk(const std::string& part_name, uint64_t offset,
                                     absl::string_view data) {
  if (!have_header_) return absl::InvalidArgumentError("push: chunk before header");
  const int part = shard_->PartIndex(part_name);
  if (part < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push: unknown variable part \"", part_name, "\" on this PS shard"));
  }
  if (data.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push: chunk of ", part_name, " has ", data.size(), " bytes, not float32"));
  }
  const uint64_t n = data.size() / 4;
  // Chunks of a part arrive in order, so "filled" both checks offsets and
  // proves the part is covered exactly once.
  if (offset != filled_[part] || offset + n > grads_[part].size()) {
    return absl::InvalidArgumentError(absl::StrCat("push: chunk of ", part_name, " at element ",
                                                   offset, " (+", n, ") does not follow ",
                                                   filled_[part], " of ", grads_[part].size()));
  }
  std::memcpy(grads_[part].data() + offset, data.data(), data.size());
  filled_[part] += n;
  return absl::OkStatus();
}

absl::StatusOr<Shard::PushResult> PushAssembler::Finish() {
  if (!have_header_) return absl::InvalidArgumentError("push: no header");
  for (size_t i = 0; i < grads_.size(); ++i) {
    if (filled_[i] != grads_[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat("push: gradient of ", shard_->parts()[i].name,
                                                     " incomplete: ", filled_[i], " of ",
                                                     grads_[i].size(), " elements"));
    }
  }
  return shard_->Push(header_, std::move(grads_));
}

}  // namespace kubetrain
