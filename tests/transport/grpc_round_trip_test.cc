// Both gRPC sides together on a real loopback socket: the PS's service
// (ps/service.h) and the worker's channel (worker/grpc_shard_channel.h).
// Chunked pulls and pushes round trip, malformed pushes are refused with
// INVALID_ARGUMENT while the server stays up and its state stays unchanged,
// huge finite gradients never make a parameter non-finite, and the task a
// request names (worker, chief, evaluator) reaches the shard.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ps/service.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*has_chief=*/false); }
  void Start(bool has_chief) {
    ModelSpec spec;
    spec.type = "mlp";
    spec.hidden_units = {300};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    placement_ = PlaceVariables(model_->variables(), 1, 1 << 30);
    ShardOptions o;
    o.num_workers = 2;
    o.replicas_to_aggregate = 2;
    o.target_steps = 100;
    o.has_chief_task = has_chief;
    OptimizerSpec opt;
    opt.type = "sgd";
    opt.learning_rate = 1;
    shard_ = *Shard::Create(o, *model_, placement_, opt, &clock_, ShardMetrics{});
    PsServiceOptions so;
    so.model_fingerprint = placement_.Fingerprint();
    so.max_chunk_bytes = 64 << 10;  // forces many chunks for the 784x300 kernel
    service_ = std::make_unique<PsService>(shard_.get(), &clock_, so, PsServiceMetrics{});
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.SetMaxReceiveMessageSize((64 << 10) + (64 << 10));
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_GT(port_, 0);
    channel_ = NewGrpcShardChannel("127.0.0.1:" + std::to_string(port_), 64 << 10);
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
    auto h = channel_->Pull(req, [&](const v1::TensorChunk& c) {
      auto& v = out[c.part()];
      v.resize(std::max<size_t>(v.size(), c.offset() + c.data().size() / 4));
      std::memcpy(v.data() + c.offset(), c.data().data(), c.data().size());
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
  absl::StatusOr<v1::PushResponse> PushFrom(int worker, int64_t version,
                                            const std::vector<std::vector<float>>& g) {
    v1::PushRequest::Header h;
    h.set_worker_index(worker);
    h.set_version(version);
    h.set_worker_clock(version + 1);
    return channel_->Push(h, ChunksOf(g));
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  Placement placement_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<ShardChannel> channel_;
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
  EXPECT_EQ(channel_->Push(h, bad).status().code(), absl::StatusCode::kInvalidArgument);
  // Missing the last chunk (incomplete gradient).
  bad = chunks_of(grads);
  bad.pop_back();
  auto r = channel_->Push(h, bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("incomplete"), std::string::npos) << r.status();
  // A chunk at the wrong offset (a gap in the part).
  bad = chunks_of(grads);
  for (auto& c : bad) {
    if (c.offset > 0) {
      c.offset += 1;
      break;
    }
  }
  EXPECT_EQ(channel_->Push(h, bad).status().code(), absl::StatusCode::kInvalidArgument);
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
  auto h = channel_->Pull(chief_pull, [](const v1::TensorChunk&) { return absl::OkStatus(); });
  ASSERT_TRUE(h.ok()) << h.status();
  // An evaluator the job does not have is refused.
  v1::PullRequest evaluator_pull;
  evaluator_pull.set_task_type(v1::TASK_TYPE_EVALUATOR);
  EXPECT_EQ(channel_->Pull(evaluator_pull, [](const v1::TensorChunk&) { return absl::OkStatus(); })
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
