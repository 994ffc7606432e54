// The in-process PS and its fault-injecting channel: what worker tests build
// whole jobs on must itself behave like the gRPC path (chunked pulls,
// validated pushes, the task a request names) and fail the way a dead process
// does when restarted.
#include "ps/in_process_shard_channel.h"

#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/testing/task_config_for.h"
#include "core/testing/temp_files.h"

namespace kubetrain {
namespace {

std::string Job(const std::string& mode, int ps, int workers, bool chief = false) {
  return absl::StrCat(
      "apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: {name: inproc}\nspec:\n",
      "  replicaSpecs:\n    PS: {replicas: ", ps, "}\n    Worker: {replicas: ", workers, "}\n",
      chief ? "    Chief: {replicas: 1}\n" : "", "  training:\n    mode: ", mode,
      "\n    model: {type: softmax}\n    optimizer: {type: sgd, learningRate: 1}\n",
      "    steps: 50\n    placement: {splitThresholdBytes: 16384}\n");
}

v1::PullRequest PullAt(int64_t min_version, int worker = 0, int64_t incarnation = 0) {
  v1::PullRequest r;
  r.set_worker_index(worker);
  r.set_min_version(min_version);
  r.set_incarnation(incarnation);
  return r;
}

// Pulls everything: part -> values; counts the chunks.
absl::StatusOr<v1::PullResponse::Header> PullAll(ShardChannel* channel,
                                                 const v1::PullRequest& request,
                                                 std::map<std::string, std::vector<float>>* values,
                                                 int* chunks = nullptr) {
  return channel->Pull(request, [&](const PulledChunk& c) {
    auto& v = (*values)[std::string(c.part())];
    v.resize(std::max<size_t>(v.size(), c.offset() + c.data_bytes() / 4));
    c.CopyTo(reinterpret_cast<char*>(v.data() + c.offset()));
    if (chunks) ++*chunks;
    return absl::OkStatus();
  });
}

// A push of `value` everywhere from `worker`, in chunks of 1000 elements.
absl::StatusOr<v1::PushResponse> PushAll(ShardChannel* channel, const Shard& shard, int worker,
                                         int64_t version, float value, int64_t incarnation = 0) {
  std::vector<float> data(100000, value);
  std::vector<ChunkRef> chunks;
  for (const auto& p : shard.parts()) {
    for (int64_t off = 0; off < p.num_elements(); off += 1000) {
      chunks.push_back({&p.name, static_cast<uint64_t>(off), data.data(),
                        static_cast<uint64_t>(std::min<int64_t>(1000, p.num_elements() - off))});
    }
  }
  v1::PushRequest::Header h;
  h.set_worker_index(worker);
  h.set_version(version);
  h.set_worker_clock(version + 1);
  h.set_incarnation(incarnation);
  return channel->Push(h, chunks);
}

class InProcessTest : public ::testing::Test {
 protected:
  void Make(const std::string& yaml, int shard = 0) {
    auto config = TaskConfigFor(yaml, "worker", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = std::make_unique<TaskConfig>(std::move(*config));
    auto ps = InProcessPs::Create(*config_, shard, &clock_, /*incarnation=*/7);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = std::move(*ps);
  }
  FakeClock clock_;
  std::unique_ptr<TaskConfig> config_;
  std::unique_ptr<InProcessPs> ps_;
};

TEST_F(InProcessTest, HandshakePullInChunksAndValidatedPushesAsOverTheWire) {
  Make(Job("async", 2, 1), /*shard=*/1);
  auto channel = ps_->NewChannel(/*max_chunk_bytes=*/4096);
  auto info = channel->GetInfo(v1::InfoRequest(), absl::Seconds(1));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->shard_index(), 1);
  EXPECT_EQ(info->model_fingerprint(), config_->fingerprint);
  EXPECT_EQ(info->incarnation(), 7);
  std::map<std::string, std::vector<float>> values;
  int chunks = 0;
  auto h = PullAll(channel.get(), PullAt(0), &values, &chunks);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->incarnation(), 7);
  int64_t elements = 0;
  for (const auto& p : ps_->shard()->parts()) {
    EXPECT_EQ(values[p.name].size(), static_cast<size_t>(p.num_elements())) << p.name;
    elements += p.num_elements();
  }
  EXPECT_GT(chunks, static_cast<int>(ps_->shard()->parts().size()));  // 4 KiB chunks
  EXPECT_EQ(h->total_bytes(), static_cast<uint64_t>(elements * 4));

  auto before = values;
  auto pushed = PushAll(channel.get(), *ps_->shard(), 0, 0, 0.5f);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->version(), 1);
  values.clear();
  ASSERT_TRUE(PullAll(channel.get(), PullAt(1), &values).ok());
  for (const auto& [name, v] : values) EXPECT_FLOAT_EQ(v[3], before[name][3] - 0.5f) << name;

