// The wire form of a tensor chunk message, PushRequest{chunk: TensorChunk}
// (proto/ps.proto; PullResponse numbers its chunk field alike), written and
// read by hand so the float payload travels as a slice of its own: the sender
// never copies the floats into a protobuf string, and the receiver copies them
// from the received slices straight into its buffers (issue 25). The bytes
// are exactly protobuf's, so either end may still use protobuf.
#ifndef KUBETRAIN_CORE_PUSH_WIRE_H_
#define KUBETRAIN_CORE_PUSH_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kubetrain {

// Appends to *out what protobuf's serialization of the message
// {chunk: {part, offset, data}} with data_bytes bytes of data writes before
// the data: the data bytes follow it, and end the message.
void AppendChunkPrefix(absl::string_view part, uint64_t offset, uint64_t data_bytes,
                       std::string* out);

// ParseChunkPrefix reads at most this many bytes: a message whose prefix is
// longer (a very long part name) is not taken.
constexpr size_t kMaxChunkPrefixBytes = 256;

struct ChunkPrefix {
  absl::string_view part;  // points into the `head` given to ParseChunkPrefix
  uint64_t offset = 0;
  uint64_t data_bytes = 0;
  size_t size = 0;  // bytes of the prefix; the data follows and ends the message
};

// The prefix of a message of `message_bytes` bytes whose first bytes are
// `head` (all of them, or at least kMaxChunkPrefixBytes). True only if
// protobuf would read the message as exactly one chunk with these fields:
// fields in order, each at most once, the data last and ending the message,
// the part name ASCII (so valid UTF-8, as proto3 demands). False for anything
// else, well formed or not, which the caller hands to protobuf: it accepts or
// refuses that as it always did, so no input is read two ways.
bool ParseChunkPrefix(absl::string_view head, uint64_t message_bytes, ChunkPrefix* out);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_PUSH_WIRE_H_
