#include "ps/raw_push.h"

#include "proto/chunk_slices.h"

namespace kubetrain {

bool AddRawChunk(grpc::ByteBuffer* in, PushAssembler* assembler, absl::Status* status,
                 uint64_t* data_bytes) {
  ChunkSlices chunk;
  if (!chunk.Parse(in)) return false;
  *data_bytes = chunk.data_bytes();
  absl::StatusOr<char*> to =
      assembler->ReserveChunk(chunk.part(), chunk.offset(), chunk.data_bytes());
  if (!to.ok()) {
    *status = to.status();
    return true;
  }
  chunk.CopyData(*to);
  *status = absl::OkStatus();
  return true;
}

}  // namespace kubetrain
