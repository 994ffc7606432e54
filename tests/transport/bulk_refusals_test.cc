// The bulk data plane refuses what it must (tests/transport/bulk_fixture.h):
// hostile input on a raw connection (garbage, an incomplete or malformed
// push, a connection closed mid-push, an idle push) is refused, changes
// nothing and never stops the server; tokens are checked on the hello and
// every call is authorized for the task it names.
#include "tests/transport/bulk_fixture.h"

namespace kubetrain {
namespace bulk_testing {
namespace {

TEST_F(BulkRoundTripTest, GarbageBytesAreRefusedAndTheServerGoesOn) {
  const std::string before = ShardBytes();
  {
    // Not a bulk client at all (an HTTP request on the wrong port): the
    // status says why, then the connection closes.
    auto socket = ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimits());
    ASSERT_TRUE(socket.ok()) << socket.status();
    const std::string http = "GET / HTTP/1.1\r\nHost: ps-0\r\n\r\n";
    ASSERT_EQ(::write((*socket)->fd(), http.data(), http.size()),
              static_cast<ssize_t>(http.size()));
    const absl::Status s = ReadStatus(socket->get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("bad magic"), std::string::npos) << s;
    EXPECT_TRUE(ClosedByServer(socket->get()));
  }
  {
    // Garbage after a good hello, in place of a call.
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    const std::string junk(64, '\x5a');
    ASSERT_EQ(::write(socket->fd(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    EXPECT_TRUE(absl::IsInvalidArgument(ReadStatus(socket.get())));
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  {
    // A call that starts with what only the server sends.
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    ASSERT_TRUE(socket->WriteFrame(BulkStatusFrame(absl::OkStatus())).ok());
    const absl::Status s = ReadStatus(socket.get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("must start with a pull or a push"), std::string::npos) << s;
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  {
    // A connection whose first frame is not a hello.
    auto socket = ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimits());
    ASSERT_TRUE(socket.ok());
    v1::BulkFrame pull;
    pull.mutable_pull();
    ASSERT_TRUE((*socket)->WriteFrame(pull).ok());
    const absl::Status s = ReadStatus(socket->get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("first frame must be its hello"), std::string::npos) << s;
  }
  ExpectUnchanged(before);
  ExpectAFreshChannelPulls();
}

TEST_F(BulkRoundTripTest, APushEndedBeforeItsGradientIsIncompleteAndChangesNothing) {
  const std::string before = ShardBytes();
  auto socket = RawConnect();
  ASSERT_NE(socket, nullptr);
  // The header, then the end at once: no gradient at all.
  ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0)).ok());
  ASSERT_TRUE(WriteEnd(socket.get()).ok());
  absl::Status s = ReadStatus(socket.get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("incomplete gradient"), std::string::npos) << s;
  // Some chunks, then the end.
  ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0)).ok());
  WriteChunks(socket.get(), Filled(1.0f), 3);
  ASSERT_TRUE(WriteEnd(socket.get(), /*pull=*/true).ok());
  int answers = 0;
  s = ReadStatus(socket.get(), &answers);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("incomplete gradient"), std::string::npos) << s;
  EXPECT_EQ(answers, 0);  // a refused PushPull never pulls
  // The stream is still in step: the same connection serves a pull.
  v1::BulkFrame pull;
  pull.mutable_pull();
  ASSERT_TRUE(socket->WriteFrame(pull).ok());
  answers = 0;
  EXPECT_TRUE(ReadStatus(socket.get(), &answers).ok());
  EXPECT_GT(answers, 1);  // the header and the chunks
  ExpectUnchanged(before);
  EXPECT_EQ(shard()->stats().pushes_rejected, 2);
  // Nothing of worker 0's waits in the step: worker 1 alone does not make it.
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f))).ok());
  EXPECT_EQ(shard()->version(), 0);
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  EXPECT_EQ(shard()->version(), 1);
}

