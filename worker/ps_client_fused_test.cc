// The overlapped fused step (PsClient::StartPushPull, GradientReady,
// FinishPushPull) over in-process PS tasks: the push is read by the channel
// a variable at a time, in backprop order, each only once it is ready; the
// PS applies it whole and the result is bit-identical to PushPull's; the
// async staleness accounting is PushPull's; and PushPull's guarantees hold:
// a lost answer retried and applied once, a PS restart during the hold (the
// pull asked again, never the push), a PS without PushPull, a step ended
// before every gradient was ready (never applied).
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "worker/ps_client.h"
#include "worker/testing.h"

namespace kubetrain {
namespace {

using testjob::InProcessCluster;
using testjob::JobShape;
using testjob::JobYaml;

// The job of JobYaml with a two-hidden-layer MLP (6 variables).
std::string MlpYaml(const JobShape& shape) {
  return absl::StrReplaceAll(
      JobYaml(shape), {{"model: {type: softmax}", "model: {type: mlp, hiddenUnits: [16, 8]}"}});
}

// Forwards every call; in a PushPull, records each chunk's part as the
// channel gets to read it (after its ready gate opened).
class WatchesPush : public ShardChannelWrapper {
 public:
  explicit WatchesPush(std::unique_ptr<ShardChannel> target)
      : ShardChannelWrapper(std::move(target)) {}
  using ShardChannelWrapper::Push;
  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override {
    std::vector<ChunkRef> watched = chunks;
    std::vector<RefReady> gates(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      gates[i] = [this, inner = chunks[i].ready, part = *chunks[i].part]() -> absl::Status {
        absl::Status s = inner != nullptr ? (*inner)() : absl::OkStatus();
        absl::MutexLock l(&mu_);
        read_.push_back(part);
        return s;
      };
      watched[i].ready = &gates[i];
    }
    return ShardChannelWrapper::PushPull(header, watched, sparse, pull, sink);
  }
  // Waits until `n` chunks were read, or (a failure) 20 s; returns the parts read.
  std::vector<std::string> AwaitRead(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return read_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20));
    return read_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> read_ ABSL_GUARDED_BY(mu_);
};

class PsClientFusedTest : public ::testing::Test {
 protected:
  void MakeFromYaml(const std::string& yaml) {
    auto config = TaskConfigFor(yaml, "worker", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = std::make_unique<TaskConfig>(std::move(*config));
    auto cluster = InProcessCluster::Create(*config_, &clock_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  PsClient::Options ClientOptions(int index) const {
    PsClient::Options o;
    o.task_index = index;
    o.fingerprint = config_->fingerprint;
    o.chunk_bytes = 4096;
    o.retry_timeout = absl::Seconds(10);
    o.hold_timeout = absl::Seconds(1);
    return o;
  }
  std::unique_ptr<PsClient> Client(int index, std::vector<FaultyShardChannel*>* faulty = nullptr,
                                   InProcessCluster* cluster = nullptr) {
    if (cluster == nullptr) cluster = cluster_.get();
    return std::make_unique<PsClient>(ClientOptions(index), &config_->placement, &clock_,
                                      cluster->Channels(faulty), PsClientMetrics{});
  }
  const std::vector<VariableSpec>& variables() const { return config_->model->variables(); }
  TableIds NoTables() const { return TableIds(config_->placement.tables.size()); }
  // The overlapped step of `grads`, its gradients made ready in backprop order.
  absl::StatusOr<PsClient::PushPullResult> Overlapped(PsClient* client, const Params& grads,
                                                      int64_t clock, bool sync, Params* params) {
    const std::vector<int> order = config_->model->BackpropOrder();
    if (absl::Status s =
            client->StartPushPull(grads, clock, NoTables(), sync, variables(), params, order);
        !s.ok()) {
      return s;
    }
    for (int v : order) client->GradientReady(v);
    return client->FinishPushPull();
  }

  FakeClock clock_;
  std::unique_ptr<TaskConfig> config_;
  std::unique_ptr<InProcessCluster> cluster_;
};

// A gradient that depends on the values and the step (so two ways of running
// steps only agree if they apply the same gradients to the same values).
Params GradientOf(const Params& params, int step) {
  Params g = params;
  for (auto& v : g) {
    for (size_t k = 0; k < v.size(); ++k) v[k] = 0.25f * v[k] + static_cast<float>((k + step) % 7);
  }
  return g;
}

TEST_F(PsClientFusedTest, ThePushIsReadAVariableAtATimeInBackpropOrderAsEachIsReady) {
  MakeFromYaml(MlpYaml({.ps = 1, .workers = 1}));
  std::vector<std::unique_ptr<ShardChannel>> channels;
  auto watch = std::make_unique<WatchesPush>(cluster_->ps(0)->NewChannel(4096));
  WatchesPush* watched = watch.get();
  channels.push_back(std::move(watch));
  PsClient client(ClientOptions(0), &config_->placement, &clock_, std::move(channels),
                  PsClientMetrics{});
  ASSERT_TRUE(client.Connect().ok());
  Params params;
  ASSERT_TRUE(client.Pull(false, 0, variables(), &params).ok());
  const std::vector<int> order = config_->model->BackpropOrder();
  ASSERT_EQ(order.size(), 6u);
  Params grads = GradientOf(params, 0);
  ASSERT_TRUE(client.StartPushPull(grads, 1, NoTables(), true, variables(), &params, order).ok());
  size_t read = 0;
  for (int v : order) {
    client.GradientReady(v);
    // The chunks of v (4096-byte chunks: 1024 floats each), and no more:
    // the next variable's gate is still closed.
    read += (variables()[v].num_elements() + 1023) / 1024;
    const std::vector<std::string> parts = watched->AwaitRead(read);
    ASSERT_EQ(parts.size(), read) << variables()[v].name;
    EXPECT_EQ(parts.back(), variables()[v].name);
  }
  auto step = client.FinishPushPull();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->push.dropped);
  EXPECT_EQ(step->pull.version, 1);
  EXPECT_EQ(cluster_->ps(0)->shard()->stats().gradients_applied, 1);
  // The last layer went first.
  EXPECT_EQ(watched->AwaitRead(0).front(), "dense2/kernel");
}

TEST_F(PsClientFusedTest, OverlappedStepsAreBitIdenticalToPushPullsInSyncModeOverTwoPs) {
  MakeFromYaml(MlpYaml({.ps = 2, .workers = 1}));
  auto other = InProcessCluster::Create(*config_, &clock_);
  ASSERT_TRUE(other.ok()) << other.status();
  auto plain = Client(0);
  auto fused = Client(0, nullptr, other->get());
  ASSERT_TRUE(plain->Connect().ok());
  ASSERT_TRUE(fused->Connect().ok());
  Params a, b;
  ASSERT_TRUE(plain->Pull(false, 0, variables(), &a).ok());
  ASSERT_TRUE(fused->Pull(false, 0, variables(), &b).ok());
  // A variable split over both PS tasks, so each shard's push is reordered.
  EXPECT_GT(config_->placement.PartsOfShard(0).size() + config_->placement.PartsOfShard(1).size(),
            variables().size());
  for (int step = 0; step < 5; ++step) {
    auto one = plain->PushPull(GradientOf(a, step), step + 1, NoTables(), true, variables(), &a);
    ASSERT_TRUE(one.ok()) << one.status();
    auto two = Overlapped(fused.get(), GradientOf(b, step), step + 1, true, &b);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(two->push.version, one->push.version);
    EXPECT_EQ(two->pull.version, step + 1);
    ASSERT_EQ(a.size(), b.size());
    for (size_t v = 0; v < a.size(); ++v) {
      ASSERT_EQ(std::memcmp(a[v].data(), b[v].data(), a[v].size() * sizeof(float)), 0)
          << "variable " << v << " after step " << step;
    }
  }
}

TEST_F(PsClientFusedTest, OverlappedStepsKeepTheAsyncStalenessAccountingOfPushPulls) {
  // Two async workers taking turns, the same turns both ways.
  MakeFromYaml(
      MlpYaml({.ps = 1, .workers = 2, .mode = "async", .training = "    maxStaleness: 5\n"}));
  auto other = InProcessCluster::Create(*config_, &clock_);
  ASSERT_TRUE(other.ok()) << other.status();
  std::vector<std::unique_ptr<PsClient>> plain, fused;
  std::vector<Params> a(2), b(2);
  for (int w = 0; w < 2; ++w) {
    plain.push_back(Client(w));
    fused.push_back(Client(w, nullptr, other->get()));
    ASSERT_TRUE(plain[w]->Connect().ok());
    ASSERT_TRUE(fused[w]->Connect().ok());
    ASSERT_TRUE(plain[w]->Pull(false, 0, variables(), &a[w]).ok());
    ASSERT_TRUE(fused[w]->Pull(false, 0, variables(), &b[w]).ok());
  }
  const int turns[] = {0, 0, 1, 0, 0, 1, 0, 1};
  std::vector<int> clock(2, 0);
  for (int w : turns) {
    ++clock[w];
    auto one = plain[w]->PushPull(GradientOf(a[w], clock[w]), clock[w], NoTables(), false,
                                  variables(), &a[w]);
    ASSERT_TRUE(one.ok()) << one.status();
    auto two = Overlapped(fused[w].get(), GradientOf(b[w], clock[w]), clock[w], false, &b[w]);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(two->push.staleness, one->push.staleness);
    EXPECT_EQ(two->push.version, one->push.version);
    EXPECT_EQ(two->pull.version, one->pull.version);
    EXPECT_EQ(a[w], b[w]);
  }
  const ShardStatsSnapshot x = cluster_->ps(0)->shard()->stats();
  const ShardStatsSnapshot y = (*other)->ps(0)->shard()->stats();
  EXPECT_EQ(y.gradients_applied, x.gradients_applied);
  EXPECT_EQ(y.staleness_sum, x.staleness_sum);
  EXPECT_EQ(y.staleness_max, x.staleness_max);
  EXPECT_GT(x.staleness_max, 0);
  EXPECT_EQ(y.stale_gradients_dropped, x.stale_gradients_dropped);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ((*other)->ps(0)->shard()->WorkerClock(w), cluster_->ps(0)->shard()->WorkerClock(w));
  }
}

TEST_F(PsClientFusedTest, AnOverlappedStepWhoseAnswerIsLostIsRetriedAndAppliedOnce) {
  MakeFromYaml(MlpYaml({.ps = 1, .workers = 1, .mode = "async"}));
  std::vector<std::unique_ptr<ShardChannel>> channels;
  channels.push_back(std::make_unique<LosesPushPullAnswers>(cluster_->ps(0)->NewChannel(4096), 2));
  PsClient client(ClientOptions(0), &config_->placement, &clock_, std::move(channels),
                  PsClientMetrics{});
  ASSERT_TRUE(client.Connect().ok());
  Params params;
  ASSERT_TRUE(client.Pull(false, 0, variables(), &params).ok());
  auto step = Overlapped(&client, GradientOf(params, 0), 1, false, &params);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->push.dropped);
  EXPECT_EQ(step->pull.version, 1);
  const ShardStatsSnapshot stats = cluster_->ps(0)->shard()->stats();
  EXPECT_EQ(stats.gradients_applied, 1);  // three times sent, applied once
  EXPECT_EQ(stats.duplicate_pushes, 2);
}

TEST_F(PsClientFusedTest, APsWithoutPushPullGetsAnOverlappedPushThenAPull) {
  MakeFromYaml(MlpYaml({.ps = 2, .workers = 1, .mode = "async"}));
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, variables(), &params).ok());
  faulty[1]->FailNext(ShardRpc::kPushPull, -1, absl::UnimplementedError("unknown method"));
  for (int step = 1; step <= 2; ++step) {
    auto both = Overlapped(client.get(), GradientOf(params, step), step, false, &params);
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_EQ(both->pull.version, step);
  }
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPush), 0);
  EXPECT_EQ(faulty[1]->calls(ShardRpc::kPush), 2);
  EXPECT_EQ(faulty[1]->calls(ShardRpc::kPull), 3);
  EXPECT_EQ(cluster_->ps(1)->shard()->stats().gradients_applied, 2);
}

