// The PS's published API: how a task talks to one PS task. This is the only
// ps/ header worker/ may include. Implementations: the gRPC client
// (worker/grpc_shard_channel.h) and, for tests, an in-process channel over a
// Shard (ps/in_process_shard_channel.h); ShardChannelWrapper forwards to
// another channel, so a test can change one call (a fault) and keep the rest.
//
// Messages are those of proto/ps.proto; a request names its task (worker,
// chief or evaluator, and index). Errors:
//   UNAVAILABLE        the PS cannot be reached (not up yet, restarting): retry;
//   DEADLINE_EXCEEDED  the PS let go of a held pull after its wait timeout;
//   INVALID_ARGUMENT   the PS refused the request (its state is unchanged);
//   PERMISSION_DENIED  Shutdown from a task that is not the chief.
#ifndef KUBETRAIN_PS_SHARD_CHANNEL_H_
#define KUBETRAIN_PS_SHARD_CHANNEL_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"

namespace kubetrain {

// When set, a channel calls (*ready)() right before it first reads a ref's
// data, and only then: it returns once the data are final (an overlapped
// push, whose gradients are still being computed as it is sent; worker/
// ps_client.h, StartPushPull). An error abandons the push, never applied,
// with that error. Retries call it again (it returns at once by then).
using RefReady = std::function<absl::Status()>;

// A contiguous run of float32 elements of one part (not owned).
struct ChunkRef {
  const std::string* part;
  uint64_t offset;  // elements
  const float* data;
  uint64_t count;  // elements
  const RefReady* ready = nullptr;
};

// Gradient rows of one embedding table (not owned): `count` ids and
// count x dim floats.
struct SparseRef {
  const std::string* table;
  const uint64_t* ids;
  uint64_t count;
  const float* data;
  uint64_t dim;
  const RefReady* ready = nullptr;
};

// (*ref.ready)() if set, else OK.
template <typename Ref>
absl::Status AwaitRef(const Ref& ref) {
  return ref.ready != nullptr ? (*ref.ready)() : absl::OkStatus();
}

// One pulled chunk as a channel received it: `data_bytes()` bytes of
// little-endian float32 for elements [offset, offset + data_bytes / 4) of
// `part`. Valid only during the sink's call. The gRPC channel's chunks are
// read in place from the received message (proto/chunk_slices.h), so CopyTo
// is the only copy of the floats on the worker's side.
class PulledChunk {
 public:
  virtual ~PulledChunk() = default;
  virtual absl::string_view part() const = 0;
  virtual uint64_t offset() const = 0;  // elements
  virtual uint64_t data_bytes() const = 0;
  // Writes the data_bytes() bytes to `out`. Call it at most once per chunk:
  // the bulk channel's chunks are still in the socket, and CopyTo receives
  // them straight into `out` (a second call fails the pull with INTERNAL).
  virtual void CopyTo(char* out) const = 0;
  // The bytes, copied (tests, small reads): CopyTo's one call.
  std::string data() const {
    std::string out(data_bytes(), '\0');
    CopyTo(out.data());
    return out;
  }
};

// A chunk whose bytes are in memory (the in-process channel's, and a chunk
// message parsed by protobuf).
class FlatPulledChunk final : public PulledChunk {
 public:
  FlatPulledChunk(absl::string_view part, uint64_t offset, const char* data, uint64_t bytes)
      : part_(part), offset_(offset), data_(data), bytes_(bytes) {}
  explicit FlatPulledChunk(const v1::TensorChunk& c)
      : FlatPulledChunk(c.part(), c.offset(), c.data().data(), c.data().size()) {}
  absl::string_view part() const override { return part_; }
  uint64_t offset() const override { return offset_; }
  uint64_t data_bytes() const override { return bytes_; }
  void CopyTo(char* out) const override { std::memcpy(out, data_, bytes_); }

