// PsClient over in-process PS tasks on a fake clock (sleeping on it moves it
// forward at once): retry with backoff until the deadline, no retry of real
// errors, the re-issue of a held pull after the PS let go of it, restart
// (incarnation) detection with the steps lost, and the mapping of parts —
// including variables split over two PS tasks — onto whole variables.
#include "worker/ps_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "worker/testing.h"

namespace kubetrain {
namespace {

using testjob::InProcessCluster;
using testjob::JobShape;
using testjob::JobYaml;

class PsClientTest : public ::testing::Test {
 protected:
  void Make(const JobShape& shape) { MakeFromYaml(JobYaml(shape)); }
  void MakeFromYaml(const std::string& yaml) {
    auto config = TaskConfigFor(yaml, "worker", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = std::make_unique<TaskConfig>(std::move(*config));
    auto cluster = InProcessCluster::Create(*config_, &clock_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  // A client for worker `index` (or another task type); its channels' fault
  // switches in `faulty`.
  std::unique_ptr<PsClient> Client(int index, std::vector<FaultyShardChannel*>* faulty = nullptr,
                                   v1::TaskType type = v1::TASK_TYPE_WORKER) {
    PsClient::Options o;
    o.task_type = type;
    o.task_index = index;
    o.fingerprint = config_->fingerprint;
    o.chunk_bytes = 4096;
    o.retry_timeout = absl::Seconds(10);
    o.hold_timeout = absl::Seconds(1);
    return std::make_unique<PsClient>(o, &config_->placement, &clock_, cluster_->Channels(faulty),
                                      PsClientMetrics{});
  }
  Params Grads(float value) const {
    Params g;
    for (const auto& v : config_->model->variables()) g.emplace_back(v.num_elements(), value);
    return g;
  }

  FakeClock clock_;
  std::unique_ptr<TaskConfig> config_;
  std::unique_ptr<InProcessCluster> cluster_;
};

TEST_F(PsClientTest, RetriesAnUnavailablePsWithBackoffUntilTheDeadline) {
  Make({.ps = 1, .workers = 1});
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  faulty[0]->FailNext(ShardRpc::kGetInfo, -1, absl::UnavailableError("connection refused"));
  const absl::Time start = clock_.Now();
  absl::Status s = client->Connect();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  // Backoff 0.1, 0.2, 0.4, 0.8, 1.6, then 2 s: attempts at 0, 0.1, 0.3, 0.7,
  // 1.5, 3.1, 5.1, 7.1, 9.1 s; the next would come after the 10 s deadline.
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kGetInfo), 9);
  EXPECT_EQ(clock_.Now() - start, absl::Milliseconds(9100));
  EXPECT_NE(s.message().find("gave up on connect to ps:0 after 9 attempts"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("connection refused"), std::string::npos) << s;
}

TEST_F(PsClientTest, RetriesALostPushUntilItGoesThroughOnceAndNeverRetriesRealErrors) {
  Make({.ps = 1, .workers = 1, .mode = "async"});
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, config_->model->variables(), &params).ok());
  faulty[0]->DropNext(ShardRpc::kPush, 3);
  const absl::Time start = clock_.Now();
  auto pushed = client->Push(Grads(0.1f), 1);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPush), 4);
  EXPECT_EQ(clock_.Now() - start, absl::Milliseconds(100 + 200 + 400));
  EXPECT_EQ(cluster_->ps(0)->shard()->stats().gradients_applied, 1);  // the PS saw it once

  faulty[0]->FailNext(ShardRpc::kPush, 1, absl::InvalidArgumentError("bad gradient"));
  EXPECT_EQ(client->Push(Grads(0.1f), 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPush), 5);
}

