// BulkSocket's framing (proto/bulk_wire.h) on a socketpair: what both ends of
// the bulk data plane rely on. Frames round trip with their data in pieces;
// data is read in place or skipped; every frame that is not one, and every
// way a connection ends (closed, silent past the deadline), is the error the
// header promises.
#include "proto/bulk_wire.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

// Two connected ends; BulkSocket works on any stream socket.
struct Pair {
  explicit Pair(BulkLimits limits = BulkLimits()) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = std::make_unique<BulkSocket>(fds[0], limits);
    b = std::make_unique<BulkSocket>(fds[1], limits);
  }
  std::unique_ptr<BulkSocket> a;
  std::unique_ptr<BulkSocket> b;
};

// A frame head as the wire has it (magic, meta bytes LE32, data bytes LE64).
std::string Head(absl::string_view magic, uint32_t meta_bytes, uint64_t data_bytes) {
  std::string head(magic);
  for (int i = 0; i < 4; ++i) head.push_back(static_cast<char>(meta_bytes >> (8 * i)));
  for (int i = 0; i < 8; ++i) head.push_back(static_cast<char>(data_bytes >> (8 * i)));
  return head;
}

void WriteRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

v1::BulkFrame ChunkFrame(const std::string& part, uint64_t offset) {
  v1::BulkFrame frame;
  frame.mutable_push()->mutable_chunk()->set_part(part);
  frame.mutable_push()->mutable_chunk()->set_offset(offset);
  return frame;
}

TEST(BulkWireTest, AFrameRoundTripsWithItsDataInSeveralPieces) {
  Pair p;
  const std::string one = "abcd", two(1000, 'x'), three = "0123456789ab";
  const std::vector<absl::string_view> pieces = {one, "", two, three};
  ASSERT_TRUE(p.a->WriteFrame(ChunkFrame("dense0/kernel", 7), pieces).ok());
  v1::BulkFrame got;
  uint64_t data_bytes = 0;
  ASSERT_TRUE(p.b->ReadFrame(&got, &data_bytes).ok());
  EXPECT_EQ(got.push().chunk().part(), "dense0/kernel");
  EXPECT_EQ(got.push().chunk().offset(), 7u);
  ASSERT_EQ(data_bytes, one.size() + two.size() + three.size());
  // The data straight into the caller's buffer, its pieces joined in order.
  std::string data(data_bytes, '\0');
  ASSERT_TRUE(p.b->ReadData(data.data(), data_bytes).ok());
  EXPECT_EQ(data, one + two + three);
}

TEST(BulkWireTest, ManyFramesWithLargeDataRoundTripInOrder) {
  // More than a socket buffer holds, so the writer blocks and sendmsg
  // resumes part way through its pieces.
  Pair p;
  std::vector<std::string> sent;
  for (int i = 0; i < 8; ++i)
    sent.push_back(std::string(300000 + 4 * i, static_cast<char>('a' + i)));
  std::thread writer([&] {
    for (size_t i = 0; i < sent.size(); ++i) {
      const absl::string_view half1(sent[i].data(), sent[i].size() / 2);
      const absl::string_view half2(sent[i].data() + half1.size(), sent[i].size() - half1.size());
      const std::vector<absl::string_view> pieces = {half1, half2};
      ASSERT_TRUE(p.a->WriteFrame(ChunkFrame("p", i), pieces).ok());
    }
  });
  for (size_t i = 0; i < sent.size(); ++i) {
    v1::BulkFrame got;
    uint64_t n = 0;
    ASSERT_TRUE(p.b->ReadFrame(&got, &n).ok());
    EXPECT_EQ(got.push().chunk().offset(), i);
    std::string data(n, '\0');
    ASSERT_TRUE(p.b->ReadData(data.data(), n).ok());
    EXPECT_EQ(data, sent[i]) << "frame " << i;
  }
  writer.join();
}

TEST(BulkWireTest, SkippedDataLeavesTheStreamAtTheNextFrame) {
  Pair p;
  const std::string big(200000, 'z');  // more than SkipData's scratch buffer
  const absl::string_view piece(big);
  ASSERT_TRUE(p.a->WriteFrame(ChunkFrame("skipped", 1), absl::MakeConstSpan(&piece, 1)).ok());
  ASSERT_TRUE(p.a->WriteFrame(BulkStatusFrame(absl::NotFoundError("next"))).ok());
  v1::BulkFrame got;
  uint64_t n = 0;
  ASSERT_TRUE(p.b->ReadFrame(&got, &n).ok());
  ASSERT_EQ(n, big.size());
  ASSERT_TRUE(p.b->SkipData(n).ok());
  ASSERT_TRUE(p.b->ReadFrame(&got, &n).ok());
  EXPECT_EQ(n, 0u);
  ASSERT_TRUE(got.has_status());
  EXPECT_EQ(FromBulkStatus(got.status()), absl::NotFoundError("next"));
}

