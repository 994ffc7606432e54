// The bulk data plane end to end on a real loopback socket
// (tests/transport/bulk_fixture.h) -- the gRPC twin of this file is
// grpc_round_trip_test.cc; hostile input and refusals are bulk_refusals_test.
//
// What it proves: GetInfo advertises the data plane and Pull, Push and
// PushPull then really go over it (the bulk server's byte counters move, the
// gRPC service's stay 0); training steps over it are bit-identical to the
// same steps over gRPC; a retried push is applied once; a held pull whose
// client leaves is let go of, and a stopping server fails held pulls
// UNAVAILABLE; a PS whose data plane cannot be reached is still served
// through gRPC; and an overlapped (gated) push is sent part by part as its
// gates open, a failing gate abandoning it.
#include "tests/transport/bulk_fixture.h"

namespace kubetrain {
namespace bulk_testing {
namespace {

TEST_F(BulkRoundTripTest, GetInfoAdvertisesTheDataPlaneAndAChunkedPullOverItIsTheShardsValues) {
  auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GT(ps().bulk()->port(), 0);
  EXPECT_EQ(info->bulk_port(), ps().bulk()->port());
  int64_t version = -1;
  int chunks = 0;
  const Values values = PullAll(channel_.get(), 0, &version, &chunks);
  EXPECT_EQ(version, 0);
  ASSERT_EQ(values.size(), shard()->parts().size());
  EXPECT_TRUE(Flat(values) == ShardBytes()) << "pulled values differ from the shard's";
  // Chunked: at most kChunk bytes each, so the kernel alone takes 15.
  EXPECT_GE(chunks, static_cast<int>(GradientBytes() / kChunk));
  // Every byte went over the data plane, none over gRPC.
  EXPECT_EQ(BulkPullBytes(), static_cast<double>(GradientBytes()));
  EXPECT_EQ(GrpcPullBytes(), 0);
  // A second pull reuses the connection.
  PullAll();
  EXPECT_EQ(BulkPullBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(ps().bulk()->open_connections(), 1);
}

TEST_F(BulkRoundTripTest, SyncStepsOverTheDataPlaneAreBitIdenticalToTheSameStepsOverGrpc) {
  // The same three steps of two workers, on this PS over bulk and on a twin
  // PS (same model, seed and options) over plain gRPC: worker 0 a PushPull
  // held at the barrier, worker 1 a Push that opens it, then a Pull.
  TestPs twin(model_.get(), &placement_, &clock_);
  PsOptions twin_options;
  twin_options.bulk = false;
  twin.Start(twin_options);
  auto grpc_channel = NewGrpcShardChannel(twin.address(), kChunk);
  ASSERT_TRUE(grpc_channel->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  ASSERT_TRUE(SameBits(PullAll(channel_.get()), PullAll(grpc_channel.get())));

  auto run_step = [&](ShardChannel* channel, const Counters& counters, int64_t step) {
    const Grads g0 = GradsOf(0, step), g1 = GradsOf(1, step);
    Values fused;
    PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
    const uint64_t handled = counters.pushes_handled();
    std::thread w0([&] {
      answer = channel->PushPull(Header(0, step, 100 + step), ChunksOf(g0), {}, BarrierPull(step),
                                 SinkInto(&fused));
    });
    // Worker 0's push is handled (its pull held) before worker 1 pushes.
    EXPECT_TRUE(Eventually([&] { return counters.pushes_handled() > handled; }));
    auto pushed = channel->Push(Header(1, step, 200 + step), ChunksOf(g1));
    w0.join();
    EXPECT_TRUE(pushed.ok()) << pushed.status();
    if (pushed.ok()) EXPECT_EQ(pushed->version(), step + 1);
    EXPECT_TRUE(answer.push.ok()) << answer.push.status();
    if (answer.push.ok()) EXPECT_EQ(answer.push->version(), step);  // held, not served at once
    EXPECT_TRUE(answer.pull.ok()) << answer.pull.status();
    if (answer.pull.ok()) EXPECT_EQ(answer.pull->version(), step + 1);
    // Worker 1's pull of the same step sees what worker 0's fused pull saw.
    v1::PullRequest pull1 = BarrierPull(step);
    pull1.set_worker_index(1);
    Values plain;
    auto h = channel->Pull(pull1, SinkInto(&plain));
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(SameBits(plain, fused));
    return fused;
  };
  for (int64_t step = 0; step < 3; ++step) {
    const Values over_bulk = run_step(channel_.get(), ps().bulk_counters(), step);
    const Values over_grpc = run_step(grpc_channel.get(), twin.grpc_counters(), step);
    ASSERT_TRUE(SameBits(over_bulk, over_grpc)) << "step " << step;
    ASSERT_TRUE(Flat(over_bulk) == ShardBytes()) << "step " << step;
  }
  EXPECT_EQ(shard()->version(), 3);
  EXPECT_EQ(shard()->stats().gradients_applied, 6);  // two per step
  // This PS saw only the data plane; the twin only gRPC.
  EXPECT_EQ(BulkPushBytes(), 6.0 * GradientBytes());
  EXPECT_EQ(GrpcPushBytes(), 0);
  EXPECT_EQ(GrpcPullBytes(), 0);
  EXPECT_EQ(twin.grpc_counters().push_bytes.Value(), 6.0 * GradientBytes());
  // Two calls at once (the held PushPull and the Push) took two connections.
  EXPECT_EQ(ps().bulk()->open_connections(), 2);
  // The first pull, then per step a PushPull, a Push and a Pull.
  EXPECT_EQ(ps().bulk()->calls_answered(), 1 + 3 * 3);
}

TEST_F(BulkRoundTripTest, ARetriedAsyncPushIsAppliedOnce) {
  PsOptions o;
  o.mode = TrainingMode::kAsync;
  Start(o);
  const Grads g = GradsOf(0, 0);
  auto first = channel_->Push(Header(0, 0, /*push_id=*/42), ChunksOf(g));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version(), 1);
  const Values once = PullAll();
  // The answer was lost; the worker sends the same push again.
  auto retry = channel_->Push(Header(0, 0, /*push_id=*/42), ChunksOf(g));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->version(), 1);
  EXPECT_FALSE(retry->dropped());
  int64_t version = -1;
  EXPECT_TRUE(SameBits(PullAll(&version), once));
  EXPECT_EQ(version, 1);
  auto next = channel_->Push(Header(0, 1, /*push_id=*/43), ChunksOf(g));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), 2);
  const ShardStatsSnapshot stats = shard()->stats();
  EXPECT_EQ(stats.duplicate_pushes, 1);
  EXPECT_EQ(stats.gradients_applied, 2);
  EXPECT_EQ(BulkPushBytes(), 3.0 * GradientBytes());  // all three over the data plane
  EXPECT_EQ(GrpcPushBytes(), 0);
}

TEST_F(BulkRoundTripTest, AHeldPullWhoseClientLeavesIsLetGoOf) {
  PullAll();  // channel_'s connection
  auto socket = RawConnect();
  ASSERT_NE(socket, nullptr);
  ASSERT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 2; }));
  // Worker 0 waits at the barrier of step 1, which nobody opens: only a
  // cancel (or the 30 s wait on a fake clock nobody ticks) ends its hold.
  v1::BulkFrame frame;
  *frame.mutable_pull() = BarrierPull(0);
  ASSERT_TRUE(socket->WriteFrame(frame).ok());
  socket.reset();
  // The connection's thread ends only once the shard let go of the pull.
  ASSERT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 1; }));
  // Training goes on: both workers make step 1, and a barrier pull is served.
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f))).ok());
  Values after;
  auto h = channel_->Pull(BarrierPull(0), SinkInto(&after));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->version(), 1);
  EXPECT_TRUE(Flat(after) == ShardBytes()) << "pulled values differ from the shard\'s";
}

