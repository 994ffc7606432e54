#include "ps/service.h"

#include <algorithm>
#include <cstring>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "ps/shard_wire.h"

namespace kubetrain {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// The wire encoding of PullResponse{chunk: TensorChunk{part, offset, data}}
// up to (not including) the data bytes.
std::string ChunkPrefix(const std::string& part, uint64_t offset, uint64_t data_bytes) {
  constexpr uint8_t kResponseChunk = (2 << 3) | 2;  // PullResponse.chunk, length-delimited
  constexpr uint8_t kPart = (1 << 3) | 2;           // TensorChunk.part
  constexpr uint8_t kOffset = (2 << 3) | 0;         // TensorChunk.offset, varint
  constexpr uint8_t kData = (3 << 3) | 2;           // TensorChunk.data
  uint64_t chunk_len = 1 + VarintSize(part.size()) + part.size() + 1 + VarintSize(offset) + 1 +
                       VarintSize(data_bytes) + data_bytes;
  std::string out;
  out.push_back(static_cast<char>(kResponseChunk));
  AppendVarint(chunk_len, &out);
  out.push_back(static_cast<char>(kPart));
  AppendVarint(part.size(), &out);
  out.append(part);
  out.push_back(static_cast<char>(kOffset));
  AppendVarint(offset, &out);
  out.push_back(static_cast<char>(kData));
  AppendVarint(data_bytes, &out);
  return out;
}

// gRPC releases a slice through a C callback; the slice keeps the snapshot alive.
void ReleaseSnapshot(void* holder) {
  delete static_cast<std::shared_ptr<const std::string>*>(holder);
}

// Holds a pull in the shard, then streams the header and the chunks. Chunk
// payloads are slices into the snapshot (zero copy).
class PullReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(Shard* shard, const Clock* clock, const PsServiceOptions& options,
              const PsServiceMetrics& metrics, const v1::PullRequest& req)
      : shard_(shard),
        chunk_bytes_(options.max_chunk_bytes),
        metrics_(metrics),
        clock_(clock),
        start_(clock->Now()) {
    absl::Duration wait = req.wait_timeout_ms() > 0 ? absl::Milliseconds(req.wait_timeout_ms())
                                                    : options.default_pull_wait;
    const TaskId task = TaskIdFromWire(req.task_type(), req.worker_index());
    uint64_t ticket = shard_->Pull(
        {task.index, req.min_version(), req.worker_clock(), req.incarnation(), task.role},
        start_ + wait, [this](absl::StatusOr<Shard::Snapshot> s) { OnSnapshot(std::move(s)); });
    absl::MutexLock l(&mu_);
    ticket_ = ticket;
  }

  void OnCancel() override {
    uint64_t ticket;
    {
      absl::MutexLock l(&mu_);
      ticket = ticket_;
    }
    if (ticket != 0) shard_->CancelPull(ticket);  // OnSnapshot(CANCELLED) finishes the call
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    NextWrite();
  }

  void OnDone() override { delete this; }

 private:
  void OnSnapshot(absl::StatusOr<Shard::Snapshot> snap) {
    if (!snap.ok()) {
      Finish(ToGrpcStatus(snap.status()));
      return;
    }
    snapshot_ = std::move(*snap);
    v1::PullResponse msg;
    auto* h = msg.mutable_header();
    h->set_version(snapshot_.version);
    h->set_done(snapshot_.done);
    h->set_waited_seconds(snapshot_.waited_seconds);
    h->set_total_bytes(snapshot_.bytes->size());
    h->set_incarnation(snapshot_.incarnation);
    std::string encoded = msg.SerializeAsString();
    grpc::Slice slice(encoded.data(), encoded.size());
    out_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&out_);
  }

  // Next chunk of the current part, or of the next non-empty part, or finish.
  void NextWrite() {
    const auto& parts = shard_->parts();
    while (part_ < parts.size()) {
      uint64_t part_bytes = parts[part_].num_bytes();
      if (part_offset_ < part_bytes) {
        uint64_t n = std::min<uint64_t>(chunk_bytes_, part_bytes - part_offset_);
        n -= n % 4;
        std::string prefix = ChunkPrefix(parts[part_].name, part_offset_ / 4, n);
        const char* data = snapshot_.bytes->data() + base_ + part_offset_;
        grpc::Slice slices[2] = {
            grpc::Slice(prefix.data(), prefix.size()),
            grpc::Slice(const_cast<char*>(data), n, ReleaseSnapshot,
                        new std::shared_ptr<const std::string>(snapshot_.bytes))};
        out_ = grpc::ByteBuffer(slices, 2);
        part_offset_ += n;
        if (metrics_.pull_bytes) metrics_.pull_bytes->Increment(static_cast<double>(n));
        StartWrite(&out_);
        return;
      }
      base_ += part_bytes;
      part_offset_ = 0;
      ++part_;
    }
    if (metrics_.pull_seconds) {
      metrics_.pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start_));
    }
    Finish(grpc::Status::OK);
  }

  Shard* const shard_;
  const uint64_t chunk_bytes_;
  const PsServiceMetrics metrics_;
  const Clock* const clock_;
  const absl::Time start_;
  absl::Mutex mu_;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // Touched only by the write sequence, which gRPC serialises.
  Shard::Snapshot snapshot_;
  grpc::ByteBuffer out_;
  size_t part_ = 0;
  uint64_t part_offset_ = 0;  // bytes into the current part
  uint64_t base_ = 0;         // bytes before the current part in the snapshot
};

