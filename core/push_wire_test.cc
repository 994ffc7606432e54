#include "core/push_wire.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace kubetrain {
namespace {

std::string Serialized(const std::string& part, uint64_t offset, const std::string& data) {
  v1::PushRequest msg;
  auto* c = msg.mutable_chunk();
  c->set_part(part);
  c->set_offset(offset);
  c->set_data(data);
  return msg.SerializeAsString();
}

std::string Floats(size_t n) {
  std::string data(n * 4, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
  return data;
}

TEST(PushWire, PrefixPlusDataIsProtobufsEncoding) {
  // Elements chosen so the lengths' varints take 1, 2, 3 and 4 bytes (the
  // last is over 2^21 bytes), with parts and offsets of several sizes,
  // including every default value proto3 leaves out.
  const std::vector<size_t> elements = {0, 1, 31, 32, 4096, (size_t{1} << 19) + 3};
  const std::vector<uint64_t> offsets = {0, 1, 127, 128, uint64_t{1} << 35, UINT64_MAX};
  const std::vector<std::string> parts = {"", "w", "dense0/kernel/part1", std::string(200, 'p')};
  for (size_t n : elements) {
    const std::string data = Floats(n);
    for (uint64_t offset : offsets) {
      for (const std::string& part : parts) {
        std::string wire;
        AppendChunkPrefix(part, offset, data.size(), &wire);
        const size_t prefix = wire.size();
        wire += data;
        ASSERT_EQ(wire, Serialized(part, offset, data))
            << n << " elements, offset " << offset << ", part of " << part.size();

        ChunkPrefix p;
        ASSERT_TRUE(ParseChunkPrefix(
            absl::string_view(wire).substr(0, std::min(wire.size(), kMaxChunkPrefixBytes)),
            wire.size(), &p));
        EXPECT_EQ(p.part, part);
        EXPECT_EQ(p.offset, offset);
        EXPECT_EQ(p.data_bytes, data.size());
        EXPECT_EQ(p.size, prefix);
      }
    }
  }
}

TEST(PushWire, AppendsToWhatIsThere) {
  std::string wire = "x";
  AppendChunkPrefix("w", 1, 4, &wire);
  EXPECT_EQ(wire, "x" + Serialized("w", 1, "abcd").substr(0, wire.size() - 1));
}

bool Parses(const std::string& wire) {
  ChunkPrefix p;
  return ParseChunkPrefix(
      absl::string_view(wire).substr(0, std::min(wire.size(), kMaxChunkPrefixBytes)), wire.size(),
      &p);
}

TEST(PushWire, LeavesEverythingElseToProtobuf) {
  const std::string chunk = Serialized("w", 5, Floats(2));
  ASSERT_TRUE(Parses(chunk));
  v1::PushRequest header;
  header.mutable_header()->set_worker_index(1);
  EXPECT_FALSE(Parses(header.SerializeAsString()));
  v1::PushRequest rows;
  rows.mutable_sparse()->set_table("t");
  EXPECT_FALSE(Parses(rows.SerializeAsString()));
  EXPECT_FALSE(Parses(""));
  EXPECT_FALSE(Parses(chunk + chunk));        // two chunks: protobuf merges them
  EXPECT_FALSE(Parses(chunk + "\x08\x01"));   // a field after the chunk
  EXPECT_FALSE(Parses(chunk.substr(0, 10)));  // cut short
  // Fields out of order, or twice (protobuf takes the last).
  EXPECT_FALSE(Parses(std::string("\x12\x05\x10\x05\x0a\x01w", 7)));
  EXPECT_FALSE(Parses(std::string("\x12\x06\x0a\x01w\x0a\x01v", 8)));
  EXPECT_FALSE(Parses(std::string("\x12\x04\x10\x01\x10\x02", 6)));
  // An unknown field inside the chunk.
  EXPECT_FALSE(Parses(std::string("\x12\x05\x0a\x01w\x20\x01", 7)));
  // A part name that is not ASCII (proto3 refuses invalid UTF-8).
  EXPECT_FALSE(Parses(Serialized("\xc3\xa9", 0, Floats(1))));
  // A part name longer than the prefix this reads.
  EXPECT_FALSE(Parses(Serialized(std::string(kMaxChunkPrefixBytes, 'p'), 0, Floats(1))));
  // A varint past 64 bits.
  EXPECT_FALSE(Parses(std::string("\x12\x0b\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 13)));
  // Not protobuf's, but the same message: an explicit zero offset, empty data.
  EXPECT_TRUE(Parses(std::string("\x12\x07\x0a\x01w\x10\x00\x1a\x00", 9)));
  // An empty chunk (the assembler refuses its empty part name, as it would
  // from protobuf).
  EXPECT_TRUE(Parses(std::string("\x12\x00", 2)));
}

// Whatever this takes, protobuf reads as the same chunk and nothing else:
// mutations of valid messages, byte by byte.
TEST(PushWire, TakesNothingProtobufReadsOtherwise) {
  std::mt19937 rng(25);
  const std::vector<std::string> seeds = {Serialized("w", 5, Floats(3)), Serialized("", 0, ""),
                                          Serialized("dense0/kernel", 300, Floats(40))};
  int taken = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string wire = seeds[i % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (wire.size() + 1);
      switch (rng() % 3) {
        case 0:
          if (at < wire.size()) wire[at] = static_cast<char>(rng());
          break;
        case 1:
          wire.insert(at, 1, static_cast<char>(rng()));
          break;
        default:
          if (at < wire.size()) wire.erase(at, 1);
      }
    }
    ChunkPrefix p;
    if (!ParseChunkPrefix(
            absl::string_view(wire).substr(0, std::min(wire.size(), kMaxChunkPrefixBytes)),
            wire.size(), &p)) {
      continue;
    }
    ++taken;
    v1::PushRequest msg;
    ASSERT_TRUE(msg.ParseFromString(wire)) << i;
    ASSERT_TRUE(msg.has_chunk() && !msg.has_header() && !msg.has_sparse()) << i;
    EXPECT_EQ(msg.chunk().part(), p.part) << i;
    EXPECT_EQ(msg.chunk().offset(), p.offset) << i;
    EXPECT_EQ(msg.chunk().data(), wire.substr(p.size)) << i;
    EXPECT_EQ(p.data_bytes, wire.size() - p.size) << i;
    EXPECT_TRUE(msg.GetReflection()->GetUnknownFields(msg).empty()) << i;
    EXPECT_TRUE(msg.chunk().GetReflection()->GetUnknownFields(msg.chunk()).empty()) << i;
  }
  EXPECT_GT(taken, 1000);  // the mutations do reach the parser's accepting paths
}

}  // namespace
}  // namespace kubetrain