TEST_F(BulkRoundTripTest, AMalformedChunkIsRefusedClosesTheConnectionAndChangesNothing) {
  const std::string before = ShardBytes();
  const std::string& part0 = shard()->parts()[0].name;
  const std::string floats(400, '\0');
  struct Case {
    const char* what;
    std::function<void(BulkSocket*)> send;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a chunk for an unknown part",
       [&](BulkSocket* s) { ASSERT_TRUE(WriteChunk(s, "no/such/part", 0, floats).ok()); },
       "unknown variable part \"no/such/part\""},
      {"a chunk of 6 bytes",
       [&](BulkSocket* s) { ASSERT_TRUE(WriteChunk(s, part0, 0, "abcdef").ok()); },
       "not a whole number of float32"},
      {"a chunk that leaves a gap",
       [&](BulkSocket* s) { ASSERT_TRUE(WriteChunk(s, part0, 8, floats).ok()); }, "do not follow"},
      {"a chunk with more data than the limit",
       [&](BulkSocket* s) {
         const std::string big(2 * kChunk, '\0');
         ASSERT_TRUE(WriteChunk(s, part0, 0, big).ok());
       },
       "over the limits"},
      {"a chunk with its floats inside the meta",
       [&](BulkSocket* s) {
         v1::BulkFrame frame;
         frame.mutable_push()->mutable_chunk()->set_part(part0);
         frame.mutable_push()->mutable_chunk()->set_data(floats);
         ASSERT_TRUE(s->WriteFrame(frame).ok());
       },
       "malformed bulk frame"},
      {"a pull in the middle of a push",
       [&](BulkSocket* s) {
         v1::BulkFrame frame;
         frame.mutable_pull();
         ASSERT_TRUE(s->WriteFrame(frame).ok());
       },
       "malformed bulk frame"},
      {"a second header",
       [&](BulkSocket* s) { ASSERT_TRUE(WritePushHeader(s, Header(0, 0)).ok()); },
       "malformed bulk frame"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0)).ok());
    WriteChunks(socket.get(), Filled(1.0f), 1);  // a good chunk first
    c.send(socket.get());
    const absl::Status s = ReadStatus(socket.get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
    // The stream is out of step: the server closes it.
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  ExpectUnchanged(before);
  EXPECT_EQ(shard()->stats().pushes_rejected, static_cast<int64_t>(cases.size()));
  ExpectAFreshChannelPulls();
  // Worker 0 has nothing waiting in the step.
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f))).ok());
  EXPECT_EQ(shard()->version(), 0);
}

TEST_F(BulkRoundTripTest, AConnectionClosedInTheMiddleOfAPushAppliesNothing) {
  const std::string before = ShardBytes();
  const Grads g = Filled(1.0f);
  // Half a gradient; then the whole gradient but no `end` (the bulk twin of
  // a gRPC push cancelled after its last chunk).
  for (int chunks : {5, -1}) {
    SCOPED_TRACE(chunks);
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    const double read = BulkPushBytes();
    ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0, /*push_id=*/7)).ok());
    const uint64_t sent = WriteChunks(socket.get(), g, chunks);
    ASSERT_TRUE(Eventually([&] { return BulkPushBytes() == read + sent; }));
    socket.reset();
    // The server saw the connection end and let go of the push.
    ASSERT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 0; }));
    ExpectUnchanged(before);
  }
  // Worker 1 alone does not make the step: worker 0's gradient is not in it ...
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(g)).ok());
  EXPECT_EQ(shard()->version(), 0);
  // ... and worker 0's retry (same push id) is the one that counts, once.
  auto retry = channel_->Push(Header(0, 0, /*push_id=*/7), ChunksOf(g));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->version(), 1);
  EXPECT_FALSE(retry->dropped());
  EXPECT_EQ(shard()->stats().gradients_applied, 2);  // worker 1's and the retry
  EXPECT_EQ(shard()->stats().duplicate_pushes, 0);
  ExpectAFreshChannelPulls();
}

