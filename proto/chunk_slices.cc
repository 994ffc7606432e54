#include "proto/chunk_slices.h"

#include <algorithm>
#include <cstring>

#include <grpcpp/support/proto_buffer_reader.h>

namespace kubetrain {

bool ChunkSlices::Parse(grpc::ByteBuffer* in) {
  in_ = in;
  size_t head_bytes = 0;
  {
    // Peeks at the slices: no copy, no allocation (the buffer is not consumed).
    grpc::ProtoBufferReader reader(in);
    const void* piece;
    int size;
    while (head_bytes < sizeof(head_) && reader.Next(&piece, &size)) {
      const size_t n = std::min(sizeof(head_) - head_bytes, static_cast<size_t>(size));
      std::memcpy(head_ + head_bytes, piece, n);
      head_bytes += n;
    }
  }
  return ParseChunkPrefix(absl::string_view(head_, head_bytes), in->Length(), &prefix_);
}

void ChunkSlices::CopyData(char* out) const {
  grpc::ProtoBufferReader reader(in_);
  const void* piece;
  int size;
  uint64_t skip = prefix_.size;  // the prefix
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
}

}  // namespace kubetrain
