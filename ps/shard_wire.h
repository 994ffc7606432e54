// What both transports of the PS (the gRPC service and the in-process channel
// used by tests) do the same way between wire messages (proto/ps.proto) and a
// Shard: the task a request names, the handshake, the stats, and the
// chunk-by-chunk reassembly of a push with its wire-level checks. No gRPC.
#ifndef KUBETRAIN_PS_SHARD_WIRE_H_
#define KUBETRAIN_PS_SHARD_WIRE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"
#include "ps/shard.h"

namespace kubetrain {

// The task a request names. INVALID_ARGUMENT for a task type this PS does
// not know (proto3 enums carry any number); whether the job has the task is
// for the shard to say (Shard::CheckTask).
absl::StatusOr<TaskId> TaskFromWire(int type, int index);

// The handshake answer: what the shard holds, its version and incarnation,
// and (for a worker) the steps it had done, which also marks it alive.
// INVALID_ARGUMENT if the request names a task the job does not have.
absl::Status FillShardInfo(Shard* shard, const std::string& model_fingerprint,
                           uint64_t max_chunk_bytes, const v1::InfoRequest& request,
                           v1::ShardInfo* info);

void FillShardStats(const ShardStatsSnapshot& stats, v1::ShardStats* out);

// A pull's header for `snapshot`, and a push's answer for `result` from the
// shard of `incarnation`: the same on every transport.
v1::PullResponse::Header PullHeaderOf(const Shard::Snapshot& snapshot);
v1::PushResponse PushResponseOf(const Shard::PushResult& result, int64_t incarnation);

// Calls fn(part name, first element, bytes, byte count) for each chunk of a
// pull's answer: every part of `shard` in order, in pieces of at most
// `max_chunk_bytes` (a multiple of 4) of `snapshot`. Stops at fn's first
// error and returns it.
absl::Status ForEachPulledChunk(
    const Shard& shard, const Shard::Snapshot& snapshot, uint64_t max_chunk_bytes,
    const std::function<absl::Status(const std::string& part, uint64_t offset, const char* data,
                                     uint64_t bytes)>& fn);

// Answers a SparsePull: the rows of the request's ids, table by table.
// INVALID_ARGUMENT naming the table (unknown table, id out of range or held
// by another shard, data in the request) with nothing read.
absl::Status ServeSparsePull(Shard* shard, const v1::SparsePullRequest& request,
                             v1::SparsePullResponse* response);

// Answers a ListRows: a page of a dynamic table's rows, at most what fits in
// `max_chunk_bytes` of row data (and at least one row). INVALID_ARGUMENT
// naming the table (unknown, or not dynamic).
absl::Status ServeListRows(Shard* shard, const v1::ListRowsRequest& request,
                           uint64_t max_chunk_bytes, v1::ListRowsResponse* response);

// Rows of a table of `dim` floats that fit in one message of
// `max_chunk_bytes` with their ids (at least 1): a page of ListRows.
int64_t RowsPerMessage(int64_t dim, uint64_t max_chunk_bytes);

// Reassembles one push: the header first, then every part's chunks in order,
// each part covered exactly once. A bad message is refused at once
// (INVALID_ARGUMENT: "push: malformed ..." for a message or chunk that is
// wrong in itself, "push: incomplete gradient ..." for a stream that ended
// early) and the shard is not touched. Memory is taken as chunks arrive, never
// at the header: a set of buffers from the shard's pool if it has one, else
// each part's buffer grows with the bytes received (at most the part's size).
// Gradient rows go into a pooled set of the shard's too (TakePooledSparse).
// Not thread-safe: one per push.
class PushAssembler {
 public:
  // `shard` must outlive the assembler.
  explicit PushAssembler(Shard* shard);
  ~PushAssembler();

  absl::Status Add(const v1::PushRequest& message);
  absl::Status SetHeader(const v1::PushRequest::Header& header);
  absl::Status AddChunk(absl::string_view part, uint64_t offset, absl::string_view data);
  // AddChunk without the data: checks a chunk of `bytes` bytes of `part` from
  // element `offset` as AddChunk does and returns where its bytes go, in the
  // push's own buffer. The caller must write all `bytes` there before the
  // next call on the assembler (the chunk counts as received): a transport
  // whose message arrives in pieces copies each straight in.
  absl::StatusOr<char*> ReserveChunk(absl::string_view part, uint64_t offset, uint64_t bytes);
  // Gradient rows of a table: known table, data of ids x dim float32
  // (ids and values are checked by the shard at Finish).
  absl::Status AddSparse(const std::string& table, const uint64_t* ids, size_t count,
                         absl::string_view data);
  // Checks that every part is complete, then hands the gradient to the shard.
  absl::StatusOr<Shard::PushResult> Finish();
  // Gives the buffers back to the shard's pool; the push cannot complete.
  void Abandon();
  // Gradient bytes received so far.
  uint64_t received_bytes() const { return received_bytes_; }

 private:
  // INVALID_ARGUMENT, counted with the shard's rejected pushes.
  absl::Status Refuse(absl::string_view message);

  Shard* const shard_;
  bool have_header_ = false;
  Shard::PushHeader header_;
  std::vector<std::vector<float>> grads_;  // empty until the first chunk
  bool pooled_ = false;                    // grads_ are full-size buffers from the pool
  // Elements received per part; inline for the parts a shard usually holds,
  // so a push of dense gradients allocates nothing (ps/push_alloc_test.cc).
  absl::InlinedVector<uint64_t, 64> filled_;
  // Gradient rows, in sparse_[0, sparse_used_): a set from the shard's pool
  // (TakePooledSparse) whose entries are refilled in place, so rows of the
  // same size every push allocate nothing (ps/sparse_push_alloc_test.cc).
  std::vector<Shard::SparseGrad> sparse_;
  size_t sparse_used_ = 0;
  bool sparse_taken_ = false;  // asked the pool already
  uint64_t received_bytes_ = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SHARD_WIRE_H_