// Answers a pull whose request could not be parsed.
class RejectReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Reassembles a pushed gradient chunk by chunk (ps/shard_wire.h), rejecting
// bad chunks at once.
class PushReactor final : public grpc::ServerReadReactor<v1::PushRequest> {
 public:
  PushReactor(Shard* shard, const Clock* clock, const PsServiceMetrics& metrics,
              v1::PushResponse* resp)
      : shard_(shard),
        clock_(clock),
        metrics_(metrics),
        resp_(resp),
        start_(clock->Now()),
        assembler_(shard) {
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Complete();
      return;
    }
    absl::Status s = assembler_.Add(msg_);
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    if (metrics_.push_bytes && msg_.has_chunk()) {
      metrics_.push_bytes->Increment(static_cast<double>(msg_.chunk().data().size()));
    }
    StartRead(&msg_);
  }

  void OnDone() override { delete this; }

 private:
  void Complete() {
    auto r = assembler_.Finish();
    if (!r.ok()) {
      Finish(ToGrpcStatus(r.status()));
      return;
    }
    resp_->set_version(r->version);
    resp_->set_dropped(r->dropped);
    resp_->set_done(r->done);
    resp_->set_staleness(r->staleness);
    resp_->set_incarnation(shard_->incarnation());
    if (metrics_.push_seconds) {
      metrics_.push_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start_));
    }
    Finish(grpc::Status::OK);
  }

  Shard* const shard_;
  const Clock* const clock_;
  const PsServiceMetrics metrics_;
  v1::PushResponse* const resp_;
  const absl::Time start_;
  v1::PushRequest msg_;
  PushAssembler assembler_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

PsService::PsService(Shard* shard, const Clock* clock, PsServiceOptions options,
                     PsServiceMetrics metrics)
    : shard_(shard), clock_(clock), options_(std::move(options)), metrics_(metrics) {}

grpc::ServerUnaryReactor* PsService::GetInfo(grpc::CallbackServerContext* ctx,
                                             const v1::InfoRequest* req, v1::ShardInfo* resp) {
  FillShardInfo(shard_, options_.model_fingerprint, options_.max_chunk_bytes, *req, resp);
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PsService::Pull(grpc::CallbackServerContext*,
                                                            const grpc::ByteBuffer* raw) {
  grpc::ByteBuffer copy(*raw);  // shares the slices; deserialising consumes the buffer
  v1::PullRequest req;
  grpc::Status s = grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::PullRequest>(&copy, &req);
  if (!s.ok()) {
    return new RejectReactor(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "pull: malformed PullRequest: " + s.error_message()));
  }
  return new PullReactor(shard_, clock_, options_, metrics_, req);
}

grpc::ServerReadReactor<v1::PushRequest>* PsService::Push(grpc::CallbackServerContext*,
                                                          v1::PushResponse* resp) {
  return new PushReactor(shard_, clock_, metrics_, resp);
}

grpc::ServerUnaryReactor* PsService::Leave(grpc::CallbackServerContext* ctx,
                                           const v1::LeaveRequest* req, v1::LeaveResponse*) {
  return Done(ctx,
              ToGrpcStatus(shard_->Leave(TaskIdFromWire(req->task_type(), req->worker_index()))));
}

grpc::ServerUnaryReactor* PsService::Shutdown(grpc::CallbackServerContext* ctx,
                                              const v1::ShutdownRequest* req,
                                              v1::ShardStats* resp) {
  absl::Status allowed =
      shard_->RequestShutdown(TaskIdFromWire(req->task_type(), req->worker_index()));
  if (!allowed.ok()) return Done(ctx, ToGrpcStatus(allowed));
  FillShardStats(shard_->stats(), resp);
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* PsService::GetStats(grpc::CallbackServerContext* ctx,
                                              const v1::InfoRequest*, v1::ShardStats* resp) {
  FillShardStats(shard_->stats(), resp);
  return Done(ctx, grpc::Status::OK);
}

}  // namespace kubetrain