TEST_F(PsClientTest, ReissuesAHeldBarrierPullAfterTheHoldTimeout) {
  Make({.ps = 1, .workers = 2});
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, config_->model->variables(), &params).ok());
  ASSERT_TRUE(client->Push(Grads(0.1f), 1).ok());
  absl::StatusOr<PsClient::PullResult> barrier;
  std::thread waiter([&] {
    barrier = client->Pull(/*next_version=*/true, 1, config_->model->variables(), &params);
  });
  // Worker 1 is slow: the PS lets go of the held pull after its 1 s timeout
  // and the client asks again.
  while (faulty[0]->calls(ShardRpc::kPull) < 3) {
    clock_.Advance(absl::Seconds(2));
    cluster_->TickAll();
    absl::SleepFor(absl::Milliseconds(1));
  }
  Shard* shard = cluster_->ps(0)->shard().get();
  std::vector<std::vector<float>> g;
  for (const auto& p : shard->parts()) g.emplace_back(p.num_elements(), 0.1f);
  ASSERT_TRUE(shard->Push({1, 0, 1}, g).ok());  // worker 1 arrives: the barrier opens
  waiter.join();
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  EXPECT_EQ(barrier->version, 1);
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPull), 3);  // the first pull, the held one, its re-issue
}

TEST_F(PsClientTest, DetectsAPsRestartAndCountsTheStepsLost) {
  Make({.ps = 1, .workers = 1, .mode = "async"});
  auto client = Client(0);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ShardCheckpoint at_2;
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(client->Pull(false, step, config_->model->variables(), &params).ok());
    if (step == 2) at_2 = cluster_->ps(0)->shard()->Checkpoint();
    ASSERT_TRUE(client->Push(Grads(0.1f), step + 1).ok());
  }
  auto seen = client->Pull(false, 5, config_->model->variables(), &params);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->version, 5);
  EXPECT_EQ(seen->steps_lost, 0);
  EXPECT_EQ(seen->ps_restarts, 0);
  ASSERT_TRUE(cluster_->ps(0)->Restart(at_2).ok());
  auto after = client->Pull(false, 5, config_->model->variables(), &params);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version, 2);
  EXPECT_EQ(after->steps_lost, 3);
  EXPECT_EQ(after->ps_restarts, 1);
  // A push tagged with the old incarnation could not have reached the new
  // shard: the client now tags the new one, and the step is applied.
  auto pushed = client->Push(Grads(0.1f), 6);
  ASSERT_TRUE(pushed.ok());
  EXPECT_FALSE(pushed->dropped);
  EXPECT_EQ(pushed->version, 3);
}

TEST_F(PsClientTest, APsRestartThatLostNoStepIsStillARestart) {
  // Killed right after checkpointing the version this client last pulled: a
  // restart all the same (the integration test saw ps_restarts_seen 0 then).
  Make({.ps = 1, .workers = 1, .mode = "async"});
  auto client = Client(0);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(client->Pull(false, step, config_->model->variables(), &params).ok());
    ASSERT_TRUE(client->Push(Grads(0.1f), step + 1).ok());
  }
  ASSERT_TRUE(client->Pull(false, 3, config_->model->variables(), &params).ok());
  ASSERT_TRUE(cluster_->ps(0)->Restart(cluster_->ps(0)->shard()->Checkpoint()).ok());
  auto after = client->Pull(false, 3, config_->model->variables(), &params);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version, 3);
  EXPECT_EQ(after->steps_lost, 0);
  EXPECT_EQ(after->ps_restarts, 1);
  auto polled = client->PollStep();
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_EQ(polled->ps_restarts, 0);  // seen once
}

TEST_F(PsClientTest, MapsPartsOfVariablesSplitOverTwoPsTasksOntoWholeVariables) {
  Make({.ps = 2, .workers = 1, .mode = "async"});
  // The 784x10 kernel (31 KB) is above the 16 KB threshold: split by rows.
  int kernel_parts = 0;
  for (const auto& p : config_->placement.parts)
    kernel_parts += p.name.rfind("dense0/kernel/part", 0) == 0;
  ASSERT_EQ(kernel_parts, 2);
  auto client = Client(0);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, config_->model->variables(), &params).ok());
  const Params initial = config_->model->InitialParams(config_->job.training.seed);
  EXPECT_EQ(params, initial);
  // Every element gets its own gradient; SGD with learning rate 0.5.
  Params grads = Grads(0);
  for (auto& v : grads) {
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k % 97) / 64.0f;
  }
  ASSERT_TRUE(client->Push(grads, 1).ok());
  auto pulled = client->PullAtLeast(1, 1, config_->model->variables(), &params);
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(pulled->version, 1);
  for (size_t v = 0; v < params.size(); ++v) {
    for (size_t k = 0; k < params[v].size(); ++k) {
      ASSERT_FLOAT_EQ(params[v][k], initial[v][k] - 0.5f * grads[v][k])
          << "variable " << v << " element " << k;
    }
  }
}