TEST_F(BulkRoundTripTest, TokensAreCheckedOnTheHelloAndEveryCallIsTheCallersOwn) {
  auto job = GenerateJobCredentials("bulk", false);
  ASSERT_TRUE(job.ok()) << job.status();
  auto other = GenerateJobCredentials("bulk", false);  // same name, another job
  ASSERT_TRUE(other.ok()) << other.status();
  PsOptions o;
  o.job_key = job->job_key;
  Start(o);
  const std::string before = ShardBytes();
  const std::string bearer0 = "Bearer " + TaskToken(job->job_key, "worker", 0);
  // Wrong or missing tokens: UNAUTHENTICATED on the hello, then closed.
  const std::vector<std::pair<std::string, std::string>> strangers = {
      {"worker/0", ""},                                                  // no token
      {"", bearer0},                                                     // no task
      {"worker/0", "Bearer " + TaskToken(other->job_key, "worker", 0)},  // another job's
      {"worker/1", bearer0},                                             // worker 0's as worker 1
      {"worker/0", TaskToken(job->job_key, "worker", 0)},                // not "Bearer ..."
  };
  for (const auto& [task, authorization] : strangers) {
    SCOPED_TRACE(task + " " + authorization);
    absl::Status hello;
    auto socket = RawConnect(&hello, task, authorization);
    ASSERT_NE(socket, nullptr);
    EXPECT_TRUE(absl::IsUnauthenticated(hello)) << hello;
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  {
    // Worker 0's token, pushing as worker 1: PERMISSION_DENIED, closed.
    absl::Status hello;
    auto socket = RawConnect(&hello, "worker/0", bearer0);
    ASSERT_TRUE(hello.ok()) << hello;
    ASSERT_TRUE(WritePushHeader(socket.get(), Header(1, 0)).ok());
    WriteChunks(socket.get(), Filled(1.0f), -1, /*expect_ok=*/false);
    WriteEnd(socket.get()).IgnoreError();  // the server may have closed by now
    const absl::Status s = ReadStatus(socket.get());
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  // The same through the channel, for a push and a pull.
  auto push = channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f)));
  EXPECT_TRUE(absl::IsPermissionDenied(push.status())) << push.status();
  v1::PullRequest as_worker1;
  as_worker1.set_worker_index(1);
  Values ignored;
  auto pull = channel_->Pull(as_worker1, SinkInto(&ignored));
  EXPECT_TRUE(absl::IsPermissionDenied(pull.status())) << pull.status();
  EXPECT_TRUE(ignored.empty());
  ExpectUnchanged(before);
  // The refusals came from the data plane, none from gRPC.
  EXPECT_EQ(ps().bulk_counters().unauthenticated.Value(), static_cast<double>(strangers.size()));
  EXPECT_EQ(ps().bulk_counters().permission_denied.Value(), 3);
  EXPECT_EQ(ps().grpc_counters().unauthenticated.Value(), 0);
  EXPECT_EQ(ps().grpc_counters().permission_denied.Value(), 0);
  // The right tokens work, over the data plane.
  auto worker1 = NewChannel(1);
  v1::InfoRequest info1;
  info1.set_worker_index(1);
  ASSERT_TRUE(worker1->GetInfo(info1, absl::Seconds(10)).ok());
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  auto step = worker1->Push(Header(1, 0), ChunksOf(Filled(1.0f)));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->version(), 1);
  EXPECT_TRUE(Flat(PullAll(worker1.get(), 1)) == ShardBytes())
      << "pulled values differ from the shard\'s";
  EXPECT_EQ(BulkPushBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(GrpcPushBytes(), 0);
  EXPECT_EQ(GrpcPullBytes(), 0);
}

TEST_F(BulkRoundTripTest, AnIdlePushIsClosedAndChangesNothing) {
  // A push that stops sending in its middle (a worker stuck, a link gone
  // quiet) is dropped after push_idle_timeout, and the client learns it at
  // once: its connection ends, instead of waiting out its own deadline.
  PsOptions o;
  o.push_idle_timeout = absl::Milliseconds(300);
  Start(o);
  const std::string before = ShardBytes();
  auto socket = RawConnect();
  ASSERT_NE(socket, nullptr);
  ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0, /*push_id=*/5)).ok());
  // (A machine too slow to send them within the timeout only makes it sooner.)
  WriteChunks(socket.get(), Filled(1.0f), 2, /*expect_ok=*/false);
  v1::BulkFrame frame;
  uint64_t n = 0;
  const absl::Status s = socket->ReadFrame(&frame, &n, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s << " (the server should have closed the connection)";
  EXPECT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 0; }));
  ExpectUnchanged(before);
}

// Worker 0's PushPull of step 0, its push handled and its pull held.
}  // namespace
}  // namespace bulk_testing
}  // namespace kubetrain