TEST(BulkWireTest, AFrameWithBadMagicIsInvalidArgument) {
  Pair p;
  WriteRaw(p.a->fd(), Head("HTTP", 0, 0));
  v1::BulkFrame got;
  uint64_t n = 0;
  const absl::Status s = p.b->ReadFrame(&got, &n);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("bad magic"), std::string::npos) << s;
}

TEST(BulkWireTest, MetaOrDataOverTheLimitsIsInvalidArgumentNamingTheSizes) {
  BulkLimits limits;
  limits.max_meta_bytes = 100;
  limits.max_data_bytes = 1000;
  {
    Pair p(limits);
    WriteRaw(p.a->fd(), Head("KTB1", 101, 0));
    v1::BulkFrame got;
    uint64_t n = 0;
    const absl::Status s = p.b->ReadFrame(&got, &n);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("101 meta"), std::string::npos) << s;
    EXPECT_NE(s.message().find("(100 and 1000)"), std::string::npos) << s;
  }
  {
    Pair p(limits);
    WriteRaw(p.a->fd(), Head("KTB1", 0, 1001));
    v1::BulkFrame got;
    uint64_t n = 0;
    const absl::Status s = p.b->ReadFrame(&got, &n);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("1001 data"), std::string::npos) << s;
  }
  {
    // A data size that does not fit in 32 bits is read whole (64-bit field).
    Pair p(limits);
    WriteRaw(p.a->fd(), Head("KTB1", 0, uint64_t{1} << 40));
    v1::BulkFrame got;
    uint64_t n = 0;
    const absl::Status s = p.b->ReadFrame(&got, &n);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(absl::StrCat(uint64_t{1} << 40, " data")), std::string::npos) << s;
  }
  {
    // Exactly at the limits is a frame.
    Pair p(limits);
    v1::BulkFrame frame;
    frame.mutable_status()->set_message(std::string(90, 'm'));
    ASSERT_LE(frame.ByteSizeLong(), 100u);
    const std::string data(1000, 'd');
    const absl::string_view piece(data);
    ASSERT_TRUE(p.a->WriteFrame(frame, absl::MakeConstSpan(&piece, 1)).ok());
    v1::BulkFrame got;
    uint64_t n = 0;
    ASSERT_TRUE(p.b->ReadFrame(&got, &n).ok());
    EXPECT_EQ(n, 1000u);
  }
}

TEST(BulkWireTest, MetaThatIsNotABulkFrameIsInvalidArgument) {
  Pair p;
  // A length-delimited field whose length runs past the meta's end.
  const std::string meta(
      "\x0a\x05"
      "ab",
      4);
  WriteRaw(p.a->fd(), Head("KTB1", meta.size(), 0) + meta);
  v1::BulkFrame got;
  uint64_t n = 0;
  const absl::Status s = p.b->ReadFrame(&got, &n);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("not a valid BulkFrame"), std::string::npos) << s;
}

TEST(BulkWireTest, APeerThatClosedIsUnavailableWhereverTheReadStops) {
  v1::BulkFrame got;
  uint64_t n = 0;
  {
    // Before a head.
    Pair p;
    p.a.reset();
    EXPECT_TRUE(absl::IsUnavailable(p.b->ReadFrame(&got, &n)));
  }
  {
    // In the middle of a head.
    Pair p;
    WriteRaw(p.a->fd(), "KTB1");
    p.a.reset();
    EXPECT_TRUE(absl::IsUnavailable(p.b->ReadFrame(&got, &n)));
  }
  {
    // In the middle of the data.
    Pair p;
    const std::string data(100, 'd');
    const absl::string_view piece(data);
    ASSERT_TRUE(p.a->WriteFrame(ChunkFrame("p", 0), absl::MakeConstSpan(&piece, 1)).ok());
    v1::BulkFrame frame;
    ASSERT_TRUE(p.b->ReadFrame(&frame, &n).ok());
    std::string half(50, '\0');
    ASSERT_TRUE(p.b->ReadData(half.data(), 50).ok());
    p.a.reset();
    std::string rest(100, '\0');
    EXPECT_TRUE(absl::IsUnavailable(p.b->ReadData(rest.data(), 100)));
  }
  {
    // Writing to a closed peer: no SIGPIPE, UNAVAILABLE.
    Pair p;
    p.b.reset();
    const std::string data(1 << 20, 'd');
    const absl::string_view piece(data);
    EXPECT_TRUE(
        absl::IsUnavailable(p.a->WriteFrame(ChunkFrame("p", 0), absl::MakeConstSpan(&piece, 1))));
  }
}