TEST_F(PsClientTest, AReaderCannotPushAndOnlyTheChiefEndsTheJob) {
  Make({.ps = 2, .workers = 1, .chief = true});
  auto worker0 = Client(0);
  auto chief = Client(0, nullptr, v1::TASK_TYPE_CHIEF);
  ASSERT_TRUE(worker0->Connect().ok());
  ASSERT_TRUE(chief->Connect().ok());
  EXPECT_EQ(chief->Push(Grads(0.1f), 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(worker0->Shutdown().status().code(), absl::StatusCode::kPermissionDenied);
  auto stats = chief->Shutdown();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(cluster_->ps(0)->shard()->shutdown_requested());
  EXPECT_TRUE(cluster_->ps(1)->shard()->shutdown_requested());
}

TEST_F(PsClientTest, CancelStopsRetrying) {
  Make({.ps = 2, .workers = 1});
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  faulty[1]->Before(ShardRpc::kGetInfo, [&](int call) {
    if (call == 3) client->Cancel();
    return absl::OkStatus();
  });
  faulty[1]->FailNext(ShardRpc::kGetInfo, -1, absl::UnavailableError("not yet"));
  EXPECT_EQ(client->Connect().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(faulty[1]->calls(ShardRpc::kGetInfo), 3);
}

// A dynamic table cannot be pulled by id (its ids are unknown): it is listed
// shard by shard, a chunk-sized page at a time, and a listing during which
// rows are created is refused rather than a mix of two tables.
TEST_F(PsClientTest, ListsADynamicTableShardByShardAndAbortsIfItsRowsChange) {
  MakeFromYaml(testjob::DynamicJobYaml(0));
  auto worker = Client(0);
  auto other = Client(1);
  ASSERT_TRUE(worker->Connect().ok());
  ASSERT_TRUE(other->Connect().ok());
  Params params;
  ASSERT_TRUE(worker->Pull(false, 0, config_->model->variables(), &params).ok());
  TableIds ids(1);
  for (uint64_t i = 1; i <= 400; ++i)
    ids[0].push_back(static_cast<int64_t>(i * 0x9E3779B97F4A7C15ULL >> 1));
  ASSERT_TRUE(worker->PullRows(ids, &params).ok());  // creates them
  const std::vector<float> created = params[config_->placement.tables[0].variable];
  auto count = worker->CountRows(0);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 400);

  std::map<int64_t, std::vector<float>> listed;
  std::vector<int64_t> order;  // as listed
  int pages = 0;
  ASSERT_TRUE(worker
                  ->ListRows(0,
                             [&](const int64_t* id, const float* values, int64_t n) {
                               ++pages;
                               for (int64_t k = 0; k < n; ++k) {
                                 listed[id[k]].assign(values + 4 * k, values + 4 * (k + 1));
                                 order.push_back(id[k]);
                               }
                             })
                  .ok());
  // Shard by shard (id mod 2), each in increasing id order.
  ASSERT_EQ(order.size(), 400u);
  const auto second =
      std::find_if(order.begin(), order.end(), [](int64_t id) { return id % 2 == 1; });
  EXPECT_TRUE(std::all_of(order.begin(), second, [](int64_t id) { return id % 2 == 0; }));
  EXPECT_TRUE(std::all_of(second, order.end(), [](int64_t id) { return id % 2 == 1; }));
  EXPECT_TRUE(std::is_sorted(order.begin(), second));
  EXPECT_TRUE(std::is_sorted(second, order.end()));
  EXPECT_GE(pages, 4);  // 4096-byte pages of 157 rows, ~200 rows per shard
  ASSERT_EQ(listed.size(), 400u);
  for (size_t i = 0; i < ids[0].size(); ++i) {
    EXPECT_EQ(listed[ids[0][i]],
              std::vector<float>(created.begin() + 4 * i, created.begin() + 4 * (i + 1)));
  }

  // Another worker creates rows between two pages: the listing is refused.
  TableIds more(1, {int64_t{2}, int64_t{4}, int64_t{3}, int64_t{5}});
  Params scratch = params;
  bool created_more = false;
  absl::Status changed = worker->ListRows(0, [&](const int64_t*, const float*, int64_t) {
    if (!created_more) created_more = other->PullRows(more, &scratch).ok();
  });
  EXPECT_TRUE(created_more);
  EXPECT_EQ(changed.code(), absl::StatusCode::kAborted) << changed;
  EXPECT_NE(changed.message().find("changed while they were listed"), absl::string_view::npos);
  // A reader creates nothing, whatever it reads.
  auto chief_count = worker->CountRows(0);
  ASSERT_TRUE(chief_count.ok());
  EXPECT_EQ(*chief_count, 404);
  TableIds unseen(1, {int64_t{1} << 40, (int64_t{1} << 40) + 1});
  ASSERT_TRUE(worker->PullRows(unseen, &scratch, /*read_only=*/true).ok());
  EXPECT_EQ(*worker->CountRows(0), 404);
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// A gradient that depends on the values and the step (so that the two ways
// of running a step only agree if they apply the same gradients to the same
// values).
Params GradientOf(const Params& params, int step) {
  Params g = params;
  for (auto& v : g) {
    for (size_t k = 0; k < v.size(); ++k) v[k] = 0.25f * v[k] + static_cast<float>((k + step) % 7);
  }
  return g;
}

TEST_F(PsClientTest, APushPullStepIsBitIdenticalToAPushThenAPullInSyncMode) {
  Make({.ps = 2, .workers = 1});  // sync: every push is a step
  auto other = InProcessCluster::Create(*config_, &clock_);
  ASSERT_TRUE(other.ok()) << other.status();
  auto plain = Client(0);
  PsClient::Options o;
  o.task_index = 0;
  o.fingerprint = config_->fingerprint;
  o.chunk_bytes = 4096;
  PsClient fused(o, &config_->placement, &clock_, (*other)->Channels(), PsClientMetrics{});
  ASSERT_TRUE(plain->Connect().ok());
  ASSERT_TRUE(fused.Connect().ok());
  const auto& variables = config_->model->variables();
  Params a, b;
  ASSERT_TRUE(plain->Pull(false, 0, variables, &a).ok());
  ASSERT_TRUE(fused.Pull(false, 0, variables, &b).ok());
  const TableIds no_tables(config_->placement.tables.size());
  for (int step = 0; step < 5; ++step) {
    auto pushed = plain->Push(GradientOf(a, step), step + 1);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    auto pulled = plain->Pull(true, step + 1, variables, &a);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    auto both = fused.PushPull(GradientOf(b, step), step + 1, no_tables, true, variables, &b);
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_EQ(both->push.version, pushed->version);
    EXPECT_EQ(both->push.dropped, pushed->dropped);
    EXPECT_EQ(both->pull.version, pulled->version);
    EXPECT_EQ(both->pull.version, step + 1);
    ASSERT_EQ(a.size(), b.size());
    for (size_t v = 0; v < a.size(); ++v) {
      ASSERT_EQ(std::memcmp(a[v].data(), b[v].data(), a[v].size() * sizeof(float)), 0)
          << "variable " << v << " after step " << step;
    }
  }
}

TEST_F(PsClientTest, APushPullKeepsTheAsyncStalenessAccountingOfAPushThenAPull) {
  // Two async workers taking turns, the same turns both ways.
  Make({.ps = 1, .workers = 2, .mode = "async", .training = "    maxStaleness: 5\n"});
  auto other = InProcessCluster::Create(*config_, &clock_);
  ASSERT_TRUE(other.ok()) << other.status();
  PsClient::Options o;
  o.fingerprint = config_->fingerprint;
  o.chunk_bytes = 4096;
  std::vector<std::unique_ptr<PsClient>> plain, fused;
  for (int w = 0; w < 2; ++w) {
    plain.push_back(Client(w));
    o.task_index = w;
    fused.push_back(std::make_unique<PsClient>(o, &config_->placement, &clock_,
                                               (*other)->Channels(), PsClientMetrics{}));
    ASSERT_TRUE(plain[w]->Connect().ok());
    ASSERT_TRUE(fused[w]->Connect().ok());
  }
  const auto& variables = config_->model->variables();
  const TableIds no_tables(config_->placement.tables.size());
  std::vector<Params> a(2), b(2);
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(plain[w]->Pull(false, 0, variables, &a[w]).ok());
    ASSERT_TRUE(fused[w]->Pull(false, 0, variables, &b[w]).ok());
  }
  // Worker 0 takes two steps for each of worker 1's.
  const int turns[] = {0, 0, 1, 0, 0, 1, 0, 1};
  std::vector<int> clock(2, 0);
  for (int w : turns) {
    ++clock[w];
    auto pushed = plain[w]->Push(Grads(0.01f), clock[w]);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    auto pulled = plain[w]->Pull(false, clock[w], variables, &a[w]);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    auto both = fused[w]->PushPull(Grads(0.01f), clock[w], no_tables, false, variables, &b[w]);
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_EQ(both->push.staleness, pushed->staleness);
    EXPECT_EQ(both->push.version, pushed->version);
    EXPECT_EQ(both->pull.version, pulled->version);
    EXPECT_EQ(a[w], b[w]);
  }
  const ShardStatsSnapshot x = cluster_->ps(0)->shard()->stats();
  const ShardStatsSnapshot y = (*other)->ps(0)->shard()->stats();
  EXPECT_EQ(y.gradients_applied, x.gradients_applied);
  EXPECT_EQ(y.staleness_sum, x.staleness_sum);
  EXPECT_EQ(y.staleness_max, x.staleness_max);
  EXPECT_GT(x.staleness_max, 0);
  EXPECT_EQ(y.stale_gradients_dropped, x.stale_gradients_dropped);
  EXPECT_EQ(cluster_->ps(0)->shard()->WorkerClock(0), (*other)->ps(0)->shard()->WorkerClock(0));
  EXPECT_EQ(cluster_->ps(0)->shard()->WorkerClock(1), (*other)->ps(0)->shard()->WorkerClock(1));
}

TEST_F(PsClientTest, APsWithoutPushPullGetsAPushThenAPull) {
  Make({.ps = 2, .workers = 1, .mode = "async"});
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  ASSERT_TRUE(client->Connect().ok());
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, config_->model->variables(), &params).ok());
  faulty[1]->FailNext(ShardRpc::kPushPull, -1, absl::UnimplementedError("unknown method"));
  for (int step = 1; step <= 2; ++step) {
    auto both = client->PushPull(Grads(0.1f), step, TableIds(config_->placement.tables.size()),
                                 false, config_->model->variables(), &params);
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_EQ(both->pull.version, step);
  }
  EXPECT_EQ(faulty[0]->calls(ShardRpc::kPush), 0);
  EXPECT_EQ(faulty[1]->calls(ShardRpc::kPush), 2);
  EXPECT_EQ(faulty[1]->calls(ShardRpc::kPull), 3);
  EXPECT_EQ(cluster_->ps(1)->shard()->stats().gradients_applied, 2);
}