TEST_F(PsClientFusedTest, APsRestartDuringAnOverlappedStepsHoldAsksThePullAgainButNeverThePush) {
  // Sync, two workers: worker 0's overlapped push is applied, then its pull
  // waits at the barrier for worker 1, and the PS restarts (from its
  // checkpoint at version 0) while it waits.
  MakeFromYaml(MlpYaml({.ps = 1, .workers = 2}));
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, variables(), &params).ok());
  const ShardCheckpoint at_0 = cluster_->ps(0)->shard()->Checkpoint();
  const std::vector<int> order = config_->model->BackpropOrder();
  Params grads = GradientOf(params, 0);
  ASSERT_TRUE(client->StartPushPull(grads, 1, NoTables(), true, variables(), &params, order).ok());
  for (int v : order) client->GradientReady(v);
  while (cluster_->ps(0)->held_pulls(TaskRole::kWorker) == 0) absl::SleepFor(absl::Milliseconds(1));
  std::shared_ptr<Shard> old = cluster_->ps(0)->shard();
  ASSERT_TRUE(cluster_->ps(0)->Restart(at_0).ok());
  auto step = client->FinishPushPull();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->push.dropped);
  EXPECT_EQ(step->pull.version, 0);
  EXPECT_EQ(step->pull.ps_restarts, 1);
  EXPECT_EQ(step->pull.steps_lost, 0);
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPushPull), 1);  // the push went once
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPull), 2);      // the first pull, the pull asked again
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPush), 0);
  EXPECT_EQ(old->version(), 0);  // worker 0's gradient waited there for worker 1's
  EXPECT_EQ(cluster_->ps(0)->shard()->stats().gradients_applied, 0);
  EXPECT_EQ(cluster_->ps(0)->shard()->stats().duplicate_pushes, 0);
  // The values are the restarted shard's (its checkpoint at version 0).
  ASSERT_EQ(at_0.part_names.size(), params.size());  // one PS: every variable whole
  for (size_t p = 0; p < at_0.part_names.size(); ++p) {
    for (size_t v = 0; v < params.size(); ++v) {
      if (variables()[v].name == at_0.part_names[p]) {
        EXPECT_EQ(params[v], at_0.values[p]);
      }
    }
  }

  // The next step is the new shard's (its incarnation): applied once both
  // workers are in.
  grads = GradientOf(params, 1);
  ASSERT_TRUE(client->StartPushPull(grads, 2, NoTables(), true, variables(), &params, order).ok());
  for (int v : order) client->GradientReady(v);
  while (cluster_->ps(0)->held_pulls(TaskRole::kWorker) == 0) absl::SleepFor(absl::Milliseconds(1));
  Shard* shard = cluster_->ps(0)->shard().get();
  std::vector<std::vector<float>> g;
  for (const auto& p : shard->parts()) g.emplace_back(p.num_elements(), 0.1f);
  ASSERT_TRUE(shard->Push({1, 0, 1}, g).ok());
  step = client->FinishPushPull();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->push.dropped);
  EXPECT_EQ(step->pull.version, 1);
  EXPECT_EQ(step->pull.ps_restarts, 0);
  EXPECT_EQ(shard->stats().gradients_applied, 2);
}

TEST_F(PsClientFusedTest, AStepEndedBeforeEveryGradientWasReadyIsNeverApplied) {
  MakeFromYaml(MlpYaml({.ps = 2, .workers = 1, .mode = "async"}));
  auto client = Client(0);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, variables(), &params).ok());
  const std::vector<int> order = config_->model->BackpropOrder();
  Params grads = GradientOf(params, 0);
  ASSERT_TRUE(client->StartPushPull(grads, 1, NoTables(), false, variables(), &params, order).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      client->StartPushPull(grads, 1, NoTables(), false, variables(), &params, order)));
  client->GradientReady(order[0]);  // the rest never
  auto step = client->FinishPushPull();
  EXPECT_TRUE(absl::IsFailedPrecondition(step.status())) << step.status();
  for (int ps = 0; ps < 2; ++ps) {
    EXPECT_EQ(cluster_->ps(ps)->shard()->stats().gradients_applied, 0);
    EXPECT_EQ(cluster_->ps(ps)->shard()->version(), 0);
  }
  // The client goes on: the next step is whole.
  auto next = Overlapped(client.get(), grads, 1, false, &params);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->pull.version, 1);
}

}  // namespace
}  // namespace kubetrain
