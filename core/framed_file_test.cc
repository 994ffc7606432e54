#include "core/framed_file.h"

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

constexpr std::string_view kMagic = "KTTEST01";
constexpr uint32_t kVersion = 3;
constexpr size_t kFrameBytes = 8 + 4 + 8 + 4;

absl::StatusOr<std::string> Read(const std::string& path) {
  return ReadFramedFile(path, kMagic, kVersion, "test file");
}

TEST(FramedFileTest, RoundTripCreatesDirsAndLeavesNoTemp) {
  const std::string dir = NewTestDir("framed");
  const std::string path = dir + "/a/b/f.bin";
  const std::string payload("hello\0world", 11);
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, payload).ok());
  auto read = Read(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, payload);
  EXPECT_EQ(ListDir(dir + "/a/b"), std::vector<std::string>{"f.bin"});

  // The layout is the documented one.
  const std::string data = ReadFile(path);
  ASSERT_EQ(data.size(), kFrameBytes + payload.size());
  EXPECT_EQ(data.substr(0, 8), kMagic);
  EXPECT_EQ(data.substr(8, 4), std::string("\x03\0\0\0", 4));
  EXPECT_EQ(data.substr(12, 8), std::string("\x0b\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(data.substr(20, payload.size()), payload);
  const uint32_t crc = static_cast<uint32_t>(
      ::crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  BinaryWriter w;
  w.PutU32(crc);
  EXPECT_EQ(data.substr(20 + payload.size()), w.data());
}

TEST(FramedFileTest, StreamedPayloadIsTheSameFile) {
  const std::string dir = NewTestDir("framed");
  // Fields of every kind, floats past the writer's 1 MiB pieces.
  std::vector<float> floats(700000);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = 0.5f * static_cast<float>(i) - 7;
  auto encode = [&](BinaryWriter& w) {
    w.PutString("job");
    w.PutI64(-5);
    w.PutFloats(floats);
    w.PutU32(7);
    w.PutFloats({});
  };
  BinaryWriter memory;
  encode(memory);
  ASSERT_TRUE(WriteFramedFile(dir + "/a", kMagic, kVersion, memory.data()).ok());
  ASSERT_TRUE(WriteFramedFile(dir + "/b", kMagic, kVersion, encode).ok());
  EXPECT_EQ(ReadFile(dir + "/a"), ReadFile(dir + "/b"));
  auto read = Read(dir + "/b");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, memory.data());
  BinaryWriter counter = BinaryWriter::Counting();
  encode(counter);
  EXPECT_EQ(counter.size(), memory.data().size());
  EXPECT_TRUE(counter.data().empty());

  // An encoder that does not write the same bytes twice is refused.
  int calls = 0;
  absl::Status st = WriteFramedFile(dir + "/c", kMagic, kVersion, [&](BinaryWriter& w) {
    w.PutU32(++calls);
    if (calls > 1) w.PutU32(0);
  });
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("counted 4"), std::string::npos) << st;
  EXPECT_TRUE(absl::IsNotFound(Read(dir + "/c").status()));
}

// ReadFramedFile with a decode callback reads the file a piece at a time:
// fields across the pieces' edges decode as from memory, the checksum still
// covers every byte, and a damaged file reads as one before decode's error.
TEST(FramedFileTest, StreamedDecodeReadsFieldsAcrossPiecesAndChecksEveryByte) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  std::vector<float> big(600000), small(3);  // 2.4 MB: past two 1 MiB pieces
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.25f * static_cast<float>(i) - 3;
  small = {-0.0f, std::numeric_limits<float>::infinity(), 1.5f};
  auto encode = [&](BinaryWriter& w) {
    w.PutString("head");
    for (int i = 0; i < 300000; ++i) w.PutU32(static_cast<uint32_t>(i * 7));  // 1.2 MB of u32s
    w.PutFloats(big);
    w.PutString(std::string(70000, 'x'));
    w.PutFloats(small);
    w.PutI64(-9);
  };
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, encode).ok());
  std::string head, xs;
  std::vector<float> big_read, small_read;
  int64_t last = 0;
  bool u32s_ok = true;
  auto decode = [&](BinaryReader& r) -> absl::Status {
    if (absl::Status st = r.GetString(&head); !st.ok()) return st;
    for (int i = 0; i < 300000; ++i) {
      uint32_t v = 0;
      if (absl::Status st = r.GetU32(&v); !st.ok()) return st;
      u32s_ok = u32s_ok && v == static_cast<uint32_t>(i * 7);
    }
    if (absl::Status st = r.GetFloats(&big_read); !st.ok()) return st;
    if (absl::Status st = r.GetString(&xs); !st.ok()) return st;
    if (absl::Status st = r.GetFloats(&small_read); !st.ok()) return st;
    if (absl::Status st = r.GetI64(&last); !st.ok()) return st;
    return r.ExpectEnd();
  };
  ASSERT_TRUE(ReadFramedFile(path, kMagic, kVersion, "test file", decode).ok());
  EXPECT_EQ(head, "head");
  EXPECT_TRUE(u32s_ok);
  EXPECT_EQ(big_read, big);
  EXPECT_EQ(xs, std::string(70000, 'x'));
  ASSERT_EQ(small_read.size(), 3u);
  EXPECT_TRUE(std::signbit(small_read[0]));
  EXPECT_EQ(small_read[1], small[1]);
  EXPECT_EQ(last, -9);
  // And the whole payload as one string, through the same reader.
  auto whole = Read(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), ReadFile(path).size() - kFrameBytes);

  // A byte flipped where decode never reads (it stops early) is still found.
  const std::string good = ReadFile(path);
  FlipByte(path, good.size() - 100, 0x01);
  auto stop_early = [](BinaryReader& r) {
    std::string s;
    return r.GetString(&s);
  };
  absl::Status st = ReadFramedFile(path, kMagic, kVersion, "test file", stop_early);
  EXPECT_CONTAINS(std::string(st.message()), path + ": checksum mismatch (stored ");
  // A flipped count makes decode fail; the checksum mismatch is what is reported.
  WriteFile(path, good);
  FlipByte(path, kFrameBytes - 4 + 8 + 1200000 + 7, 0x40);  // the top byte of big's count
  st = ReadFramedFile(path, kMagic, kVersion, "test file", decode);
  EXPECT_CONTAINS(std::string(st.message()), path + ": checksum mismatch (stored ");
  // An intact file whose decode fails returns decode's error as it is.
  WriteFile(path, good);
  st = ReadFramedFile(path, kMagic, kVersion, "test file",
                      [](BinaryReader&) { return absl::FailedPreconditionError("no thanks"); });
  EXPECT_EQ(st, absl::FailedPreconditionError("no thanks"));
}

