#include "proto/chunk_slices.h"

#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace kubetrain {
namespace {

std::string Floats(size_t n) {
  std::string data(n * 4, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + 5);
  return data;
}

// `wire` as gRPC may hand it over: in slices cut at `cuts` (byte positions).
grpc::ByteBuffer InSlices(const std::string& wire, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t to : cuts) {
    slices.emplace_back(wire.data() + from, to - from);
    from = to;
  }
  slices.emplace_back(wire.data() + from, wire.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(ChunkSlices, ReadsAPulledChunkAcrossAnySliceCuts) {
  v1::PullResponse msg;
  msg.mutable_chunk()->set_part("dense0/kernel/part1");
  msg.mutable_chunk()->set_offset(123456);
  const std::string data = Floats(1000);
  msg.mutable_chunk()->set_data(data);
  const std::string wire = msg.SerializeAsString();
  // Cuts inside the prefix (the part name, the length varints), at the
  // payload's first byte and inside it.
  for (const std::vector<size_t>& cuts : std::vector<std::vector<size_t>>{
           {}, {1}, {3, 10}, {25, 26, 27}, {wire.size() - data.size()}, {100, 2000, 3999}}) {
    grpc::ByteBuffer in = InSlices(wire, cuts);
    ChunkSlices chunk;
    ASSERT_TRUE(chunk.Parse(&in));
    EXPECT_EQ(chunk.part(), "dense0/kernel/part1");
    EXPECT_EQ(chunk.offset(), 123456u);
    ASSERT_EQ(chunk.data_bytes(), data.size());
    std::string out(data.size(), '\0');
    chunk.CopyData(out.data());
    EXPECT_EQ(out, data);
    EXPECT_EQ(in.Length(), wire.size());  // read, not consumed
  }
}

TEST(ChunkSlices, LeavesEveryOtherMessageToProtobuf) {
  v1::PullResponse header;
  header.mutable_header()->set_version(7);
  v1::PullResponse push;
  push.mutable_push()->set_version(3);
  // A chunk protobuf reads, but not in the canonical field order.
  v1::TensorChunk c;
  c.set_data(Floats(4));
  std::string reordered = "\x12";  // field 2 (chunk), length-delimited
  std::string body;
  body += '\x1a';  // data first
  body += static_cast<char>(c.data().size());
  body += c.data();
  body += '\x0a';  // then the part
  body += '\x01';
  body += 'w';
  reordered += static_cast<char>(body.size());
  reordered += body;
  v1::PullResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(reordered));
  ASSERT_TRUE(parsed.has_chunk());
  for (const std::string& wire : {header.SerializeAsString(), push.SerializeAsString(), reordered,
                                  std::string("\xff\xff", 2)}) {
    grpc::ByteBuffer in = InSlices(wire, {});
    ChunkSlices chunk;
    EXPECT_FALSE(chunk.Parse(&in));
  }
}

}  // namespace
}  // namespace kubetrain