TEST_F(BulkRoundTripTest, AStoppingPsFailsAHeldPullUnavailableAndGRPCServesWhatFollows) {
  // As PsTask::Serve stops: the shard stops holding (held pulls answered
  // UNAVAILABLE with why), then the bulk server stops.
  const Grads g = Filled(0.5f);
  HeldPushPull held(channel_.get(), ps().bulk_counters(), ChunksOf(g));
  shard()->StopHolding(absl::UnavailableError("ps:0 is stopping"));
  const PushPullAnswer& answer = held.Join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kUnavailable) << answer.pull.status();
  EXPECT_NE(answer.pull.status().message().find("ps:0 is stopping"), std::string::npos)
      << answer.pull.status();
  ps().bulk()->Stop();
  EXPECT_EQ(ps().bulk()->open_connections(), 0);
  // The data plane is gone; the channel's next pull goes through gRPC.
  const double grpc_before = GrpcPullBytes();
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
  EXPECT_EQ(GrpcPullBytes() - grpc_before, static_cast<double>(GradientBytes()));
}

TEST_F(BulkRoundTripTest, ABulkServerThatStopsFailsAHeldPullUnavailable) {
  // Without StopHolding first: the server's own stop lets go of the pull.
  const Grads g = Filled(0.5f);
  HeldPushPull held(channel_.get(), ps().bulk_counters(), ChunksOf(g));
  ps().bulk()->Stop();  // returns once every connection's thread has ended
  EXPECT_EQ(ps().bulk()->open_connections(), 0);
  const PushPullAnswer& answer = held.Join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kUnavailable) << answer.pull.status();
  // The held pull left the shard: worker 1 makes the step, and the channel
  // (now through gRPC) pulls it.
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(g)).ok());
  EXPECT_EQ(shard()->version(), 1);
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
  EXPECT_GT(GrpcPullBytes(), 0);
}