TEST(FramedFileTest, EmptyPayloadAndOverwrite) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, "first").ok());
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, "").ok());
  auto read = Read(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "");
}

TEST(FramedFileTest, WriteErrorNamesPath) {
  const std::string dir = NewTestDir("framed");
  ASSERT_TRUE(WriteFramedFile(dir + "/f.bin", kMagic, kVersion, "x").ok());
  absl::Status st =
      WriteFramedFile(dir + "/f.bin/g.bin", kMagic, kVersion, "x");  // a file as directory
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_CONTAINS(std::string(st.message()), dir + "/f.bin");
}

TEST(FramedFileTest, EveryFlippedByteIsDetected) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, "some payload bytes").ok());
  const std::string good = ReadFile(path);
  for (size_t i = 0; i < good.size(); ++i) {
    WriteFile(path, good);
    FlipByte(path, i, 0x20);
    auto read = Read(path);
    ASSERT_FALSE(read.ok()) << "flipped byte " << i << " not detected";
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << i;
    EXPECT_CONTAINS(std::string(read.status().message()), path + ": ");
  }
}

TEST(FramedFileTest, FlippedPayloadIsChecksumMismatch) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, "some payload bytes").ok());
  FlipByte(path, 25, 0x01);
  auto read = Read(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_CONTAINS(std::string(read.status().message()), path + ": checksum mismatch (stored ");
}

TEST(FramedFileTest, TruncationIsDetected) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  const std::string payload = "0123456789";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, payload).ok());
  const std::string good = ReadFile(path);
  const size_t full = good.size();

  TruncateFile(path, full - 1);
  EXPECT_EQ(Read(path).status().message(),
            absl::StrCat(path, ": truncated: expected ", full, " bytes, found ", full - 1));
  TruncateFile(path, 5);
  EXPECT_EQ(Read(path).status().message(),
            absl::StrCat(path, ": truncated: expected at least 24 bytes, found 5"));
  TruncateFile(path, 0);
  EXPECT_EQ(Read(path).status().message(),
            absl::StrCat(path, ": truncated: expected at least 24 bytes, found 0"));
  for (size_t n = 0; n < full; ++n) {
    WriteFile(path, good.substr(0, n));
    auto read = Read(path);
    ASSERT_FALSE(read.ok()) << n;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << n;
    EXPECT_CONTAINS(std::string(read.status().message()), path + ": truncated") << n;
  }
}

TEST(FramedFileTest, TrailingDataIsCorrupt) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, "abc").ok());
  WriteFile(path, ReadFile(path) + "!");
  EXPECT_EQ(
      Read(path).status().message(),
      absl::StrCat(path,
                   ": corrupt: expected 27 bytes, found 28 (trailing data or a damaged header)"));
}

TEST(FramedFileTest, BadMagic) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, "KTOTHER1", kVersion, "abc").ok());
  auto read = Read(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(read.status().message(), path + ": not a kubetrain test file (bad magic)");
  WriteFile(path, "PK");  // short and not a prefix of the magic
  EXPECT_EQ(Read(path).status().message(), path + ": not a kubetrain test file (bad magic)");
}