 private:
  const absl::string_view part_;
  const uint64_t offset_;
  const char* const data_;
  const uint64_t bytes_;
};

// What a fused PushPull brought back. `push` is the push's answer, or why
// none came (then `pull` has the same error: the pull did not happen, and the
// push may or may not have been applied, as with a failed Push). With `push`
// OK, `pull` is the pull's header or why it failed (the push stays applied).
struct PushPullAnswer {
  absl::StatusOr<v1::PushResponse> push;
  absl::StatusOr<v1::PullResponse::Header> pull;
};

// One PS task. Implementations must be thread-safe.
class ShardChannel {
 public:
  using ChunkSink = std::function<absl::Status(const PulledChunk&)>;

  virtual ~ShardChannel() = default;
  // The handshake; waits up to `timeout` for the PS to become reachable.
  virtual absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request,
                                                absl::Duration timeout) = 0;
  // Streams the shard's values into `sink`, chunk by chunk, after the PS's
  // hold. An error from `sink` ends the pull with that error.
  virtual absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                        const ChunkSink& sink) = 0;
  // The dense chunks, then the sparse rows (each a message of its own).
  virtual absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                                const std::vector<ChunkRef>& chunks,
                                                const std::vector<SparseRef>& sparse) = 0;
  // A push of dense chunks only.
  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks) {
    return Push(header, chunks, {});
  }
  // A worker's step in one round trip: Push(header, chunks, sparse), then,
  // once the shard has handled it (applied, dropped or a duplicate), Pull(pull,
  // sink). pull.worker_index and task_type are the pusher's, whatever they say.
  virtual PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                                  const std::vector<ChunkRef>& chunks,
                                  const std::vector<SparseRef>& sparse, const v1::PullRequest& pull,
                                  const ChunkSink& sink) = 0;
  // Rows of embedding tables by id (no hold).
  virtual absl::StatusOr<v1::SparsePullResponse> SparsePull(
      const v1::SparsePullRequest& request) = 0;
  // A page of the rows a dynamic table holds on this PS (no hold).
  virtual absl::StatusOr<v1::ListRowsResponse> ListRows(const v1::ListRowsRequest& request) = 0;
  virtual absl::Status Leave(const v1::LeaveRequest& request) = 0;
  virtual absl::StatusOr<v1::ShardStats> Shutdown(const v1::ShutdownRequest& request) = 0;
  // The shard's counters now (no side effect; short deadline).
  virtual absl::StatusOr<v1::ShardStats> GetStats(const v1::InfoRequest& request) = 0;
};

// Forwards every call to `target` (leveldb's EnvWrapper): subclass it and
// override only the calls to change.
class ShardChannelWrapper : public ShardChannel {
 public:
  explicit ShardChannelWrapper(std::unique_ptr<ShardChannel> target) : target_(std::move(target)) {}
  ShardChannel* target() const { return target_.get(); }
  using ShardChannel::Push;

  absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request,
                                        absl::Duration timeout) override {
    return target_->GetInfo(request, timeout);
  }
  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override {
    return target_->Pull(request, sink);
  }
  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks,
                                        const std::vector<SparseRef>& sparse) override {
    return target_->Push(header, chunks, sparse);
  }
  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override {
    return target_->PushPull(header, chunks, sparse, pull, sink);
  }
  absl::StatusOr<v1::SparsePullResponse> SparsePull(const v1::SparsePullRequest& request) override {
    return target_->SparsePull(request);
  }
  absl::StatusOr<v1::ListRowsResponse> ListRows(const v1::ListRowsRequest& request) override {
    return target_->ListRows(request);
  }
  absl::Status Leave(const v1::LeaveRequest& request) override { return target_->Leave(request); }
  absl::StatusOr<v1::ShardStats> Shutdown(const v1::ShutdownRequest& request) override {
    return target_->Shutdown(request);
  }
  absl::StatusOr<v1::ShardStats> GetStats(const v1::InfoRequest& request) override {
    return target_->GetStats(request);
  }

 private:
  const std::unique_ptr<ShardChannel> target_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SHARD_CHANNEL_H_
