#include "core/push_wire.h"

namespace kubetrain {
namespace {

// Wire tags: (field number << 3) | wire type (0 varint, 2 length-delimited).
constexpr char kChunkTag = (2 << 3) | 2;   // PushRequest.chunk / PullResponse.chunk
constexpr char kPartTag = (1 << 3) | 2;    // TensorChunk.part
constexpr char kOffsetTag = (2 << 3) | 0;  // TensorChunk.offset
constexpr char kDataTag = (3 << 3) | 2;    // TensorChunk.data

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads a varint at *pos, below `end`. False for one that runs past `end` or
// does not fit 64 bits (protobuf's limit is 10 bytes; refusing the overflow
// leaves the edge cases to protobuf itself).
bool ReadVarint(absl::string_view bytes, size_t end, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= end) return false;
    const uint64_t b = static_cast<unsigned char>(bytes[(*pos)++]);
    if (shift == 63 && b > 1) return false;
    *v |= (b & 0x7f) << shift;
    if (b < 0x80) return true;
  }
  return false;
}

}  // namespace

void AppendChunkPrefix(absl::string_view part, uint64_t offset, uint64_t data_bytes,
                       std::string* out) {
  // proto3 writes a field only if it is not its default ("", 0, empty).
  uint64_t chunk_bytes = 0;
  if (!part.empty()) chunk_bytes += 1 + VarintSize(part.size()) + part.size();
  if (offset != 0) chunk_bytes += 1 + VarintSize(offset);
  if (data_bytes != 0) chunk_bytes += 1 + VarintSize(data_bytes) + data_bytes;
  out->push_back(kChunkTag);
  AppendVarint(chunk_bytes, out);
  if (!part.empty()) {
    out->push_back(kPartTag);
    AppendVarint(part.size(), out);
    out->append(part.data(), part.size());
  }
  if (offset != 0) {
    out->push_back(kOffsetTag);
    AppendVarint(offset, out);
  }
  if (data_bytes != 0) {
    out->push_back(kDataTag);
    AppendVarint(data_bytes, out);
  }
}

bool ParseChunkPrefix(absl::string_view head, uint64_t message_bytes, ChunkPrefix* out) {
  // Every read below stays inside `head`; lengths are checked against the
  // whole message before anything is taken from them.
  const size_t end = head.size();
  if (end > message_bytes) return false;  // not the head of this message
  size_t pos = 0;
  if (end == 0 || head[pos++] != kChunkTag) return false;
  uint64_t chunk_bytes;
  if (!ReadVarint(head, end, &pos, &chunk_bytes)) return false;
  if (chunk_bytes != message_bytes - pos) return false;  // the chunk is the whole message
  ChunkPrefix p;
  if (pos < end && head[pos] == kPartTag) {
    ++pos;
    uint64_t n;
    if (!ReadVarint(head, end, &pos, &n) || n > end - pos) return false;
    p.part = head.substr(pos, n);
    for (char c : p.part) {
      if (static_cast<unsigned char>(c) >= 0x80) return false;
    }
    pos += n;
  }
  if (pos < end && head[pos] == kOffsetTag) {
    ++pos;
    if (!ReadVarint(head, end, &pos, &p.offset)) return false;
  }
  if (pos < end && head[pos] == kDataTag) {
    ++pos;
    if (!ReadVarint(head, end, &pos, &p.data_bytes)) return false;
    if (p.data_bytes != message_bytes - pos) return false;  // the data ends the message
  } else if (pos != message_bytes) {
    return false;  // another field, a repeated one, or fields out of order
  }
  p.size = pos;
  *out = p;
  return true;
}

}  // namespace kubetrain
