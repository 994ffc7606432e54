#include "ps/raw_push.h"

#include <algorithm>
#include <cstring>

#include <grpcpp/support/proto_buffer_reader.h>

#include "core/push_wire.h"

namespace kubetrain {

bool AddRawChunk(grpc::ByteBuffer* in, PushAssembler* assembler, absl::Status* status,
                 uint64_t* data_bytes) {
  const uint64_t message_bytes = in->Length();
  char head[kMaxChunkPrefixBytes];
  size_t head_bytes = 0;
  {
    // Peeks at the slices: no copy, no allocation (the buffer is not consumed).
    grpc::ProtoBufferReader reader(in);
    const void* piece;
    int size;
    while (head_bytes < sizeof(head) && reader.Next(&piece, &size)) {
      const size_t n = std::min(sizeof(head) - head_bytes, static_cast<size_t>(size));
      std::memcpy(head + head_bytes, piece, n);
      head_bytes += n;
    }
  }
  ChunkPrefix chunk;
  if (!ParseChunkPrefix(absl::string_view(head, head_bytes), message_bytes, &chunk)) return false;
  *data_bytes = chunk.data_bytes;
  absl::StatusOr<char*> to = assembler->ReserveChunk(chunk.part, chunk.offset, chunk.data_bytes);
  if (!to.ok()) {
    *status = to.status();
    return true;
  }
  grpc::ProtoBufferReader reader(in);
  const void* piece;
  int size;
  uint64_t skip = chunk.size;  // the prefix
  char* out = *to;
  while (reader.Next(&piece, &size)) {
    const uint64_t n = static_cast<uint64_t>(size);
    if (n <= skip) {
      skip -= n;
      continue;
    }
    std::memcpy(out, static_cast<const char*>(piece) + skip, n - skip);
    out += n - skip;
    skip = 0;
  }
  *status = absl::OkStatus();
  return true;
}

}  // namespace kubetrain