TEST_F(BulkRoundTripTest, APsWhoseDataPlaneCannotBeReachedIsServedThroughGrpc) {
  // A port nobody listens on (a NetworkPolicy that admits only gRPC looks
  // the same to the worker).
  int closed_port = 0;
  auto fd = ListenBulk("127.0.0.1", 0, &closed_port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  PsOptions o;
  o.advertised_port = closed_port;
  Start(o);
  auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bulk_port(), closed_port);
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  PushPullAnswer answer =
      channel_->PushPull(Header(1, 0), ChunksOf(Filled(1.0f)), {}, BarrierPull(0),
                         [](const PulledChunk&) { return absl::OkStatus(); });
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
  EXPECT_EQ(GrpcPushBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(GrpcPullBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(BulkPushBytes() + BulkPullBytes(), 0);
}

TEST_F(BulkRoundTripTest, AnUnreachableDataPlaneIsReportedOnceHoweverOftenGetInfoIsPolled) {
  // The chief polls GetInfo every progress interval: a port that stays
  // unreachable is one warning, not one per poll (nor per retry).
  int closed_port = 0;
  auto fd = ListenBulk("127.0.0.1", 0, &closed_port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  PsOptions o;
  o.advertised_port = closed_port;
  Start(o);
  testing::internal::CaptureStderr();
  for (int poll = 0; poll < 3; ++poll) {
    ASSERT_TRUE(channel_->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
    PullAll();
  }
  const std::string log = testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = log.find("cannot be used"); at != std::string::npos;
       at = log.find("cannot be used", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
  EXPECT_EQ(GrpcPullBytes(), 3.0 * GradientBytes());
}

TEST_F(BulkRoundTripTest, ConnectionsOverTheLimitAreRefusedAndTheChannelUsesGrpc) {
  PsOptions o;
  o.max_connections = 1;
  Start(o);
  PullAll();  // channel_ holds the one connection
  EXPECT_EQ(ps().bulk()->open_connections(), 1);
  // One more is answered at once, before its hello, and closed.
  auto socket = ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimits());
  ASSERT_TRUE(socket.ok()) << socket.status();
  const absl::Status s = ReadStatus(socket->get());
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("1 connections already open"), std::string::npos) << s;
  EXPECT_TRUE(ClosedByServer(socket->get()));
  // A second channel cannot have one: it goes through gRPC.
  auto second = NewChannel(0);
  ASSERT_TRUE(second->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  EXPECT_TRUE(Flat(PullAll(second.get())) == ShardBytes())
      << "pulled values differ from the shard\'s";
  EXPECT_EQ(GrpcPullBytes(), static_cast<double>(GradientBytes()));
  EXPECT_EQ(ps().bulk()->open_connections(), 1);
}

// An overlapped push (worker/ps_client.h, StartPushPull): its parts in
// reverse order, each chunk gated until its part's gradient is ready. The
// channel sends each part as its gate opens, the server applies the push
// whole once the last is in, and a gate that fails abandons the push.
TEST_F(BulkRoundTripTest, AGatedPushPullIsSentPartByPartAsEachIsReadyAndAFailedGateAbandonsIt) {
  PsOptions o;
  o.mode = TrainingMode::kAsync;
  Start(o);
  const auto& parts = shard()->parts();
  ASSERT_GE(parts.size(), 2u);
  const Grads grads = Filled(0.25f);
  const Values before = PullAll();
  PartGates gates(parts.size());
  const std::vector<ChunkRef> chunks = GatedChunks(parts, grads, gates);
  PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
  Values after;
  std::thread step([&] {
    answer = channel_->PushPull(Header(0, 0, /*push_id=*/11), chunks, {}, v1::PullRequest(),
                                SinkInto(&after));
  });
  double read = 0;
  for (size_t i = parts.size(); i-- > 0;) {
    gates.OpenFrom(i);
    read += 4.0 * grads[i].size();
    // This part arrived, and no part whose gate is still closed.
    EXPECT_TRUE(Eventually([&] { return BulkPushBytes() >= read; }));
    EXPECT_EQ(BulkPushBytes(), read);
    if (i > 0) EXPECT_EQ(shard()->stats().gradients_applied, 0);  // not whole yet
  }
  step.join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_EQ(shard()->stats().gradients_applied, 1);
  EXPECT_FALSE(SameBits(after, before));
  EXPECT_TRUE(Flat(after) == ShardBytes()) << "pulled values differ from the shard\'s";

  // A gate that fails: the push is abandoned, nothing applied, nothing pulled.
  const RefReady fails = [] { return absl::FailedPreconditionError("never ready"); };
  std::vector<ChunkRef> doomed = ChunksOf(grads);
  doomed.back().ready = &fails;
  bool pulled = false;
  const std::string kept = ShardBytes();
  PushPullAnswer refused = channel_->PushPull(Header(0, 1, /*push_id=*/12), doomed, {},
                                              v1::PullRequest(), [&](const PulledChunk&) {
                                                pulled = true;
                                                return absl::OkStatus();
                                              });
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.push.status())) << refused.push.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.pull.status()));
  EXPECT_FALSE(pulled);
  // The server let go of the half-sent push when the channel closed its connection.
  EXPECT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 0; }));
  EXPECT_EQ(shard()->stats().gradients_applied, 1);
  EXPECT_EQ(shard()->version(), 1);
  EXPECT_TRUE(ShardBytes() == kept);
  // The channel goes on over the data plane (a new connection).
  auto next = channel_->Push(Header(0, 1, /*push_id=*/13), ChunksOf(grads));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), 2);
}