TEST(FramedFileTest, WrongVersion) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion + 1, "abc").ok());
  auto read = Read(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(read.status().message(),
            path + ": unsupported test file format version 4 (this build reads version 3)");
}

TEST(FramedFileTest, HugeLengthIsTruncatedWithoutAllocating) {
  const std::string path = NewTestDir("framed") + "/f.bin";
  ASSERT_TRUE(WriteFramedFile(path, kMagic, kVersion, "abc").ok());
  std::string data = ReadFile(path);
  for (int i = 12; i < 20; ++i) data[i] = '\xff';
  WriteFile(path, data);
  auto read = Read(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(
      read.status().message(),
      absl::StrCat(path, ": truncated (or a damaged header): the header promises a payload of ",
                   std::numeric_limits<uint64_t>::max(), " bytes, the file has 27 bytes in all"));
}

TEST(FramedFileTest, MissingFileAndDirectory) {
  const std::string dir = NewTestDir("framed");
  auto read = Read(dir + "/nope.bin");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(std::string(read.status().message()), dir + "/nope.bin: cannot open");
  ASSERT_TRUE(WriteFramedFile(dir + "/f.bin", kMagic, kVersion, "").ok());
  read = Read(dir);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read.status().message(), dir + ": not a regular file");
}

TEST(BinaryCodecTest, RoundTrip) {
  BinaryWriter w;
  w.PutU32(0xdeadbeef);
  w.PutU64(0x0102030405060708ull);
  w.PutI32(-7);
  w.PutI64(std::numeric_limits<int64_t>::min());
  w.PutString("");
  w.PutString(std::string("a\0b", 3));
  w.PutFloats({1.5f, -0.0f, std::numeric_limits<float>::infinity()});
  w.PutFloats({});
  EXPECT_EQ(w.data().substr(0, 4), "\xef\xbe\xad\xde");  // little-endian

  BinaryReader r(w.data());
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  int32_t i32 = 0;
  int64_t i64 = 0;
  std::string s1 = "junk", s2;
  std::vector<float> f1, f2 = {9.0f};
  ASSERT_TRUE(r.GetU32(&u32).ok());
  ASSERT_TRUE(r.GetU64(&u64).ok());
  ASSERT_TRUE(r.GetI32(&i32).ok());
  ASSERT_TRUE(r.GetI64(&i64).ok());
  ASSERT_TRUE(r.GetString(&s1).ok());
  ASSERT_TRUE(r.GetString(&s2).ok());
  ASSERT_TRUE(r.GetFloats(&f1).ok());
  ASSERT_TRUE(r.GetFloats(&f2).ok());
  EXPECT_TRUE(r.ExpectEnd().ok());
  EXPECT_EQ(u32, 0xdeadbeefu);
  EXPECT_EQ(u64, 0x0102030405060708ull);
  EXPECT_EQ(i32, -7);
  EXPECT_EQ(i64, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(s1, "");
  EXPECT_EQ(s2, std::string("a\0b", 3));
  ASSERT_EQ(f1.size(), 3u);
  EXPECT_EQ(f1[0], 1.5f);
  EXPECT_TRUE(std::signbit(f1[1]));
  EXPECT_TRUE(std::isinf(f1[2]));
  EXPECT_TRUE(f2.empty());
}

TEST(BinaryCodecTest, ReaderErrorsAreBoundsChecked) {
  BinaryWriter w;
  w.PutU32(1000);  // a string of 1000 bytes, with 2 present
  w.PutBytes("ab");
  BinaryReader r(w.data());
  std::string s;
  absl::Status st = r.GetString(&s);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "payload ends early at byte 4 (reading string of 1000 bytes)");

  BinaryWriter huge;
  huge.PutU64(std::numeric_limits<uint64_t>::max());  // no allocation follows
  std::vector<float> v;
  st = BinaryReader(huge.data()).GetFloats(&v);
  EXPECT_EQ(st.message(), absl::StrCat("payload ends early at byte 8 (reading tensor of ",
                                       std::numeric_limits<uint64_t>::max(), " floats)"));
  EXPECT_TRUE(v.empty());

  BinaryWriter count;
  count.PutU32(3);
  count.PutBytes("12345678");  // room for 2 items of 4 bytes
  uint32_t n = 0;
  st = BinaryReader(count.data()).GetCount(&n, 4, "names");
  EXPECT_EQ(st.message(), "payload ends early at byte 4 (reading 3 names)");
  BinaryReader ok(count.data());
  EXPECT_TRUE(ok.GetCount(&n, 2, "names").ok());  // 3 items of 2 bytes fit
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(ok.ExpectEnd().message(), "8 unexpected bytes after the last field");

  BinaryReader empty("");
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  EXPECT_EQ(empty.GetU32(&u32).message(), "payload ends early at byte 0 (reading 4-byte integer)");
  EXPECT_EQ(empty.GetU64(&u64).message(), "payload ends early at byte 0 (reading 8-byte integer)");
  EXPECT_TRUE(empty.ExpectEnd().ok());
}

}  // namespace
}  // namespace kubetrain