TEST_F(PsClientTest, APushPullWhoseAnswerIsLostIsRetriedAndAppliedOnce) {
  Make({.ps = 1, .workers = 1, .mode = "async"});
  PsClient::Options o;
  o.fingerprint = config_->fingerprint;
  o.chunk_bytes = 4096;
  std::vector<std::unique_ptr<ShardChannel>> channels;
  channels.push_back(std::make_unique<LosesPushPullAnswers>(cluster_->ps(0)->NewChannel(4096), 2));
  PsClient client(o, &config_->placement, &clock_, std::move(channels), PsClientMetrics{});
  ASSERT_TRUE(client.Connect().ok());
  Params params;
  ASSERT_TRUE(client.Pull(false, 0, config_->model->variables(), &params).ok());
  auto step = client.PushPull(Grads(0.1f), 1, TableIds(config_->placement.tables.size()), false,
                              config_->model->variables(), &params);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->push.dropped);
  EXPECT_EQ(step->pull.version, 1);
  const ShardStatsSnapshot stats = cluster_->ps(0)->shard()->stats();
  EXPECT_EQ(stats.gradients_applied, 1);  // three times sent, applied once
  EXPECT_EQ(stats.duplicate_pushes, 2);
}

TEST_F(PsClientTest, APsRestartDuringAPushPullsHoldAsksThePullAgainButNeverThePush) {
  // Sync, two workers: worker 0's push is applied, then its pull waits at
  // the barrier for worker 1, and the PS restarts (from its checkpoint at
  // version 0) while it waits.
  Make({.ps = 1, .workers = 2});
  std::vector<FaultyShardChannel*> faulty;
  auto client = Client(0, &faulty);
  ASSERT_TRUE(client->Connect().ok());
  const auto& variables = config_->model->variables();
  Params params;
  ASSERT_TRUE(client->Pull(false, 0, variables, &params).ok());
  const ShardCheckpoint at_0 = cluster_->ps(0)->shard()->Checkpoint();
  const TableIds no_tables(config_->placement.tables.size());
  absl::StatusOr<PsClient::PushPullResult> step;
  std::thread worker0(
      [&] { step = client->PushPull(Grads(0.1f), 1, no_tables, true, variables, &params); });
  while (cluster_->ps(0)->held_pulls(TaskRole::kWorker) == 0) absl::SleepFor(absl::Milliseconds(1));
  std::shared_ptr<Shard> old = cluster_->ps(0)->shard();
  ASSERT_TRUE(cluster_->ps(0)->Restart(at_0).ok());
  worker0.join();
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

  // The next step is the new shard's (its incarnation): applied once both
  // workers are in.
  std::thread again(
      [&] { step = client->PushPull(Grads(0.1f), 2, no_tables, true, variables, &params); });
  while (cluster_->ps(0)->held_pulls(TaskRole::kWorker) == 0) absl::SleepFor(absl::Milliseconds(1));
  Shard* shard = cluster_->ps(0)->shard().get();
  std::vector<std::vector<float>> g;
  for (const auto& p : shard->parts()) g.emplace_back(p.num_elements(), 0.1f);
  ASSERT_TRUE(shard->Push({1, 0, 1}, g).ok());
  again.join();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->push.dropped);
  EXPECT_EQ(step->pull.version, 1);
  EXPECT_EQ(step->pull.ps_restarts, 0);
}

