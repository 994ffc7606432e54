// The PS's read of a pushed chunk message without protobuf: the gRPC side of
// core/push_wire.h, between the received slices and a PushAssembler.
#ifndef KUBETRAIN_PS_RAW_PUSH_H_
#define KUBETRAIN_PS_RAW_PUSH_H_

#include <cstdint>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "ps/shard_wire.h"

namespace kubetrain {

// If `in` is a chunk message that ParseChunkPrefix takes, hands it to the
// assembler (ReserveChunk), copies its data from the slices straight into the
// push's buffer, and returns true with *status the assembler's answer and
// *data_bytes the chunk's data bytes. Returns false, having touched nothing,
// for any other message: the caller parses that with protobuf, which accepts
// or refuses it as always. `in` is read, not consumed; nothing is allocated.
bool AddRawChunk(grpc::ByteBuffer* in, PushAssembler* assembler, absl::Status* status,
                 uint64_t* data_bytes);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_RAW_PUSH_H_
