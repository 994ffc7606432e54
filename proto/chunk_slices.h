// A chunk message (core/push_wire.h: PushRequest{chunk} or PullResponse{chunk},
// which share the wire form) read in place from a received gRPC message: the
// prefix is parsed by hand and the float payload is copied from gRPC's slices
// straight to where it belongs, without protobuf's copy into a string. Both
// ends use it: the PS for pushed chunks (ps/raw_push.h), the worker for pulled
// ones (worker/grpc_shard_channel.cc).
#ifndef KUBETRAIN_PROTO_CHUNK_SLICES_H_
#define KUBETRAIN_PROTO_CHUNK_SLICES_H_

#include <cstdint>

#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/string_view.h"
#include "core/push_wire.h"

namespace kubetrain {

class ChunkSlices {
 public:
  // Reads `in` (not consumed; must outlive this object). True only if it is a
  // chunk message that ParseChunkPrefix takes; false for any other message,
  // which the caller parses with protobuf (so no input is read two ways).
  // Allocates nothing.
  bool Parse(grpc::ByteBuffer* in);

  // Valid after Parse returned true.
  absl::string_view part() const { return prefix_.part; }  // into this object
  uint64_t offset() const { return prefix_.offset; }       // elements
  uint64_t data_bytes() const { return prefix_.data_bytes; }
  // Copies the data_bytes() bytes of payload to `out`.
  void CopyData(char* out) const;

 private:
  grpc::ByteBuffer* in_ = nullptr;
  char head_[kMaxChunkPrefixBytes];
  ChunkPrefix prefix_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PROTO_CHUNK_SLICES_H_