TEST(BulkWireTest, AReadPastItsDeadlineIsDeadlineExceeded) {
  Pair p;
  v1::BulkFrame got;
  uint64_t n = 0;
  // Nothing at all.
  absl::Status s = p.b->ReadFrame(&got, &n, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  // A deadline already past times out too instead of blocking.
  s = p.b->ReadFrame(&got, &n, absl::Now() - absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST(BulkWireTest, ATrickleOfBytesDoesNotStretchTheDeadline) {
  // A peer that sends a byte now and then must not keep a read alive past
  // its deadline (each byte restarting the wait): the read gives up at the
  // deadline with the frame half read.
  Pair p;
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const std::string head = Head("KTB1", 0, 0);
    for (size_t i = 0; i + 1 < head.size() && !stop.load(); ++i) {
      if (::write(p.a->fd(), head.data() + i, 1) != 1) return;
      absl::SleepFor(absl::Milliseconds(250));  // within each wait: it never times out idle
    }
  });
  v1::BulkFrame got;
  uint64_t n = 0;
  const absl::Time start = absl::Now();
  const absl::Status s = p.b->ReadFrame(&got, &n, start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  stop = true;
  trickle.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  // The trickle lasts 3.75 s (15 bytes, 250 ms apart); the deadline is 1 s.
  // A loaded machine may be late, but not by most of the trickle.
  EXPECT_LT(took, absl::Seconds(3)) << took;
}

TEST(BulkWireTest, PeerGoneSeesACloseAndUnaskedDataButNotSilence) {
  {
    Pair p;
    EXPECT_FALSE(p.b->PeerGone());
    p.a.reset();
    EXPECT_TRUE(p.b->PeerGone());
  }
  {
    Pair p;
    ASSERT_TRUE(p.a->WriteFrame(BulkStatusFrame(absl::OkStatus())).ok());
    EXPECT_TRUE(p.b->PeerGone());
  }
  {
    // ShutdownBoth from another thread wakes a blocked read: UNAVAILABLE.
    Pair p;
    std::thread stopper([&] {
      absl::SleepFor(absl::Milliseconds(20));
      p.b->ShutdownBoth();
    });
    v1::BulkFrame got;
    uint64_t n = 0;
    const absl::Status s = p.b->ReadFrame(&got, &n, absl::Now() + absl::Seconds(30));
    stopper.join();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  }
}

TEST(BulkWireTest, AStatusRoundTripsThroughItsFrame) {
  for (const absl::Status& s :
       {absl::OkStatus(), absl::InvalidArgumentError("push: malformed"),
        absl::UnauthenticatedError("who are you"), absl::UnavailableError("ps:0 is stopping"),
        absl::DeadlineExceededError("")}) {
    const v1::BulkFrame frame = BulkStatusFrame(s);
    ASSERT_TRUE(frame.has_status());
    EXPECT_EQ(FromBulkStatus(frame.status()), s);
  }
  // A code absl does not have (a newer peer, or garbage) is UNKNOWN, naming it.
  v1::BulkStatus odd;
  odd.set_code(17);
  odd.set_message("what");
  absl::Status s = FromBulkStatus(odd);
  EXPECT_TRUE(absl::IsUnknown(s)) << s;
  EXPECT_NE(s.message().find("17"), std::string::npos) << s;
  EXPECT_NE(s.message().find("what"), std::string::npos) << s;
  odd.set_code(-1);
  EXPECT_TRUE(absl::IsUnknown(FromBulkStatus(odd)));
}

TEST(BulkWireTest, HostOfAddressTakesTheHostOfEveryTargetForm) {
  EXPECT_EQ(HostOfAddress("h:1"), "h");
  EXPECT_EQ(HostOfAddress("ps-0.job.svc:2222"), "ps-0.job.svc");
  EXPECT_EQ(HostOfAddress("127.0.0.1:5"), "127.0.0.1");
  EXPECT_EQ(HostOfAddress("[::1]:5"), "::1");
  EXPECT_EQ(HostOfAddress("h"), "h");
}

TEST(BulkWireTest, BulkLimitsForAChunkSizeAdmitThatChunkAndItsSparseIds) {
  const BulkLimits l = BulkLimitsFor(64 << 10);
  EXPECT_EQ(l.max_data_bytes, 64u << 10);
  // A sparse frame of 64 KiB of one-float rows: 16384 ids of up to 10 bytes.
  EXPECT_GE(l.max_meta_bytes, 16384u * 10);
  EXPECT_EQ(BulkLimitsFor(0).max_data_bytes, 4u);
}

TEST(BulkWireTest, ConnectBulkToAClosedPortIsUnavailableNamingTheAddress) {
  int port = 0;
  absl::StatusOr<int> fd = ListenBulk("127.0.0.1", 0, &port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_GT(port, 0);
  {
    auto s = ConnectBulk("127.0.0.1", port, absl::Seconds(5), BulkLimits());
    ASSERT_TRUE(s.ok()) << s.status();
  }
  ::close(*fd);  // nobody listens there now
  auto s = ConnectBulk("127.0.0.1", port, absl::Seconds(5), BulkLimits());
  EXPECT_TRUE(absl::IsUnavailable(s.status())) << s.status();
  EXPECT_NE(s.status().message().find(absl::StrCat("127.0.0.1:", port)), std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace kubetrain
