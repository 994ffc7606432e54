// Both gRPC sides together on a real loopback socket: the PS's service
// (ps/service.h) and the worker's channel (worker/grpc_shard_channel.h).
// Chunked pulls and pushes round trip, malformed pushes are refused with
// INVALID_ARGUMENT while the server stays up and its state stays unchanged,
// huge finite gradients never make a parameter non-finite, and the task a
// request names (worker, chief, evaluator) reaches the shard. A gated
// (overlapped) push is read part by part as its gates open.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include <prometheus/counter.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "ps/service.h"
#include "tests/transport/part_gates.h"
#include "tests/transport/raw_ps_client.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*has_chief=*/false); }
  void Start(bool has_chief, TrainingMode mode = TrainingMode::kSync,
             PsServiceOptions so = PsServiceOptions()) {
    ModelSpec spec;
    spec.type = "mlp";
    spec.hidden_units = {300};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    placement_ = PlaceVariables(model_->variables(), 1, 1 << 30);
    ShardOptions o;
    o.num_workers = 2;
    o.mode = mode;
    o.replicas_to_aggregate = mode == TrainingMode::kSync ? 2 : 1;
    o.target_steps = 100;
    o.has_chief_task = has_chief;
    OptimizerSpec opt;
    opt.type = "sgd";
    opt.learning_rate = 1;
    shard_ = *Shard::Create(o, *model_, placement_, opt, &clock_, ShardMetrics{});
    so.model_fingerprint = placement_.Fingerprint();
    so.max_chunk_bytes = 64 << 10;  // forces many chunks for the 784x300 kernel
    PsServiceMetrics metrics;
    push_bytes_ = std::make_unique<prometheus::Counter>();
    metrics.push_bytes = push_bytes_.get();
    service_ = std::make_unique<PsService>(shard_.get(), &clock_, so, metrics);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    ConfigurePsServer(so.max_chunk_bytes, &b);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_GT(port_, 0);
    channel_ = NewGrpcShardChannel("127.0.0.1:" + std::to_string(port_), 64 << 10);
    // Connected before the test starts (a restarted server has a new port).
    ASSERT_TRUE(channel_->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
    raw_ = std::make_unique<RawPsClient>(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                             grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  absl::StatusOr<v1::ShardStats> Shutdown(v1::TaskType type, int index) {
    v1::ShutdownRequest req;
    req.set_task_type(type);
    req.set_worker_index(index);
    return channel_->Shutdown(req);
  }

  // Pulls everything into a flat map part -> values.
  std::map<std::string, std::vector<float>> PullAll(int64_t* version = nullptr) {
    std::map<std::string, std::vector<float>> out;
    v1::PullRequest req;
    auto h = channel_->Pull(req, [&](const PulledChunk& c) {
      auto& v = out[std::string(c.part())];
      v.resize(std::max<size_t>(v.size(), c.offset() + c.data_bytes() / 4));
      c.CopyTo(reinterpret_cast<char*>(v.data() + c.offset()));
      return absl::OkStatus();
    });
    EXPECT_TRUE(h.ok()) << h.status();
    if (version && h.ok()) *version = h->version();
    return out;
  }

  // A gradient as the worker's chunks (10000 elements each).
  std::vector<ChunkRef> ChunksOf(const std::vector<std::vector<float>>& g) {
    std::vector<ChunkRef> chunks;
    for (size_t i = 0; i < g.size(); ++i) {
      for (size_t off = 0; off < g[i].size(); off += 10000) {
        chunks.push_back({&shard_->parts()[i].name, off, g[i].data() + off,
                          std::min<size_t>(10000, g[i].size() - off)});
      }
    }
    return chunks;
  }
  // Every part's gradient filled with `v`.
  std::vector<std::vector<float>> Grads(float v) {
    std::vector<std::vector<float>> g;
    for (const auto& p : shard_->parts()) g.emplace_back(p.num_elements(), v);
    return g;
  }
  static v1::PushRequest::Header Header(int worker, int64_t version, uint64_t push_id = 0) {
    v1::PushRequest::Header h;
    h.set_worker_index(worker);
    h.set_version(version);
    h.set_worker_clock(version + 1);
    h.set_push_id(push_id);
    return h;
  }
  absl::StatusOr<v1::PushResponse> PushFrom(int worker, int64_t version,
                                            const std::vector<std::vector<float>>& g,
                                            uint64_t push_id = 0) {
    return channel_->Push(Header(worker, version, push_id), ChunksOf(g));
  }
  // The same push as raw messages (RawPsClient).
  std::vector<std::string> Encoded(const v1::PushRequest::Header& h,
                                   const std::vector<std::vector<float>>& g) {
    std::vector<PartGradient> parts;
    for (size_t i = 0; i < g.size(); ++i) parts.push_back({shard_->parts()[i].name, g[i]});
    return EncodePush(h, parts, 10000);
  }
  uint64_t GradientBytes() const { return shard_->gradient_bytes(); }
  // Waits until the service has read `bytes` gradient bytes in all.
  void AwaitPushBytes(double bytes) {
    for (int i = 0; i < 500 && push_bytes_->Value() < bytes; ++i)
      absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(push_bytes_->Value(), bytes);
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  Placement placement_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<ShardChannel> channel_;
  std::unique_ptr<prometheus::Counter> push_bytes_;  // gradient bytes the service has read
  std::unique_ptr<RawPsClient> raw_;
};

TEST_F(ServiceTest, ChunkedPullReturnsEveryPart) {
  auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model_fingerprint(), placement_.Fingerprint());
  auto values = PullAll();
  ASSERT_EQ(values.size(), shard_->parts().size());
  for (const auto& p : shard_->parts())
    EXPECT_EQ(values[p.name].size(), static_cast<size_t>(p.num_elements()));
}

TEST_F(ServiceTest, MalformedPushesAreRefusedAndChangeNothing) {
  auto before = PullAll();
  std::vector<std::vector<float>> grads = Grads(1.0f);
  auto chunks_of = [&](const std::vector<std::vector<float>>& g) { return ChunksOf(g); };
  v1::PushRequest::Header h;
  h.set_worker_index(0);
  h.set_version(0);

  // Unknown part name.
  std::string bogus = "no/such/variable";
  std::vector<ChunkRef> bad = chunks_of(grads);
  bad[0].part = &bogus;
  auto unknown = channel_->Push(h, bad);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("malformed chunk"), std::string::npos)
      << unknown.status();
  // Missing the last chunk (incomplete gradient).
  bad = chunks_of(grads);
  bad.pop_back();
  auto r = channel_->Push(h, bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("incomplete gradient"), std::string::npos) << r.status();
  EXPECT_EQ(r.status().message().find("malformed"), std::string::npos) << r.status();
  // A chunk at the wrong offset (a gap in the part).
  bad = chunks_of(grads);
  for (auto& c : bad) {
    if (c.offset > 0) {
      c.offset += 1;
      break;
    }
  }
  auto gap = channel_->Push(h, bad);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gap.status().message().find("malformed chunk"), std::string::npos) << gap.status();
  // A non-finite value.
  auto nan = grads;
  nan[0][5] = std::nanf("");
  EXPECT_EQ(channel_->Push(h, chunks_of(nan)).status().code(), absl::StatusCode::kInvalidArgument);
  // A step from the future; an unknown worker.
  h.set_version(9);
  EXPECT_EQ(channel_->Push(h, chunks_of(grads)).status().code(),
            absl::StatusCode::kInvalidArgument);
  h.set_version(0);
  h.set_worker_index(5);
  EXPECT_EQ(channel_->Push(h, chunks_of(grads)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Only the chief (worker 0: this job has no Chief replica) may end the job.
  EXPECT_EQ(Shutdown(v1::TASK_TYPE_WORKER, 1).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Shutdown(v1::TASK_TYPE_CHIEF, 0).status().code(), absl::StatusCode::kPermissionDenied);

  // The server is still up and nothing changed.
  int64_t version = -1;
  EXPECT_EQ(PullAll(&version), before);
  EXPECT_EQ(version, 0);
  // Valid pushes from both workers still make exactly one averaged step.
  h.set_worker_index(0);
  ASSERT_TRUE(channel_->Push(h, chunks_of(grads)).ok());
  h.set_worker_index(1);
  auto ok = channel_->Push(h, chunks_of(grads));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->version(), 1);
  auto after = PullAll();
  for (const auto& [name, v] : after) {
    for (size_t k = 0; k < v.size(); k += 997) EXPECT_FLOAT_EQ(v[k], before[name][k] - 1.0f);
  }
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

TEST_F(ServiceTest, TheTaskTypeOnTheWireReachesTheShard) {
  server_->Shutdown();
  Start(/*has_chief=*/true);
  // A chief's pull is served at once: it joins no barrier.
  v1::PullRequest chief_pull;
  chief_pull.set_task_type(v1::TASK_TYPE_CHIEF);
  chief_pull.set_min_version(0);
  auto h = channel_->Pull(chief_pull, [](const PulledChunk&) { return absl::OkStatus(); });
  ASSERT_TRUE(h.ok()) << h.status();
  // An evaluator the job does not have is refused.
  v1::PullRequest evaluator_pull;
  evaluator_pull.set_task_type(v1::TASK_TYPE_EVALUATOR);
  EXPECT_EQ(channel_->Pull(evaluator_pull, [](const PulledChunk&) { return absl::OkStatus(); })
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // With a Chief replica, worker 0 may not end the job; the chief may.
  auto denied = Shutdown(v1::TASK_TYPE_WORKER, 0);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(shard_->shutdown_requested());
  auto stats = Shutdown(v1::TASK_TYPE_CHIEF, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(shard_->shutdown_requested());
  // A chief's Leave is not a worker's.
  v1::LeaveRequest leave;
  leave.set_task_type(v1::TASK_TYPE_CHIEF);
  ASSERT_TRUE(channel_->Leave(leave).ok());
  EXPECT_FALSE(shard_->all_workers_left());
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// Issue 9, finding 2: two valid pushes of 3e38 summed in float32 made every
// parameter -Inf. Now the mean is taken in double, and an update that would
// overflow is refused with the parameters bit-identical.
TEST_F(ServiceTest, HugeFiniteGradientsNeverMakeAParameterNonFinite) {
  const auto initial = PullAll();
  const auto huge = Grads(3e38f);
  ASSERT_TRUE(PushFrom(0, 0, huge).ok());
  auto r = PushFrom(1, 0, huge);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 1);
  EXPECT_FALSE(r->dropped());
  int64_t version = -1;
  const auto after_one = PullAll(&version);
  EXPECT_EQ(version, 1);
  for (const auto& [name, v] : after_one) {
    for (size_t k = 0; k < v.size(); ++k) {
      ASSERT_TRUE(std::isfinite(v[k])) << name << "[" << k << "]";
      ASSERT_EQ(v[k], initial.at(name)[k] - 3e38f) << name << "[" << k << "]";
    }
  }
  // The next step would take every value past -FLT_MAX: refused as a whole,
  // the step skipped (the version moves so the barrier lets the workers go).
  ASSERT_TRUE(PushFrom(0, 1, huge).ok());
  r = PushFrom(1, 1, huge);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->dropped());
  EXPECT_EQ(r->version(), 2);
  const auto after_refused = PullAll(&version);
  EXPECT_EQ(version, 2);
  ASSERT_EQ(after_refused.size(), after_one.size());
  for (const auto& [name, v] : after_refused) {
    const auto& was = after_one.at(name);
    ASSERT_EQ(v.size(), was.size());
    EXPECT_EQ(std::memcmp(v.data(), was.data(), v.size() * sizeof(float)), 0) << name;
  }
  auto stats = Shutdown(v1::TASK_TYPE_WORKER, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->nonfinite_updates(), 1);
  EXPECT_EQ(stats->gradients_applied(), 2);
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// Issue 9, finding 4: a push the client cancels after its last chunk was
// applied although the client saw CANCELLED.
TEST_F(ServiceTest, APushCancelledAfterItsLastChunkChangesNothing) {
  int64_t version = -1;
  const auto before = PullAll(&version);
  const auto grads = Grads(1.0f);
  std::string response;
  grpc::Status s =
      raw_->Push(Encoded(Header(0, 0, /*push_id=*/7), grads), RawPsClient::End::kCancel, &response,
                 [&] { AwaitPushBytes(static_cast<double>(GradientBytes())); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_TRUE(SameBits(PullAll(&version), before));
  EXPECT_EQ(version, 0);
  // Worker 0's gradient is not waiting in the step either: worker 1 alone
  // does not complete it ...
  ASSERT_TRUE(PushFrom(1, 0, grads).ok());
  EXPECT_EQ(shard_->version(), 0);
  // ... and worker 0's retry (same push id) is the one that counts, once.
  auto retry = PushFrom(0, 0, grads, /*push_id=*/7);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->version(), 1);
  EXPECT_FALSE(retry->dropped());
  for (const auto& [name, v] : PullAll()) {
    for (size_t k = 0; k < v.size(); ++k) ASSERT_EQ(v[k], before.at(name)[k] - 1.0f) << name;
  }
}

TEST_F(ServiceTest, ACompleteGradientFollowedByAnythingMalformedChangesNothing) {
  int64_t version = -1;
  const auto before = PullAll(&version);
  const auto grads = Grads(1.0f);
  // An unparseable message after the last chunk (a length that runs past its end).
  auto garbage = Encoded(Header(0, 0), grads);
  garbage.push_back(
      std::string("\x0a\x05"
                  "ab",
                  4));
  std::string response;
  grpc::Status s = raw_->Push(garbage, RawPsClient::End::kHalfClose, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("malformed request: not a valid PushRequest"), std::string::npos)
      << s.error_message();
  // A chunk past the end of a complete part.
  auto extra = Encoded(Header(0, 0), grads);
  extra.push_back(extra.back());
  s = raw_->Push(extra, RawPsClient::End::kHalfClose, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("malformed chunk"), std::string::npos) << s.error_message();
  // A second header.
  auto two_headers = Encoded(Header(0, 0), grads);
  two_headers.push_back(two_headers.front());
  s = raw_->Push(two_headers, RawPsClient::End::kHalfClose, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A header declaring another size than the shard's.
  auto declared = Header(0, 0);
  declared.set_total_bytes(GradientBytes() + 4);
  s = raw_->Push(Encoded(declared, grads), RawPsClient::End::kHalfClose, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("declares"), std::string::npos) << s.error_message();

  EXPECT_TRUE(SameBits(PullAll(&version), before));
  EXPECT_EQ(version, 0);
  ASSERT_TRUE(PushFrom(1, 0, grads).ok());
  EXPECT_EQ(shard_->version(), 0);  // nothing of worker 0 is waiting in the step
  EXPECT_EQ(shard_->stats().pushes_rejected, 4);
  // The declared size, when right, is accepted.
  declared.set_total_bytes(GradientBytes());
  s = raw_->Push(Encoded(declared, grads), RawPsClient::End::kHalfClose, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(shard_->version(), 1);
}

TEST_F(ServiceTest, EveryMalformedRequestGetsInvalidArgumentWithAMessage) {
  const std::string garbage(
      "\x0a\x05"
      "ab",
      4);  // not any message: a length past the end
  for (const char* method : {"GetInfo", "Leave", "Shutdown", "GetStats"}) {
    grpc::Status s = raw_->Unary(method, garbage, nullptr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(s.error_message().find("malformed request"), std::string::npos)
        << method << ": " << s.error_message();
  }
  grpc::Status s = raw_->Pull(garbage, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("malformed request"), std::string::npos) << s.error_message();
  s = raw_->Push({garbage}, RawPsClient::End::kHalfClose, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(s.error_message().empty());
  // Well-formed messages naming what the job does not have.
  v1::InfoRequest info;
  info.set_task_type(static_cast<v1::TaskType>(9));
  s = raw_->Unary("GetInfo", info.SerializeAsString(), nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown task_type 9"), std::string::npos) << s.error_message();
  info.set_task_type(v1::TASK_TYPE_WORKER);
  info.set_worker_index(5);
  s = raw_->Unary("GetInfo", info.SerializeAsString(), nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown worker index 5"), std::string::npos)
      << s.error_message();
  // A push that ends before its gradient does: "incomplete", not "malformed".
  auto part = Encoded(Header(0, 0), Grads(1.0f));
  part.pop_back();
  s = raw_->Push(part, RawPsClient::End::kHalfClose, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("incomplete gradient"), std::string::npos) << s.error_message();
  // Still serving, nothing changed.
  auto ok = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->version(), 0);
  EXPECT_FALSE(shard_->shutdown_requested());
}

TEST_F(ServiceTest, ARetriedAsyncPushIsAppliedOnce) {
  server_->Shutdown();
  Start(/*has_chief=*/false, TrainingMode::kAsync);
  const auto grads = Grads(1.0f);
  auto first = PushFrom(0, 0, grads, /*push_id=*/42);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version(), 1);
  int64_t version = -1;
  const auto once = PullAll(&version);
  // The answer was lost; the worker sends the same push again.
  auto retry = PushFrom(0, 0, grads, /*push_id=*/42);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->version(), 1);
  EXPECT_FALSE(retry->dropped());
  EXPECT_TRUE(SameBits(PullAll(&version), once));
  EXPECT_EQ(version, 1);
  // The next push (a new id) is applied.
  auto next = PushFrom(0, 1, grads, /*push_id=*/43);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), 2);
  auto stats = Shutdown(v1::TASK_TYPE_WORKER, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->duplicate_pushes(), 1);
  EXPECT_EQ(stats->gradients_applied(), 2);
}

// Worker 0's pull at the barrier of step 1 (held until worker 1 pushes).
v1::PullRequest BarrierPullOfStep1() {
  v1::PullRequest pull;
  pull.set_min_version(1);
  pull.set_worker_clock(1);
  pull.set_wait_timeout_ms(30000);
  return pull;
}

TEST_F(ServiceTest, APushPullPushesThenHoldsThePullAtTheBarrierAndARetryAppliesOnce) {
  // Sync, two workers: worker 0's fused step is answered for its push at
  // once and its pull is held until worker 1's plain push opens the barrier.
  PullAll();
  const auto grads = Grads(0.5f);
  const v1::PullRequest pull = BarrierPullOfStep1();
  std::map<std::string, std::vector<float>> fused;
  auto sink = [&](const PulledChunk& c) {
    auto& v = fused[std::string(c.part())];
    v.resize(std::max<size_t>(v.size(), c.offset() + c.data_bytes() / 4));
    c.CopyTo(reinterpret_cast<char*>(v.data() + c.offset()));
    return absl::OkStatus();
  };
  PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
  std::thread step([&] {
    answer = channel_->PushPull(Header(0, 0, /*push_id=*/7), ChunksOf(grads), {}, pull, sink);
  });
  AwaitPushBytes(static_cast<double>(GradientBytes()));  // pushed; its pull is held
  ASSERT_TRUE(PushFrom(1, 0, grads).ok());
  step.join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  EXPECT_FALSE(answer.push->dropped());
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_EQ(answer.pull->total_bytes(), GradientBytes());
  int64_t version = -1;
  EXPECT_TRUE(SameBits(PullAll(&version), fused));
  EXPECT_EQ(version, 1);

  // Its answer lost, the worker sends the same step again: the push id is
  // known (nothing applied again) and the pull is served as asked.
  fused.clear();
  answer = channel_->PushPull(Header(0, 0, /*push_id=*/7), ChunksOf(grads), {}, pull, sink);
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_TRUE(SameBits(PullAll(), fused));
  auto stats = Shutdown(v1::TASK_TYPE_WORKER, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->duplicate_pushes(), 1);
  EXPECT_EQ(stats->gradients_applied(), 2);
  EXPECT_EQ(service_->open_push_streams(), 0);  // a held pull is no push stream
}

TEST_F(ServiceTest, APsThatStopsAnswersAHeldFusedPullWithUnavailableNotCancelled) {
  // Sync, two workers: worker 0's fused pull is held at the barrier when the
  // PS task stops (PsTask::Serve calls StopHolding before the server's
  // shutdown): the worker sees UNAVAILABLE, which PsClient asks again (the
  // restarted PS), and its push stays answered.
  PullAll();
  const auto grads = Grads(0.5f);
  const v1::PullRequest pull = BarrierPullOfStep1();
  PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
  std::thread step([&] {
    answer = channel_->PushPull(Header(0, 0, /*push_id=*/9), ChunksOf(grads), {}, pull,
                                [](const PulledChunk&) { return absl::OkStatus(); });
  });
  AwaitPushBytes(static_cast<double>(GradientBytes()));  // pushed; its pull is held
  shard_->StopHolding(absl::UnavailableError("ps:0 is stopping"));
  step.join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kUnavailable) << answer.pull.status();
  EXPECT_NE(answer.pull.status().message().find("ps:0 is stopping"), std::string::npos)
      << answer.pull.status();
}

TEST_F(ServiceTest, APushPullThatIsRefusedNeverPulls) {
  auto grads = Grads(0.5f);
  grads[0].pop_back();  // one element short
  v1::PullRequest pull;
  bool pulled = false;
  PushPullAnswer answer =
      channel_->PushPull(Header(0, 0), ChunksOf(grads), {}, pull, [&](const PulledChunk&) {
        pulled = true;
        return absl::OkStatus();
      });
  EXPECT_EQ(answer.push.status().code(), absl::StatusCode::kInvalidArgument)
      << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(pulled);
  EXPECT_EQ(shard_->stats().gradients_applied, 0);
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// Push streams held open by threads until Release(); each sends `messages`
// and then waits, and is then ended with `end`.
class HeldPushes {
 public:
  explicit HeldPushes(RawPsClient* client) : client_(client) {}
  ~HeldPushes() { Release(); }
  void Open(std::vector<std::string> messages, RawPsClient::End end = RawPsClient::End::kCancel) {
    const size_t i = statuses_.size();
    statuses_.emplace_back();
    threads_.emplace_back([this, i, end, messages = std::move(messages)] {
      statuses_[i] = client_->Push(
          messages, end, nullptr, [this] { release_.WaitForNotification(); }, absl::Seconds(60));
    });
  }
  // Ends every stream; returns their statuses in the order opened.
  std::vector<grpc::Status> Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
    for (auto& t : threads_) t.join();
    threads_.clear();
    return statuses_;
  }

 private:
  RawPsClient* const client_;
  absl::Notification release_;
  std::vector<grpc::Status> statuses_;
  std::vector<std::thread> threads_;
};

double ChunkBytes(const std::string& encoded) {
  v1::PushRequest msg;
  EXPECT_TRUE(msg.ParseFromString(encoded));
  return static_cast<double>(msg.chunk().data().size());
}

void AwaitOpenPushes(const PsService& service, int n) {
  for (int i = 0; i < 500 && service.open_push_streams() != n; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(service.open_push_streams(), n);
}

TEST_F(ServiceTest, PushStreamsAreLimitedPerPsAndPerWorker) {
  server_->Shutdown();
  PsServiceOptions so;
  so.max_push_streams = 3;
  so.max_push_streams_per_worker = 1;
  Start(/*has_chief=*/false, TrainingMode::kSync, so);
  const auto grads = Grads(1.0f);
  const auto full = Encoded(Header(0, 0), grads);
  {
    // Worker 0 has a push open (header and one chunk, then silence).
    HeldPushes held(raw_.get());
    held.Open({full[0], full[1]});
    AwaitOpenPushes(*service_, 1);
    AwaitPushBytes(ChunkBytes(full[1]));
    // A second one from worker 0 is refused as soon as its header arrives.
    grpc::Status s = raw_->Push(full, RawPsClient::End::kHalfClose, nullptr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("worker 0 already has 1 push streams open"), std::string::npos)
        << s.error_message();
    // Two silent streams fill the PS's limit of 3; a fourth is refused at once.
    held.Open({});
    held.Open({});
    AwaitOpenPushes(*service_, 3);
    s = raw_->Push(Encoded(Header(1, 0), grads), RawPsClient::End::kHalfClose, nullptr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("3 push streams already open"), std::string::npos)
        << s.error_message();
    for (const auto& st : held.Release()) EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED);
  }
  AwaitOpenPushes(*service_, 0);
  EXPECT_EQ(shard_->version(), 0);
  // The slots are free again: both workers push, one step.
  ASSERT_TRUE(PushFrom(0, 0, grads).ok());
  ASSERT_TRUE(PushFrom(1, 0, grads).ok());
  EXPECT_EQ(shard_->version(), 1);
}

TEST_F(ServiceTest, AnIdlePushStreamIsClosedAndChangesNothing) {
  const auto before = PullAll();
  const auto full = Encoded(Header(0, 0), Grads(1.0f));
  HeldPushes held(raw_.get());
  held.Open({full[0], full[1]}, RawPsClient::End::kHalfClose);
  AwaitOpenPushes(*service_, 1);
  AwaitPushBytes(ChunkBytes(full[1]));
  EXPECT_EQ(service_->Tick(clock_.Now() + absl::Seconds(29)), 0);  // not idle long enough
  EXPECT_EQ(service_->open_push_streams(), 1);
  EXPECT_EQ(service_->Tick(clock_.Now() + absl::Seconds(31)), 1);  // closed as idle
  AwaitOpenPushes(*service_, 0);
  const auto statuses = held.Release();
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_EQ(statuses[0].error_code(), grpc::StatusCode::UNAVAILABLE) << statuses[0].error_message();
  EXPECT_NE(statuses[0].error_message().find("no message for 30s"), std::string::npos)
      << statuses[0].error_message();
  EXPECT_TRUE(SameBits(PullAll(), before));
  // Nothing of worker 0 waits in the step: its next push and worker 1's make it.
  ASSERT_TRUE(PushFrom(1, 0, Grads(1.0f)).ok());
  EXPECT_EQ(shard_->version(), 0);
  ASSERT_TRUE(PushFrom(0, 0, Grads(1.0f)).ok());
  EXPECT_EQ(shard_->version(), 1);
}

// Issue 26: whatever the shard returns, the status on the wire has text.
TEST(ToGrpcStatusTest, AStatusWithoutTextGetsSome) {
  grpc::Status s = ToGrpcStatus(absl::Status(absl::StatusCode::kResourceExhausted, ""));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "ps: RESOURCE_EXHAUSTED with no detail from the shard");
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("full")).error_message(), "full");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// An overlapped push (worker/ps_client.h, StartPushPull): its parts in
// reverse order, each chunk gated until its part's gradient is ready. The
// service reads each part as its gate opens, applies the push whole once the
// last is in, and a gate that fails abandons the push (never applied).
TEST_F(ServiceTest, AGatedPushPullIsReadPartByPartAsEachIsReadyAndAFailedGateAbandonsIt) {
  Start(false, TrainingMode::kAsync);
  const auto& parts = shard_->parts();
  ASSERT_GE(parts.size(), 2u);
  const auto grads = Grads(0.25f);
  const auto before = PullAll();
  PartGates gates(parts.size());
  const std::vector<ChunkRef> chunks = GatedChunks(parts, grads, gates);
  PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
  std::map<std::string, std::vector<float>> after;
  std::thread step([&] {
    answer = channel_->PushPull(
        Header(0, 0, /*push_id=*/11), chunks, {}, v1::PullRequest(), [&](const PulledChunk& c) {
          auto& v = after[std::string(c.part())];
          v.resize(std::max<size_t>(v.size(), c.offset() + c.data_bytes() / 4));
          c.CopyTo(reinterpret_cast<char*>(v.data() + c.offset()));
          return absl::OkStatus();
        });
  });
  double read = 0;
  for (size_t i = parts.size(); i-- > 0;) {
    gates.OpenFrom(i);
    read += 4.0 * grads[i].size();
    AwaitPushBytes(read);  // this part, and no part whose gate is closed
    if (i > 0) {
      EXPECT_EQ(shard_->stats().gradients_applied, 0);  // not whole yet
    }
  }
  step.join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_EQ(shard_->stats().gradients_applied, 1);
  EXPECT_FALSE(SameBits(after, before));
  EXPECT_TRUE(SameBits(after, PullAll()));

  // A gate that fails: the push is abandoned, nothing applied, nothing pulled.
  const RefReady fails = [] { return absl::FailedPreconditionError("never ready"); };
  std::vector<ChunkRef> doomed = ChunksOf(grads);
  doomed.back().ready = &fails;
  bool pulled = false;
  PushPullAnswer refused = channel_->PushPull(Header(0, 1, /*push_id=*/12), doomed, {},
                                              v1::PullRequest(), [&](const PulledChunk&) {
                                                pulled = true;
                                                return absl::OkStatus();
                                              });
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.push.status())) << refused.push.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.pull.status()));
  EXPECT_FALSE(pulled);
  EXPECT_EQ(shard_->stats().gradients_applied, 1);
  EXPECT_TRUE(SameBits(after, PullAll()));
}

}  // namespace
}  // namespace kubetrain