  // A bad push is refused by the same checks as the gRPC service's.
  std::string bogus = "no/such/part";
  float x = 1;
  v1::PushRequest::Header header;
  EXPECT_EQ(channel->Push(header, {ChunkRef{&bogus, 0, &x, 1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_->shard()->version(), 1);
}

TEST_F(InProcessTest, ReadersAndTheChiefsShutdownGoThroughTheTaskType) {
  Make(Job("sync", 1, 2, /*chief=*/true));
  auto channel = ps_->NewChannel();
  v1::ShutdownRequest by_worker0;
  EXPECT_EQ(channel->Shutdown(by_worker0).status().code(), absl::StatusCode::kPermissionDenied);
  v1::PullRequest chief_pull = PullAt(0);
  chief_pull.set_task_type(v1::TASK_TYPE_CHIEF);
  std::map<std::string, std::vector<float>> values;
  ASSERT_TRUE(PullAll(channel.get(), chief_pull, &values).ok());
  v1::ShutdownRequest by_chief;
  by_chief.set_task_type(v1::TASK_TYPE_CHIEF);
  ASSERT_TRUE(channel->Shutdown(by_chief).ok());
  EXPECT_TRUE(ps_->shard()->shutdown_requested());
}

TEST_F(InProcessTest, RestartFailsHeldPullsLikeADeadProcessAndComesBackFromTheCheckpoint) {
  Make(Job("sync", 1, 2));
  auto channel = ps_->NewChannel();
  ASSERT_TRUE(PushAll(channel.get(), *ps_->shard(), 0, 0, 1, 7).ok());
  ASSERT_TRUE(PushAll(channel.get(), *ps_->shard(), 1, 0, 1, 7).ok());
  ShardCheckpoint at_1 = ps_->shard()->Checkpoint();
  ASSERT_TRUE(PushAll(channel.get(), *ps_->shard(), 0, 1, 1, 7).ok());
  ASSERT_TRUE(PushAll(channel.get(), *ps_->shard(), 1, 1, 1, 7).ok());
  ASSERT_EQ(ps_->shard()->version(), 2);
  // Worker 0 waits at the barrier for version 3 ...
  absl::StatusOr<v1::PullResponse::Header> held;
  std::thread waiter([&] {
    std::map<std::string, std::vector<float>> values;
    held = PullAll(channel.get(), PullAt(3, 0, 7), &values);
  });
  // ... when the PS dies and comes back from its checkpoint at version 1.
  while (ps_->held_pulls() == 0) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(ps_->Restart(at_1).ok());
  waiter.join();
  EXPECT_EQ(held.status().code(), absl::StatusCode::kUnavailable) << held.status();
  EXPECT_EQ(ps_->restarts(), 1);
  EXPECT_EQ(ps_->shard()->incarnation(), 8);
  EXPECT_EQ(ps_->shard()->version(), 1);
  EXPECT_EQ(ps_->shard()->stats().restored_version, 1);
  // The retried pull (still naming incarnation 7) is answered at once.
  std::map<std::string, std::vector<float>> values;
  auto again = PullAll(channel.get(), PullAt(3, 0, 7), &values);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->incarnation(), 8);
  EXPECT_EQ(again->version(), 1);
}

TEST_F(InProcessTest, FaultyChannelFailsDropsDelaysAndRestartsOnCue) {
  Make(Job("async", 1, 1));
  FaultyShardChannel faulty(ps_->NewChannel());
  faulty.DropNext(ShardRpc::kGetInfo, 2);
  EXPECT_EQ(faulty.GetInfo(v1::InfoRequest(), absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(faulty.GetInfo(v1::InfoRequest(), absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(faulty.GetInfo(v1::InfoRequest(), absl::Seconds(1)).ok());
  EXPECT_EQ(faulty.calls(ShardRpc::kGetInfo), 3);

  faulty.FailNext(ShardRpc::kPush, 1, absl::ResourceExhaustedError("full"));
  EXPECT_EQ(PushAll(&faulty, *ps_->shard(), 0, 0, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ps_->shard()->version(), 0);  // the PS never saw it
  ASSERT_TRUE(PushAll(&faulty, *ps_->shard(), 0, 0, 1).ok());
  EXPECT_EQ(ps_->shard()->version(), 1);

  faulty.Delay(ShardRpc::kLeave, absl::Milliseconds(30));
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(faulty.Leave(v1::LeaveRequest()).ok());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(30));

  std::vector<int> seen;
  faulty.Before(ShardRpc::kPull, [&](int call) {
    seen.push_back(call);
    return absl::OkStatus();
  });
  faulty.RestartBefore(ShardRpc::kPull, 2, ps_.get());
  std::map<std::string, std::vector<float>> values;
  auto first = PullAll(&faulty, PullAt(0), &values);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->incarnation(), 7);
  auto second = PullAll(&faulty, PullAt(0), &values);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->incarnation(), 8);
  EXPECT_EQ(second->version(), 0);  // restarted without a checkpoint
  EXPECT_EQ(seen, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace kubetrain