// Hands the client's sink one chunk of `part` at `offset` instead of the
// shard's first chunk: a PS (or a man in the middle) sending a bad chunk.
class HostileChunkChannel : public ShardChannelWrapper {
 public:
  HostileChunkChannel(std::unique_ptr<ShardChannel> target, std::string part, uint64_t offset)
      : ShardChannelWrapper(std::move(target)), part_(std::move(part)), offset_(offset) {}
  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override {
    bool first = true;
    return ShardChannelWrapper::Pull(request, [&](const PulledChunk& c) -> absl::Status {
      if (!std::exchange(first, false)) return sink(c);
      const std::vector<char> data(c.data_bytes());
      return sink(FlatPulledChunk(part_, offset_, data.data(), data.size()));
    });
  }

 private:
  const std::string part_;
  const uint64_t offset_;
};

TEST_F(PsClientTest, APulledChunkOutsideItsPartIsRefusedNamingThePsAndThePart) {
  Make({.ps = 1, .workers = 1});
  const std::string part = config_->placement.parts[0].name;
  // Past the end, wrapping around 2^64 when added to the length, and unknown.
  for (const auto& [name, offset] : std::vector<std::pair<std::string, uint64_t>>{
           {part, 1u << 30}, {part, UINT64_MAX - 1}, {"no/such/part", 0}}) {
    std::vector<std::unique_ptr<ShardChannel>> channels;
    for (auto& c : cluster_->Channels(nullptr)) {
      channels.push_back(std::make_unique<HostileChunkChannel>(std::move(c), name, offset));
    }
    PsClient::Options o;
    o.fingerprint = config_->fingerprint;
    o.retry_timeout = absl::Seconds(1);
    PsClient client(o, &config_->placement, &clock_, std::move(channels), PsClientMetrics{});
    ASSERT_TRUE(client.Connect().ok());
    Params params;
    auto pulled = client.Pull(false, 0, config_->model->variables(), &params);
    EXPECT_EQ(pulled.status().code(), absl::StatusCode::kDataLoss) << name << " " << offset;
    EXPECT_NE(pulled.status().message().find("ps:0 sent a bad chunk of \"" + name + "\""),
              std::string::npos)
        << pulled.status();
  }
}

}  // namespace
}  // namespace kubetrain