TEST_F(BulkRoundTripTest, APushPullThatIsRefusedNeverPullsAndTheNextCallWorks) {
  Grads g = Filled(0.5f);
  g[0].pop_back();  // one element short
  bool pulled = false;
  PushPullAnswer answer =
      channel_->PushPull(Header(0, 0), ChunksOf(g), {}, v1::PullRequest(), [&](const PulledChunk&) {
        pulled = true;
        return absl::OkStatus();
      });
  EXPECT_EQ(answer.push.status().code(), absl::StatusCode::kInvalidArgument)
      << answer.push.status();
  EXPECT_NE(answer.push.status().message().find("(bulk)"), std::string::npos)
      << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(pulled);
  EXPECT_EQ(shard()->stats().gradients_applied, 0);
  EXPECT_EQ(GrpcPushBytes(), 0);
  // The next call works.
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
}

TEST_F(BulkRoundTripTest, ASinkThatFailsEndsThePullAndTheNextPullIsWhole) {
  int calls = 0;
  auto h = channel_->Pull(v1::PullRequest(), [&](const PulledChunk&) {
    return ++calls == 2 ? absl::AbortedError("enough") : absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsAborted(h.status())) << h.status();
  EXPECT_EQ(calls, 2);
  // The rest of that answer is not mistaken for the next pull's.
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
}

// Embedding-table gradient rows ride a push over the data plane (ids in the
// meta, rows as data, split over frames of at most the chunk size) and land
// exactly as the same push over gRPC does.
TEST(BulkSparseTest, SparseRowsPushedOverTheDataPlaneMatchTheSamePushOverGrpc) {
  ModelSpec spec;
  spec.type = "layers";
  spec.input_shape = {1};
  LayerSpec dense;
  dense.units = 1;
  spec.layers = {dense};
  spec.head = HeadType::kSigmoid;
  spec.num_classes = 2;
  spec.sparse_inputs = {{"c", 20000, 1}};
  spec.embeddings = {{"c", 4, Combiner::kSum}};
  const Model model = *Model::Create(spec);
  const Placement placement = PlaceVariables(model.variables(), 1, 1 << 30);
  FakeClock clock;
  PsOptions o;
  o.mode = TrainingMode::kAsync;
  TestPs bulk_ps(&model, &placement, &clock);
  bulk_ps.Start(o);
  o.bulk = false;
  TestPs grpc_ps(&model, &placement, &clock);
  grpc_ps.Start(o);
  auto bulk = NewPsChannel(bulk_ps.address(), kChunk);
  auto grpc = NewGrpcShardChannel(grpc_ps.address(), kChunk);
  ASSERT_TRUE(bulk->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  ASSERT_TRUE(grpc->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  Shard* shard = bulk_ps.shard();
  ASSERT_EQ(shard->tables().size(), 1u);
  const std::string table = shard->tables()[0].name;
  const uint64_t dim = 4;

  // Dense gradient (every part: a push is whole) and 9000 rows: 144000
  // bytes, three frames of at most 64 KiB; one id twice (summed).
  std::vector<std::vector<float>> dense_grads;
  std::vector<ChunkRef> chunks;
  for (const auto& p : shard->parts()) dense_grads.emplace_back(p.num_elements(), 0.125f);
  for (size_t i = 0; i < dense_grads.size(); ++i) {
    chunks.push_back({&shard->parts()[i].name, 0, dense_grads[i].data(), dense_grads[i].size()});
  }
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 9000; ++id) ids.push_back((id * 7919) % 20000);
  ids[8999] = ids[0];
  std::vector<float> rows(ids.size() * dim);
  for (size_t k = 0; k < rows.size(); ++k) rows[k] = 0.001f * std::cos(0.1f * k);
  // The bulk channel splits one ref into frames itself; gRPC needs it
  // split into messages by the caller (as PsClient does).
  const std::vector<SparseRef> whole = {{&table, ids.data(), ids.size(), rows.data(), dim}};
  std::vector<SparseRef> pieces;
  for (uint64_t first = 0; first < ids.size(); first += 3000) {
    pieces.push_back({&table, ids.data() + first, 3000, rows.data() + first * dim, dim});
  }

  auto over_bulk = bulk->Push(Header1(0), chunks, whole);
  ASSERT_TRUE(over_bulk.ok()) << over_bulk.status();
  auto over_grpc = grpc->Push(Header1(0), chunks, pieces);
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status();
  EXPECT_EQ(over_bulk->version(), 1);
  EXPECT_EQ(over_grpc->version(), 1);
  EXPECT_EQ(bulk_ps.bulk_counters().push_bytes.Value(),
            static_cast<double>(shard->gradient_bytes() + rows.size() * 4));
  EXPECT_EQ(bulk_ps.grpc_counters().push_bytes.Value(), 0);

  // Every row of the table, read back from both: bit for bit the same.
  auto all_rows = [&](ShardChannel* channel) {
    std::string out;
    for (uint64_t first = 0; first < 20000; first += 2000) {  // a message's worth at a time
      v1::SparsePullRequest req;
      auto* t = req.add_tables();
      t->set_table(table);
      for (uint64_t id = first; id < first + 2000; ++id) t->add_ids(id);
      auto r = channel->SparsePull(req);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) out += r->tables(0).data();
    }
    return out;
  };
  const std::string a = all_rows(bulk.get()), b = all_rows(grpc.get());
  EXPECT_EQ(a.size(), 20000u * dim * 4);
  EXPECT_TRUE(a == b) << "the table's rows differ";
}

}  // namespace
}  // namespace bulk_testing
}  // namespace kubetrain
