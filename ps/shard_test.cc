#include "ps/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "ps/shard_test_fixtures.h"

namespace kubetrain {
namespace {

// A 1-variable model stand-in: softmax over 2 inputs and 2 classes gives
// kernel [2x2] and bias [1x2]; SGD with lr 1 makes updates easy to check.
struct Fixture {
  Fixture(TrainingMode mode, int workers, int aggregate, std::optional<int64_t> tau = {},
          int64_t target = 100, absl::Duration barrier_timeout = absl::ZeroDuration(),
          int64_t incarnation = 1, bool has_chief = false, int evaluators = 0) {
    ModelSpec spec;
    spec.type = "softmax";
    spec.input_dim = 2;
    spec.num_classes = 2;
    model = std::make_unique<Model>(*Model::Create(spec));
    placement = PlaceVariables(model->variables(), 1, 1 << 20);
    ShardOptions o;
    o.num_workers = workers;
    o.mode = mode;
    o.replicas_to_aggregate = aggregate;
    o.max_staleness = tau;
    o.target_steps = target;
    o.barrier_timeout = barrier_timeout;
    o.incarnation = incarnation;
    o.has_chief_task = has_chief;
    o.num_evaluators = evaluators;
    OptimizerSpec opt;
    opt.type = "sgd";
    opt.learning_rate = 1.0;
    shard = *Shard::Create(o, *model, placement, opt, &clock, ShardMetrics{});
  }
  // `workers` workers, all aggregated in sync mode, with optimizer `opt`.
  Fixture(TrainingMode mode, int workers, const OptimizerSpec& opt) : Fixture(mode, workers, 1) {
    ShardOptions o = shard->options();
    o.replicas_to_aggregate = mode == TrainingMode::kSync ? workers : 1;
    shard = *Shard::Create(o, *model, placement, opt, &clock, ShardMetrics{});
  }
  std::vector<std::vector<float>> Grads(float v) const {
    std::vector<std::vector<float>> g;
    for (const auto& p : shard->parts()) g.emplace_back(p.num_elements(), v);
    return g;
  }
  // Values of part 0 via an immediate pull.
  std::vector<float> Values(int worker = 0) {
    std::vector<float> out;
    shard->Pull({worker, 0, 0}, clock.Now() + absl::Seconds(1),
                [&](absl::StatusOr<Shard::Snapshot> s) {
                  ASSERT_TRUE(s.ok());
                  out.resize(s->bytes->size() / 4);
                  std::memcpy(out.data(), s->bytes->data(), s->bytes->size());
                });
    return out;
  }
  FakeClock clock;
  std::unique_ptr<Model> model;
  Placement placement;
  std::unique_ptr<Shard> shard;
};

TEST(ShardSyncTest, AveragesReplicasToAggregateThenAdvances) {
  Fixture f(TrainingMode::kSync, 2, 2);
  auto before = f.Values();
  auto r1 = f.shard->Push({0, 0, 1}, f.Grads(1.0f));
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->version, 0);  // waiting for the second replica
  EXPECT_EQ(f.Values(), before);
  auto r2 = f.shard->Push({1, 0, 1}, f.Grads(3.0f));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->version, 1);
  auto after = f.Values();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 2.0f);
}

TEST(ShardSyncTest, BarrierPullWaitsForNextVersion) {
  Fixture f(TrainingMode::kSync, 2, 2);
  bool served = false;
  int64_t seen = -1;
  f.shard->Pull({0, 1, 1}, f.clock.Now() + absl::Seconds(10), [&](auto s) {
    ASSERT_TRUE(s.ok());
    served = true;
    seen = s->version;
  });
  EXPECT_FALSE(served);
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(1)).ok());
  EXPECT_FALSE(served);
  ASSERT_TRUE(f.shard->Push({1, 0, 1}, f.Grads(1)).ok());
  EXPECT_TRUE(served);
  EXPECT_EQ(seen, 1);
}

TEST(ShardSyncTest, BackupWorkerGradientIsDroppedAndCounted) {
  Fixture f(TrainingMode::kSync, 3, 2);
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(1)).ok());
  ASSERT_TRUE(f.shard->Push({1, 0, 1}, f.Grads(1)).ok());
  auto late = f.shard->Push({2, 0, 1}, f.Grads(1));
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->dropped);
  EXPECT_EQ(f.shard->stats().stale_gradients_dropped, 1);
  EXPECT_EQ(f.shard->version(), 1);
  // A duplicate from the same worker in one step is dropped too.
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.Grads(1)).ok());
  EXPECT_TRUE(f.shard->Push({0, 1, 2}, f.Grads(1))->dropped);
}

TEST(ShardTest, InvalidPushesLeaveStateUnchanged) {
  Fixture f(TrainingMode::kSync, 2, 2);
  auto before = f.Values();
  auto future = f.shard->Push({0, 5, 1}, f.Grads(1));
  EXPECT_EQ(future.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(future.status().message().find("future"), std::string::npos);
  auto nan = f.Grads(1);
  nan.back()[0] = std::nanf("");
  EXPECT_EQ(f.shard->Push({0, 0, 1}, nan).status().code(), absl::StatusCode::kInvalidArgument);
  auto short_grad = f.Grads(1);
  short_grad[0].pop_back();
  EXPECT_EQ(f.shard->Push({0, 0, 1}, short_grad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.shard->Push({7, 0, 1}, f.Grads(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.shard->stats().pushes_rejected, 4);
  // Nothing was accumulated: one valid push from each worker still makes exactly one step of 1.
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(1)).ok());
  ASSERT_TRUE(f.shard->Push({1, 0, 1}, f.Grads(1)).ok());
  auto after = f.Values();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 1.0f);
}

TEST(ShardAsyncTest, AppliesOnArrivalAndRecordsStaleness) {
  Fixture f(TrainingMode::kAsync, 2, 1);
  auto r = f.shard->Push({0, 0, 1}, f.Grads(1));
  EXPECT_EQ(r->version, 1);
  EXPECT_EQ(r->staleness, 0);
  r = f.shard->Push({1, 0, 1}, f.Grads(1));  // computed against version 0, applied at 1
  EXPECT_EQ(r->version, 2);
  EXPECT_EQ(r->staleness, 1);
}

TEST(ShardAsyncTest, BoundedStalenessHoldsFastWorkerUntilSlowOneCatchesUpOrLeaves) {
  Fixture f(TrainingMode::kAsync, 2, 1, /*tau=*/1);
  for (int c = 1; c <= 2; ++c)
    ASSERT_TRUE(f.shard->Push({0, f.shard->version(), c}, f.Grads(0)).ok());
  // Worker 0 has done 2 steps, worker 1 none: 2 - 0 > 1, so worker 0 waits.
  bool served = false;
  f.shard->Pull({0, 0, 2}, f.clock.Now() + absl::Seconds(10), [&](auto s) { served = s.ok(); });
  EXPECT_FALSE(served);
  ASSERT_TRUE(f.shard->Push({1, f.shard->version(), 1}, f.Grads(0)).ok());
  EXPECT_TRUE(served);
  // Leaving stops a worker from holding others back.
  served = false;
  ASSERT_TRUE(f.shard->Push({0, f.shard->version(), 3}, f.Grads(0)).ok());
  f.shard->Pull({0, 0, 3}, f.clock.Now() + absl::Seconds(10), [&](auto s) { served = s.ok(); });
  EXPECT_FALSE(served);
  ASSERT_TRUE(f.shard->Leave({TaskRole::kWorker, 1}).ok());
  EXPECT_TRUE(served);
}

TEST(ShardTest, PullDeadlineAndCancel) {
  Fixture f(TrainingMode::kSync, 2, 2);
  absl::StatusCode code = absl::StatusCode::kOk;
  f.shard->Pull({0, 1, 0}, f.clock.Now() + absl::Seconds(5),
                [&](auto s) { code = s.status().code(); });
  f.shard->Tick(f.clock.Now() + absl::Seconds(1));
  EXPECT_EQ(code, absl::StatusCode::kOk);  // not yet
  f.clock.Advance(absl::Seconds(6));
  f.shard->Tick(f.clock.Now());
  EXPECT_EQ(code, absl::StatusCode::kDeadlineExceeded);
  uint64_t t = f.shard->Pull({0, 1, 0}, f.clock.Now() + absl::Seconds(5),
                             [&](auto s) { code = s.status().code(); });
  f.shard->CancelPull(t);
  EXPECT_EQ(code, absl::StatusCode::kCancelled);
}

TEST(ShardTest, StopHoldingAnswersHeldPullsAndLaterHoldsButStillServes) {
  Fixture f(TrainingMode::kSync, 2, 2);
  const absl::Status why = absl::UnavailableError("ps:0 is stopping");
  absl::Status held_answer;
  int held_calls = 0;
  f.shard->Pull({0, 1, 0}, f.clock.Now() + absl::Seconds(30), [&](auto s) {
    held_answer = s.status();
    ++held_calls;
  });
  EXPECT_EQ(held_calls, 0);  // held at the barrier
  f.shard->StopHolding(why);
  EXPECT_EQ(held_calls, 1);
  EXPECT_EQ(held_answer, why);
  // A pull that would be held is answered at once with the same reason...
  absl::Status later;
  f.shard->Pull({1, 1, 0}, f.clock.Now() + absl::Seconds(30), [&](auto s) { later = s.status(); });
  EXPECT_EQ(later, why);
  // ...one that can be served is served, and nothing is answered twice.
  bool served = false;
  f.shard->Pull({1, 0, 0}, f.clock.Now() + absl::Seconds(30),
                [&](auto s) { served = s.ok() && s->version == 0; });
  EXPECT_TRUE(served);
  f.clock.Advance(absl::Seconds(60));
  f.shard->Tick(f.clock.Now());
  EXPECT_EQ(held_calls, 1);
}

TEST(ShardTest, DoneAtTargetReleasesEveryoneAndIgnoresLatePushes) {
  Fixture f(TrainingMode::kSync, 1, 1, {}, /*target=*/2);
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(1)).ok());
  bool done = false;
  f.shard->Pull({0, 5, 1}, f.clock.Now() + absl::Seconds(1),
                [&](auto s) { done = s.ok() && s->done; });
  EXPECT_FALSE(done);
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.Grads(1)).ok());
  EXPECT_TRUE(done);
  auto late = f.shard->Push({0, 2, 3}, f.Grads(1));
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->done);
  EXPECT_EQ(f.shard->version(), 2);
}

TEST(ShardFailureTest, BarrierTimeoutProceedsWithTheGradientsThatArrived) {
  Fixture f(TrainingMode::kSync, 3, 3, {}, 100, absl::Seconds(2));
  auto before = f.Values();
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(2)).ok());
  ASSERT_TRUE(f.shard->Push({1, 0, 1}, f.Grads(4)).ok());  // worker 2 is dead
  bool released = false;
  f.shard->Pull({0, 1, 1}, f.clock.Now() + absl::Seconds(60), [&](auto s) { released = s.ok(); });
  f.clock.Advance(absl::Seconds(1));
  f.shard->Tick(f.clock.Now());
  EXPECT_FALSE(released);
  EXPECT_EQ(f.shard->version(), 0);
  f.clock.Advance(absl::Seconds(1));
  f.shard->Tick(f.clock.Now());
  EXPECT_TRUE(released);
  EXPECT_EQ(f.shard->version(), 1);
  EXPECT_EQ(f.shard->stats().barrier_timeouts, 1);
  auto after = f.Values();
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_FLOAT_EQ(after[i], before[i] - 3.0f);  // mean of 2 and 4
  // No gradient, no step: an empty barrier never times out into an update.
  f.clock.Advance(absl::Seconds(10));
  f.shard->Tick(f.clock.Now());
  EXPECT_EQ(f.shard->version(), 1);
}

TEST(ShardFailureTest, AWorkerThatMissedABarrierIsNotWaitedForUntilItPushesAgain) {
  Fixture f(TrainingMode::kSync, 2, 2, {}, 100, absl::Seconds(2));
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(1)).ok());  // worker 1 is stopped
  f.clock.Advance(absl::Seconds(2));
  f.shard->Tick(f.clock.Now());
  EXPECT_EQ(f.shard->version(), 1);
  EXPECT_EQ(f.shard->stats().barrier_timeouts, 1);
  EXPECT_EQ(f.shard->stats().absent_workers, 1);
  // The next steps need worker 0 alone: no second timeout.
  for (int64_t v = 1; v <= 3; ++v) {
    auto r = f.shard->Push({0, v, v + 1}, f.Grads(1));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->version, v + 1);
    EXPECT_EQ(r->absent_workers, 1);
  }
  EXPECT_EQ(f.shard->stats().barrier_timeouts, 1);
  int absent_in_pull = -1;
  f.shard->Pull({0, 0, 0}, f.clock.Now() + absl::Seconds(1),
                [&](auto snap) { absent_in_pull = snap->absent_workers; });
  EXPECT_EQ(absent_in_pull, 1);
  // Worker 1 wakes up: its push (for version 0) is stale, but it is back ...
  auto stale = f.shard->Push({1, 0, 1}, f.Grads(1));
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->dropped);
  EXPECT_EQ(f.shard->stats().absent_workers, 0);
  // ... so the next step waits for it again.
  ASSERT_TRUE(f.shard->Push({0, 4, 5}, f.Grads(1)).ok());
  EXPECT_EQ(f.shard->version(), 4);
  ASSERT_TRUE(f.shard->Push({1, 4, 2}, f.Grads(1)).ok());
  EXPECT_EQ(f.shard->version(), 5);
  // With backup workers, absence lowers the need only below replicasToAggregate.
  Fixture b(TrainingMode::kSync, 4, 3, {}, 100, absl::Seconds(2));
  ASSERT_TRUE(b.shard->Push({0, 0, 1}, b.Grads(1)).ok());
  ASSERT_TRUE(b.shard->Push({1, 0, 1}, b.Grads(1)).ok());
  b.clock.Advance(absl::Seconds(2));
  b.shard->Tick(b.clock.Now());  // workers 2 and 3 absent: 2 present
  EXPECT_EQ(b.shard->stats().absent_workers, 2);
  ASSERT_TRUE(b.shard->Push({0, 1, 2}, b.Grads(1)).ok());
  EXPECT_EQ(b.shard->version(), 1);
  ASSERT_TRUE(b.shard->Push({1, 1, 2}, b.Grads(1)).ok());
  EXPECT_EQ(b.shard->version(), 2);
}

TEST(ShardFailureTest, SilentWorkerStopsHoldingBackBoundedStaleness) {
  Fixture f(TrainingMode::kAsync, 2, 1, /*tau=*/1, 100, absl::Seconds(5));
  for (int c = 1; c <= 3; ++c)
    ASSERT_TRUE(f.shard->Push({0, f.shard->version(), c}, f.Grads(0)).ok());
  bool served = false;
  f.shard->Pull({0, 0, 3}, f.clock.Now() + absl::Seconds(60), [&](auto s) { served = s.ok(); });
  EXPECT_FALSE(served);  // worker 1 (clock 0) holds worker 0 back
  f.clock.Advance(absl::Seconds(3));
  f.shard->Tick(f.clock.Now());
  EXPECT_FALSE(served);
  f.clock.Advance(absl::Seconds(3));  // worker 1 silent for 6 s > 5 s: presumed dead
  f.shard->Tick(f.clock.Now());
  EXPECT_TRUE(served);
}

TEST(ShardFailureTest, OtherIncarnationsAreServedAtOnceAndTheirPushesDropped) {
  Fixture f(TrainingMode::kSync, 1, 1, {}, 100, absl::ZeroDuration(), /*incarnation=*/7);
  ASSERT_TRUE(f.shard->Push({0, 0, 1, 7}, f.Grads(1)).ok());
  // A worker waiting for version 50 of a previous incarnation is answered at once.
  int64_t incarnation = 0, version = -1;
  f.shard->Pull({0, 50, 1, /*incarnation=*/3}, f.clock.Now() + absl::Seconds(5), [&](auto s) {
    incarnation = s->incarnation;
    version = s->version;
  });
  EXPECT_EQ(incarnation, 7);
  EXPECT_EQ(version, 1);
  auto stale = f.shard->Push({0, 1, 2, /*incarnation=*/3}, f.Grads(1));
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->dropped);
  EXPECT_EQ(f.shard->version(), 1);
}

// A job with a Chief replica and an evaluator: 2 sync workers.
Fixture ReadersFixture(TrainingMode mode = TrainingMode::kSync, std::optional<int64_t> tau = {}) {
  return Fixture(mode, 2, mode == TrainingMode::kSync ? 2 : 1, tau, 100, absl::ZeroDuration(), 1,
                 /*has_chief=*/true, /*evaluators=*/1);
}

TEST(ShardReadersTest, ChiefAndEvaluatorPullsWaitOnlyForTheirVersionAndJoinNoBarrier) {
  Fixture f = ReadersFixture();
  int64_t chief_saw = -1, evaluator_saw = -1;
  f.shard->Pull({0, 0, 0, 0, TaskRole::kChief}, f.clock.Now() + absl::Seconds(5),
                [&](auto s) { chief_saw = s.ok() ? s->version : -2; });
  EXPECT_EQ(chief_saw, 0);  // served at once
  f.shard->Pull({0, 1, 0, 0, TaskRole::kEvaluator}, f.clock.Now() + absl::Seconds(5),
                [&](auto s) { evaluator_saw = s.ok() ? s->version : -2; });
  EXPECT_EQ(evaluator_saw, -1);  // held for version 1
  // The step needs both workers: the readers did not count as replicas.
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(1)).ok());
  EXPECT_EQ(f.shard->version(), 0);
  EXPECT_EQ(evaluator_saw, -1);
  ASSERT_TRUE(f.shard->Push({1, 0, 1}, f.Grads(1)).ok());
  EXPECT_EQ(f.shard->version(), 1);
  EXPECT_EQ(evaluator_saw, 1);
}

TEST(ShardReadersTest, ReadersAreNotInTheStalenessBoundOrTheWorkerClocks) {
  Fixture f = ReadersFixture(TrainingMode::kAsync, /*tau=*/0);
  // A reader's pull with any clock is never held by the bound ...
  bool served = false;
  f.shard->Pull({0, 0, 1000, 0, TaskRole::kChief}, f.clock.Now() + absl::Seconds(5),
                [&](auto s) { served = s.ok(); });
  EXPECT_TRUE(served);
  // ... and does not hold anyone: worker 0 (clock 1) is held by worker 1 (clock 0) only.
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(0)).ok());
  served = false;
  f.shard->Pull({0, 0, 1}, f.clock.Now() + absl::Seconds(5), [&](auto s) { served = s.ok(); });
  EXPECT_FALSE(served);
  // A reader's handshake and Leave change no worker's clock or departure.
  EXPECT_TRUE(f.shard->Leave({TaskRole::kChief, 0}).ok());
  EXPECT_TRUE(f.shard->Leave({TaskRole::kEvaluator, 0}).ok());
  EXPECT_FALSE(served);
  EXPECT_FALSE(f.shard->all_workers_left());
  EXPECT_TRUE(f.shard->all_evaluators_left());
  ASSERT_TRUE(f.shard->Leave({TaskRole::kWorker, 1}).ok());
  EXPECT_TRUE(served);
}

TEST(ShardReadersTest, OnlyTheChiefTaskMayEndTheJob) {
  // With a Chief replica: the chief, not worker 0.
  Fixture with_chief = ReadersFixture();
  auto denied = with_chief.shard->RequestShutdown({TaskRole::kWorker, 0});
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("only the chief (chief:0)"), std::string::npos) << denied;
  EXPECT_FALSE(with_chief.shard->shutdown_requested());
  EXPECT_EQ(with_chief.shard->RequestShutdown({TaskRole::kEvaluator, 0}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(with_chief.shard->RequestShutdown({TaskRole::kChief, 0}).ok());
  EXPECT_TRUE(with_chief.shard->shutdown_requested());
  // Without one: worker 0.
  Fixture plain(TrainingMode::kSync, 2, 2);
  EXPECT_EQ(plain.shard->RequestShutdown({TaskRole::kChief, 0}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(plain.shard->RequestShutdown({TaskRole::kWorker, 1}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(plain.shard->shutdown_requested());
  EXPECT_TRUE(plain.shard->RequestShutdown({TaskRole::kWorker, 0}).ok());
}

TEST(ShardReadersTest, TasksTheJobDoesNotHaveAreRefused) {
  Fixture plain(TrainingMode::kSync, 2, 2);
  absl::Status status;
  plain.shard->Pull({0, 0, 0, 0, TaskRole::kChief}, plain.clock.Now() + absl::Seconds(1),
                    [&](auto s) { status = s.status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("no Chief replica"), std::string::npos) << status;
  EXPECT_EQ(plain.shard->Leave({TaskRole::kEvaluator, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  Fixture f = ReadersFixture();
  EXPECT_EQ(f.shard->Leave({TaskRole::kEvaluator, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.shard->Leave({TaskRole::kChief, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(plain.shard->all_evaluators_left());  // a job without evaluators waits for none
}

TEST(ShardCheckpointTest, CheckpointRestoresValuesOptimizerStateVersionAndClocks) {
  Fixture a(TrainingMode::kAsync, 2, 1);
  ASSERT_TRUE(a.shard->Push({0, 0, 1}, a.Grads(1)).ok());
  ASSERT_TRUE(a.shard->Push({1, 1, 4}, a.Grads(2)).ok());
  ShardCheckpoint c = a.shard->Checkpoint();
  EXPECT_EQ(c.version, 2);
  Fixture b(TrainingMode::kAsync, 2, 1);
  ASSERT_TRUE(b.shard->Restore(c).ok());
  EXPECT_EQ(b.shard->version(), 2);
  EXPECT_EQ(b.Values(), a.Values());
  EXPECT_EQ(b.shard->WorkerClock(1), 4);
  EXPECT_EQ(b.shard->stats().restored_version, 2);
  // A checkpoint of a different layout is refused and changes nothing.
  ShardCheckpoint bad = c;
  bad.values[0].pop_back();
  Fixture d(TrainingMode::kAsync, 2, 1);
  auto fresh = d.Values();
  EXPECT_FALSE(d.shard->Restore(bad).ok());
  EXPECT_EQ(d.Values(), fresh);
  EXPECT_EQ(d.shard->version(), 0);
}

TEST(ShardCheckpointTest, SnapshotsExactlyAtEveryNSteps) {
  FakeClock clock;
  ModelSpec spec;
  spec.type = "softmax";
  spec.input_dim = 2;
  spec.num_classes = 2;
  Model model = *Model::Create(spec);
  Placement placement = PlaceVariables(model.variables(), 1, 1 << 20);
  ShardOptions o;
  o.mode = TrainingMode::kAsync;
  o.target_steps = 100;
  o.checkpoint_every_steps = 3;
  OptimizerSpec opt;
  opt.type = "sgd";
  auto shard = *Shard::Create(o, model, placement, opt, &clock, ShardMetrics{});
  std::vector<std::vector<float>> g;
  for (const auto& p : shard->parts()) g.emplace_back(p.num_elements(), 1.0f);
  std::vector<int64_t> taken;
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(shard->Push({0, shard->version(), i + 1}, g).ok());
    if (auto c = shard->TakePendingCheckpoint()) taken.push_back(c->fields().version);
  }
  EXPECT_EQ(taken, (std::vector<int64_t>{3, 6}));
}

// Values and optimizer slots, bit for bit.
std::string StateBytes(Shard& shard) {
  ShardCheckpoint c = shard.Checkpoint();
  std::string out;
  auto add = [&](const std::vector<float>& v) {
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  for (const auto& v : c.values) add(v);
  for (const auto& slots : c.slots) {
    for (const auto& v : slots) add(v);
  }
  return out;
}

bool AllFinite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

TEST(ShardNumericsTest, SyncMeanOfTwoHugeFiniteGradientsDoesNotOverflow) {
  Fixture f(TrainingMode::kSync, 2, 2);
  const auto before = f.Values();
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(3e38f)).ok());
  auto r = f.shard->Push({1, 0, 1}, f.Grads(3e38f));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->dropped);
  EXPECT_EQ(r->version, 1);
  // The float32 sum is +Inf; the mean is 3e38, so each value moved by exactly that.
  const auto after = f.Values();
  ASSERT_TRUE(AllFinite(after));
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], before[i] - 3e38f) << i;
  EXPECT_EQ(f.shard->stats().nonfinite_updates, 0);
  EXPECT_EQ(f.shard->stats().gradients_applied, 2);
}

// The sync mean over parts larger than the PS's summing block, 1 to 4
// workers: exactly (float)((double sum in worker order) / n) per element,
// and one gradient is its own mean.
TEST(ShardNumericsTest, SyncMeanIsTheDoubleSumInWorkerOrderBitForBit) {
  for (int workers = 1; workers <= 4; ++workers) {
    Fixture f(TrainingMode::kSync, workers, workers);
    ModelSpec spec;
    spec.type = "softmax";
    spec.input_dim = 3001;  // a 6002-element weight part: three summing blocks, the last partial
    spec.num_classes = 2;
    f.model = std::make_unique<Model>(*Model::Create(spec));
    f.placement = PlaceVariables(f.model->variables(), 1, 1 << 20);
    ShardOptions o = f.shard->options();
    OptimizerSpec sgd;
    sgd.type = "sgd";
    sgd.learning_rate = 1.0;
    f.shard = *Shard::Create(o, *f.model, f.placement, sgd, &f.clock, ShardMetrics{});
    const std::vector<float> before = f.Values();
    std::mt19937 rng(workers);
    std::normal_distribution<float> normal(0, 1);
    std::vector<std::vector<std::vector<float>>> grads(workers);
    for (int w = 0; w < workers; ++w) {
      grads[w] = f.Grads(0);
      for (auto& part : grads[w]) {
        for (float& x : part)
          x = normal(rng) * std::pow(10.0f, static_cast<float>(rng() % 60) - 30);
      }
    }
    for (int w = workers - 1; w >= 0; --w) {  // arrival order must not matter
      ASSERT_TRUE(f.shard->Push({w, 0, 1}, grads[w]).ok());
    }
    const std::vector<float> after = f.Values();
    size_t k = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      for (size_t e = 0; e < grads[0][i].size(); ++e, ++k) {
        double sum = 0;
        for (int w = 0; w < workers; ++w) sum += grads[w][i][e];
        const float want = before[k] - static_cast<float>(sum / workers);
        ASSERT_EQ(std::memcmp(&after[k], &want, sizeof(float)), 0)
            << workers << " workers, part " << i << " element " << e;
      }
    }
    ASSERT_EQ(k, after.size());
  }
}

TEST(ShardNumericsTest, SyncUpdateThatWouldOverflowIsRefusedAsAWholeAndTheStepSkipped) {
  Fixture f(TrainingMode::kSync, 2, 2);
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(3e38f)).ok());
  ASSERT_TRUE(f.shard->Push({1, 0, 1}, f.Grads(3e38f)).ok());
  const std::string state = StateBytes(*f.shard);
  // Values are about -3e38: another step of 3e38 would make them -Inf.
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.Grads(3e38f)).ok());
  auto r = f.shard->Push({1, 1, 2}, f.Grads(3e38f));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->dropped);
  EXPECT_EQ(r->version, 2);  // skipped, so the workers at the barrier go on
  EXPECT_EQ(StateBytes(*f.shard), state);
  EXPECT_EQ(f.shard->stats().nonfinite_updates, 1);
  EXPECT_EQ(f.shard->stats().gradients_applied, 2);
  // Training goes on from the unchanged values.
  ASSERT_TRUE(f.shard->Push({0, 2, 3}, f.Grads(-1e38f)).ok());
  ASSERT_TRUE(f.shard->Push({1, 2, 3}, f.Grads(-1e38f)).ok());
  EXPECT_NE(StateBytes(*f.shard), state);
  EXPECT_TRUE(AllFinite(f.Values()));
}

TEST(ShardNumericsTest, AsyncUpdateThatWouldOverflowIsDroppedAndChangesNothing) {
  Fixture f(TrainingMode::kAsync, 2, 1);
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.Grads(3e38f)).ok());
  const std::string state = StateBytes(*f.shard);
  auto r = f.shard->Push({1, 1, 1}, f.Grads(3e38f));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->dropped);
  EXPECT_EQ(r->version, 1);
  EXPECT_EQ(f.shard->version(), 1);
  EXPECT_EQ(StateBytes(*f.shard), state);
  EXPECT_EQ(f.shard->stats().nonfinite_updates, 1);
  EXPECT_EQ(f.shard->stats().gradients_applied, 1);
}

// For every optimizer, in both modes: a huge finite gradient is pushed until
// its update overflows (SGD and momentum: the values or the accumulator pass
// FLT_MAX; Adam and Adagrad: the squared gradient does); that update changes
// neither the values nor the slots, and training then goes on.
TEST(ShardNumericsTest, EveryOptimizerRefusesNonFiniteUpdatesAndKeepsItsState) {
  for (const char* type : {"sgd", "momentum", "adam", "adagrad"}) {
    for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
      SCOPED_TRACE(absl::StrCat(type, " ", TrainingModeName(mode)));
      OptimizerSpec opt;
      opt.type = type;
      opt.learning_rate = 1.0;
      opt.momentum = 0.9;
      Fixture f(mode, 2, opt);
      auto step = [&](float g) {
        const int64_t v = f.shard->version();
        Shard::PushResult last;
        for (int w = 0; w < 2; ++w) {
          auto r = f.shard->Push({w, v, v + 1}, f.Grads(g));
          EXPECT_TRUE(r.ok()) << r.status();
          if (r.ok()) last = *r;
          if (mode == TrainingMode::kAsync) break;
        }
        return last;
      };
      step(0.5f);
      int refused_at = -1;
      std::string before;
      for (int i = 0; i < 4 && refused_at < 0; ++i) {
        before = StateBytes(*f.shard);
        if (step(3e38f).dropped) refused_at = i;
      }
      ASSERT_GE(refused_at, 0) << "no update overflowed";
      EXPECT_EQ(StateBytes(*f.shard), before);
      EXPECT_EQ(f.shard->stats().nonfinite_updates, 1);
      // Back towards zero (momentum still carries about 3e38; Adam's and
      // Adagrad's huge gradients never got in).
      const bool first_order = std::string(type) == "sgd" || std::string(type) == "momentum";
      EXPECT_FALSE(step(first_order ? -3e38f : 0.5f).dropped);
      EXPECT_NE(StateBytes(*f.shard), before);
      EXPECT_TRUE(AllFinite(f.Values()));
    }
  }
}

TEST(ShardNumericsTest, SyncMeanDoesNotDependOnArrivalOrder) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-20, 20);
  Fixture a(TrainingMode::kSync, 4, 4), b(TrainingMode::kSync, 4, 4);
  std::vector<std::vector<std::vector<float>>> grads;
  for (int w = 0; w < 4; ++w) {
    auto g = a.Grads(0);
    for (auto& part : g) {
      for (float& x : part) x = std::ldexp(mantissa(rng), exponent(rng));
    }
    grads.push_back(g);
  }
  for (int w : {0, 1, 2, 3}) ASSERT_TRUE(a.shard->Push({w, 0, 1}, grads[w]).ok());
  for (int w : {3, 1, 0, 2}) ASSERT_TRUE(b.shard->Push({w, 0, 1}, grads[w]).ok());
  EXPECT_EQ(a.shard->version(), 1);
  EXPECT_EQ(StateBytes(*a.shard), StateBytes(*b.shard));
}

TEST(ShardTest, APushIdIsAppliedAtMostOncePerWorker) {
  Fixture f(TrainingMode::kAsync, 2, 1);
  Shard::PushHeader h{0, 0, 1, 0, /*push_id=*/9};
  ASSERT_TRUE(f.shard->Push(h, f.Grads(1)).ok());
  const auto once = f.Values();
  auto again = f.shard->Push(h, f.Grads(1));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->dropped);
  EXPECT_EQ(again->version, 1);
  EXPECT_EQ(f.Values(), once);
  EXPECT_EQ(f.shard->stats().duplicate_pushes, 1);
  // Ids are per worker, and a refused push records nothing.
  ASSERT_TRUE(f.shard->Push({1, 1, 1, 0, 9}, f.Grads(1)).ok());
  EXPECT_EQ(f.shard->version(), 2);
  auto bad = f.Grads(1);
  bad[0][0] = std::nanf("");
  EXPECT_FALSE(f.shard->Push({0, 2, 2, 0, 10}, bad).ok());
  ASSERT_TRUE(f.shard->Push({0, 2, 2, 0, 10}, f.Grads(1)).ok());
  EXPECT_EQ(f.shard->version(), 3);
  // Sync: a retry of a gradient waiting in the step is not a second one.
  Fixture s(TrainingMode::kSync, 2, 2);
  ASSERT_TRUE(s.shard->Push({0, 0, 1, 0, 5}, s.Grads(1)).ok());
  auto retry = s.shard->Push({0, 0, 1, 0, 5}, s.Grads(1));
  ASSERT_TRUE(retry.ok());
  EXPECT_FALSE(retry->dropped);
  EXPECT_EQ(s.shard->stats().stale_gradients_dropped, 0);
  ASSERT_TRUE(s.shard->Push({1, 0, 1, 0, 6}, s.Grads(3)).ok());
  EXPECT_EQ(s.shard->version(), 1);
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

// A model with one embedding table "embedding.c" [10 x 16] (and a small
// dense tower), placed over 2 PS tasks: shard 0 holds rows 0, 2, 4, 6, 8.

TEST(ShardTableTest, HoldsTheRowsOfItsShardByIdModShards) {
  TableFixture f("sgd");
  ASSERT_EQ(f.shard->tables().size(), 1u);
  EXPECT_EQ(f.shard->tables()[0].name, "embedding.c");
  const std::vector<float> init = f.model->InitialValue(f.model->tables()[0], 1);
  std::vector<float> rows = f.Rows({8, 2});
  ASSERT_EQ(rows.size(), 32u);
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(rows[k], init[8 * 16 + k]);
    EXPECT_EQ(rows[16 + k], init[2 * 16 + k]);
  }
  // 5 of the 10 rows, 16 floats each, no slots under sgd.
  EXPECT_EQ(f.shard->TableBytes(), std::vector<int64_t>{5 * 16 * 4});
  TableFixture adam("adam");  // 2 slots (first and second moments)
  EXPECT_EQ(adam.shard->TableBytes(), std::vector<int64_t>{5 * 16 * 4 * 3});
}

// Sync: per-worker sparse gradients (overlapping ids, a duplicate id within
// one push, arrival in either order) aggregate to exactly what the dense
// computation gives: the mean over workers of full-size gradients (zeros
// where a worker did not touch), summed in double in worker order, then the
// dense optimizer over the whole table.
TEST(ShardTableTest, SyncSparseAggregationEqualsTheDenseComputationBitForBit) {
  for (const char* type : {"sgd", "adagrad"}) {
    for (bool reversed : {false, true}) {
      TableFixture f(type, 3);
      const int64_t dim = 16;
      std::vector<float> dense = f.model->InitialValue(f.model->tables()[0], 1);
      auto full = CreateOptimizer(f.opt, {10 * dim});
      ASSERT_TRUE(full.ok());
      std::mt19937_64 rng(7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const std::vector<std::vector<std::vector<int64_t>>> touched = {
          {{2, 4, 2}, {4}, {8, 0}}, {{6}, {6, 2}, {}}, {{0}, {0}, {0}}};
      for (int64_t step = 1; step <= 3; ++step) {
        std::vector<Shard::SparseGrad> pushes(3);
        std::vector<std::vector<double>> sum_by_worker;
        std::vector<double> sum(10 * dim, 0.0);
        for (int w = 0; w < 3; ++w) {
          pushes[w].table = 0;
          pushes[w].ids = touched[step - 1][w];
          for (int64_t id : pushes[w].ids) {
            for (int64_t k = 0; k < dim; ++k) {
              const float g = normal(rng);
              pushes[w].rows.push_back(g);
              sum[id * dim + k] += g;
            }
          }
        }
        std::vector<float> mean(10 * dim);
        for (size_t e = 0; e < mean.size(); ++e) mean[e] = static_cast<float>(sum[e] / 3.0);
        ASSERT_TRUE((*full)->Apply(0, dense.data(), mean.data(), 10 * dim, step));
        for (int i = 0; i < 3; ++i) {
          const int w = reversed ? 2 - i : i;
          auto r = f.shard->Push({w, step - 1, step}, f.DenseGrads(), {pushes[w]});
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_FALSE(r->dropped);
        }
        EXPECT_EQ(f.shard->version(), step);
      }
      std::vector<float> rows = f.Rows(kLocalIds);
      for (size_t i = 0; i < kLocalIds.size(); ++i) {
        for (int64_t k = 0; k < dim; ++k) {
          EXPECT_EQ(rows[i * dim + k], dense[kLocalIds[i] * dim + k])
              << type << " id " << kLocalIds[i] << (reversed ? " reversed" : "");
        }
      }
    }
  }
}

// Bounded staleness (async, tau = 1) with an embedding table: the same
// schedule pushed with gradient rows and without them (dense only) holds the
// same pulls, reports the same staleness per push and in the stats, and the
// rows applied on arrival equal the dense computation over the whole table
// (duplicate ids summed, zeros elsewhere) in arrival order, bit for bit.
// Staleness never drops an async push (tau holds the fast worker's pulls),
// for rows as for dense parts.
TEST(ShardTableTest, BoundedStalenessWithRowsMatchesTheDenseCase) {
  for (const char* type : {"sgd", "adagrad"}) {
    TableFixture sparse(type, 2, TrainingMode::kAsync), dense(type, 2, TrainingMode::kAsync);
    for (TableFixture* f : {&sparse, &dense}) {
      f->options.max_staleness = 1;
      f->shard = f->Make();
    }
    const int64_t dim = 16;
    std::vector<float> expected = sparse.model->InitialValue(sparse.model->tables()[0], 1);
    auto full = CreateOptimizer(sparse.opt, {10 * dim});
    ASSERT_TRUE(full.ok());
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int64_t applied = 0;
    // Pushes `ids` from `worker` (its clock, the version it pulled) to both
    // shards; checks both answer alike and returns the staleness reported.
    auto push = [&](int worker, int64_t pulled, int64_t clock, std::vector<int64_t> ids) {
      Shard::SparseGrad g{0, ids, {}};
      std::vector<float> grad(10 * dim, 0.0f);
      for (int64_t id : ids) {
        for (int64_t k = 0; k < dim; ++k) {
          g.rows.push_back(normal(rng));
          grad[id * dim + k] += g.rows.back();
        }
      }
      auto rs = sparse.shard->Push({worker, pulled, clock}, sparse.DenseGrads(), {g});
      auto rd = dense.shard->Push({worker, pulled, clock}, dense.DenseGrads());
      EXPECT_TRUE(rs.ok() && rd.ok()) << rs.status() << " " << rd.status();
      if (!rs.ok() || !rd.ok()) return int64_t{-1};
      EXPECT_FALSE(rs->dropped) << type;
      EXPECT_EQ(rs->dropped, rd->dropped);
      EXPECT_EQ(rs->version, rd->version);
      EXPECT_EQ(rs->staleness, rd->staleness) << type << " worker " << worker;
      EXPECT_TRUE((*full)->Apply(0, expected.data(), grad.data(), 10 * dim, ++applied));
      return rs->staleness;
    };
    // Whether a pull of `worker` at `clock` is served now, on each shard.
    struct Held {
      bool sparse = false, dense = false;
    };
    auto pull = [&](int worker, int64_t clock, Held* served) {
      sparse.shard->Pull({worker, 0, clock}, sparse.clock.Now() + absl::Seconds(10),
                         [served](auto s) { served->sparse = s.ok(); });
      dense.shard->Pull({worker, 0, clock}, dense.clock.Now() + absl::Seconds(10),
                        [served](auto s) { served->dense = s.ok(); });
    };

    EXPECT_EQ(push(0, 0, 1, {2, 4, 2}), 0);
    EXPECT_EQ(push(0, 1, 2, {8}), 0);
    // Worker 0 is 2 steps ahead of worker 1 (none): its pull waits on both.
    Held first;
    pull(0, 2, &first);
    EXPECT_FALSE(first.sparse);
    EXPECT_FALSE(first.dense);
    // Worker 1's first push, computed against version 0, lands at version 2:
    // applied (not dropped), staleness 2, and it frees worker 0's pull.
    EXPECT_EQ(push(1, 0, 1, {0, 2}), 2);
    EXPECT_TRUE(first.sparse);
    EXPECT_TRUE(first.dense);
    EXPECT_EQ(push(0, 2, 3, {6, 6}), 1);
    Held second;
    pull(0, 3, &second);
    EXPECT_FALSE(second.sparse);
    EXPECT_FALSE(second.dense);
    // A worker that leaves stops holding the others, for both.
    ASSERT_TRUE(sparse.shard->Leave({TaskRole::kWorker, 1}).ok());
    ASSERT_TRUE(dense.shard->Leave({TaskRole::kWorker, 1}).ok());
    EXPECT_TRUE(second.sparse);
    EXPECT_TRUE(second.dense);

    const ShardStatsSnapshot ss = sparse.shard->stats(), ds = dense.shard->stats();
    EXPECT_EQ(ss.version, 4);
    EXPECT_EQ(ss.version, ds.version);
    EXPECT_EQ(ss.gradients_applied, ds.gradients_applied);
    EXPECT_EQ(ss.stale_gradients_dropped, 0);
    EXPECT_EQ(ds.stale_gradients_dropped, 0);
    EXPECT_EQ(ss.staleness_sum, 3);
    EXPECT_EQ(ss.staleness_sum, ds.staleness_sum);
    EXPECT_EQ(ss.staleness_max, 2);
    EXPECT_EQ(ss.staleness_max, ds.staleness_max);
    std::vector<float> rows = sparse.Rows(kLocalIds);
    for (size_t i = 0; i < kLocalIds.size(); ++i) {
      for (int64_t k = 0; k < dim; ++k) {
        EXPECT_EQ(rows[i * dim + k], expected[kLocalIds[i] * dim + k])
            << type << " id " << kLocalIds[i];
      }
    }
    // The dense-only shard's rows never moved.
    const std::vector<float> init = dense.model->InitialValue(dense.model->tables()[0], 1);
    std::vector<float> untouched = dense.Rows(kLocalIds);
    for (size_t i = 0; i < kLocalIds.size(); ++i) {
      for (int64_t k = 0; k < dim; ++k) {
        EXPECT_EQ(untouched[i * dim + k], init[kLocalIds[i] * dim + k]);
      }
    }
  }
}

TEST(ShardTableTest, LazyAdamTouchesOnlyPushedRowsAsync) {
  TableFixture f("adam", 1, TrainingMode::kAsync);
  const std::vector<float> before = f.Rows(kLocalIds);
  Shard::SparseGrad g{0, {4}, std::vector<float>(16, 1.0f)};
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {g}).ok());
  g.ids = {2};
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.DenseGrads(), {g}).ok());
  const std::vector<float> after = f.Rows(kLocalIds);
  for (size_t i = 0; i < kLocalIds.size(); ++i) {
    for (int k = 0; k < 16; ++k) {
      const float b = before[i * 16 + k], a = after[i * 16 + k];
      if (kLocalIds[i] == 4) {
        EXPECT_NEAR(a, b - 0.1f, 1e-5);  // Adam's first step: lr x sign
      } else if (kLocalIds[i] == 2) {
        // First touched at the shard's step 2: bias correction of step 2
        // (TF's LazyAdam), m = 0.1, v = 0.001.
        const double alpha = 0.1 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
        EXPECT_NEAR(a, b - alpha * 0.1 / (std::sqrt(0.001) + 1e-7), 1e-5);
      } else {
        EXPECT_EQ(a, b) << kLocalIds[i];
      }
    }
  }
  EXPECT_EQ(f.shard->version(), 2);
}

TEST(ShardTableTest, BadIdsWidthsAndValuesAreRefusedAndChangeNothing) {
  TableFixture f("sgd", 1, TrainingMode::kAsync);
  const std::vector<float> before = f.Rows(kLocalIds);
  auto code = [&](Shard::SparseGrad g) {
    auto r = f.shard->Push({0, 0, 1}, f.DenseGrads(), {g});
    return r.status();
  };
  absl::Status s = code({0, {3}, std::vector<float>(16, 1.0f)});  // row 3 lives on ps:1
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lives on ps:1"), absl::string_view::npos) << s;
  s = code({0, {12}, std::vector<float>(16, 1.0f)});
  EXPECT_NE(s.message().find("out of range"), absl::string_view::npos) << s;
  s = code({0, {2}, std::vector<float>(15, 1.0f)});
  EXPECT_NE(s.message().find("expected 16"), absl::string_view::npos) << s;
  std::vector<float> nan(16, 1.0f);
  nan[3] = std::nanf("");
  s = code({0, {2}, nan});
  EXPECT_NE(s.message().find("non-finite"), absl::string_view::npos) << s;
  s = code({5, {2}, std::vector<float>(16, 1.0f)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.shard->version(), 0);
  EXPECT_EQ(f.shard->stats().pushes_rejected, 5);
  EXPECT_EQ(f.Rows(kLocalIds), before);
  auto pull = f.shard->PullRows({TaskRole::kWorker, 0}, {{0, {1}}});
  EXPECT_EQ(pull.status().code(), absl::StatusCode::kInvalidArgument);
  pull = f.shard->PullRows({TaskRole::kWorker, 0}, {{1, {0}}});
  EXPECT_EQ(pull.status().code(), absl::StatusCode::kInvalidArgument);
  pull = f.shard->PullRows({TaskRole::kWorker, 7}, {{0, {0}}});
  EXPECT_EQ(pull.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardTableTest, CheckpointRestoresTableRowsAndSlots) {
  TableFixture f("adagrad", 1, TrainingMode::kAsync);
  Shard::SparseGrad g{0, {6, 0}, std::vector<float>(32, 0.5f)};
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {g}).ok());
  ShardCheckpoint c = f.shard->Checkpoint();
  EXPECT_EQ(c.part_names.back(), "embedding.c@rows");
  std::unique_ptr<Shard> restarted = f.Make();
  EXPECT_NE(f.Rows(kLocalIds, restarted.get()), f.Rows(kLocalIds));
  ASSERT_TRUE(restarted->Restore(c).ok());
  EXPECT_EQ(f.Rows(kLocalIds, restarted.get()), f.Rows(kLocalIds));
  EXPECT_EQ(restarted->version(), 1);
  // The same push on both gives the same rows: the accumulators came back too.
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.DenseGrads(), {g}).ok());
  ASSERT_TRUE(restarted->Push({0, 1, 2}, f.DenseGrads(), {g}).ok());
  EXPECT_EQ(f.Rows(kLocalIds, restarted.get()), f.Rows(kLocalIds));
  // A checkpoint whose table rows do not match is refused.
  c.values.back().pop_back();
  EXPECT_EQ(restarted->Restore(c).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShardDynamicTableTest, RowsAreCreatedOnFirstTouchDeterministicallyAcrossRestarts) {
  DynamicFixture f("sgd", 0);
  // A reader (the chief) sees the initial value and creates nothing.
  EXPECT_EQ(f.Read({kBigId}), f.Init(kBigId));
  EXPECT_EQ(f.shard->TableRowCounts()[0].rows, 0);
  std::vector<float> first = f.Rows({kBigId, 1000000000002, 2});
  EXPECT_EQ(f.shard->TableRowCounts()[0].rows, 3);
  EXPECT_EQ(f.shard->TableRowCounts()[0].created, 3);
  EXPECT_EQ(std::vector<float>(first.begin(), first.begin() + 16), f.Init(kBigId));
  // A re-created shard (a PS restart without a checkpoint) recreates them identically.
  std::unique_ptr<Shard> again = f.Make();
  EXPECT_EQ(f.Rows({kBigId, 1000000000002, 2}, again.get()), first);
  // Ownership is id mod shards over unsigned ids.
  auto other = f.shard->PullRows({TaskRole::kWorker, 0}, {{0, {-3}}});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("lives on ps:1"), absl::string_view::npos)
      << other.status();
  // Bytes: the DynamicTable's.
  EXPECT_GE(f.shard->TableBytes()[0], 3 * 16 * 4);
}

TEST(ShardDynamicTableTest, MaxRowsEvictsTheLeastRecentlyUsedAndAPushRecreates) {
  DynamicFixture f("sgd", 6);  // 3 rows on each of the 2 shards
  f.Rows({2, 4, 6});
  f.Rows({2});
  f.Rows({8});  // evicts 4
  Shard::TableCounts n = f.shard->TableRowCounts()[0];
  EXPECT_EQ(n.rows, 3);
  EXPECT_EQ(n.created, 4);
  EXPECT_EQ(n.evicted, 1);
  // A gradient for an evicted row applies to its initial value (recreated).
  Shard::SparseGrad g{0, {4}, std::vector<float>(16, 1.0f)};
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {g}).ok());
  std::vector<float> want = f.Init(4);
  for (float& v : want) v -= 0.1f;
  EXPECT_EQ(f.Read({4}), want);
  n = f.shard->TableRowCounts()[0];
  EXPECT_EQ(n.evicted, 2);  // 6 (least recent now) made room
  EXPECT_EQ(n.created, 5);
  EXPECT_EQ(f.Read({6}), f.Init(6));
}

TEST(ShardDynamicTableTest, CheckpointHoldsOnlyExistingRowsAndRestoresThroughAFile) {
  DynamicFixture f("adagrad", 100);
  Shard::SparseGrad g{0, {kBigId, 10}, std::vector<float>(32, 0.5f)};
  f.Rows({kBigId, 10, 12});
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {g}).ok());
  ShardCheckpoint c = f.shard->Checkpoint();
  ASSERT_GE(c.part_names.size(), 2u);
  EXPECT_EQ(c.part_names[c.part_names.size() - 2], "embedding.c@ids");
  EXPECT_EQ(c.part_names.back(), "embedding.c@rows");
  EXPECT_EQ(c.values.back().size(), 3u * 16);  // three rows exist, nothing else is written
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/dynamic_ckpt";
  ASSERT_TRUE(WriteShardCheckpoint(dir, c).ok());
  auto read = RestoreShardCheckpoint(dir, 0, c.model_fingerprint, c.optimizer_type, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  std::unique_ptr<Shard> restarted = f.Make();
  ASSERT_TRUE(restarted->Restore(*read).ok());
  EXPECT_EQ(restarted->TableRowCounts()[0].rows, 3);
  const std::vector<int64_t> ids = {kBigId, 10, 12};
  EXPECT_EQ(f.Read(ids, restarted.get()), f.Read(ids));
  EXPECT_NE(f.Read({kBigId}), f.Init(kBigId));  // trained
  // The same push on both gives the same rows: the accumulators came back too.
  ASSERT_TRUE(f.shard->Push({0, 1, 2}, f.DenseGrads(), {g}).ok());
  ASSERT_TRUE(restarted->Push({0, 1, 2}, f.DenseGrads(), {g}).ok());
  EXPECT_EQ(f.Read(ids, restarted.get()), f.Read(ids));
  // Bad: an id of the other shard; rows that do not match the ids.
  ShardCheckpoint bad = c;
  EncodeTableId(3, bad.values[bad.values.size() - 2].data());
  EXPECT_EQ(restarted->Restore(bad).code(), absl::StatusCode::kFailedPrecondition);
  bad = c;
  bad.values.back().pop_back();
  EXPECT_EQ(restarted->Restore(bad).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(restarted->version(), 2);
}

// Every page of a listing (ListRows at one generation), in order.
std::vector<int64_t> ListAll(Shard* shard, int64_t page_rows, int64_t* pages = nullptr) {
  std::vector<int64_t> ids;
  int64_t cursor = 0, generation = -1;
  for (int n = 1;; ++n) {
    auto page = shard->ListRows({TaskRole::kChief, 0}, 0, cursor, page_rows);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return ids;
    EXPECT_LE(static_cast<int64_t>(page->ids.size()), page_rows);
    EXPECT_EQ(page->values.size(), page->ids.size() * 16);
    if (generation >= 0) {
      EXPECT_EQ(page->generation, generation);
    }
    generation = page->generation;
    ids.insert(ids.end(), page->ids.begin(), page->ids.end());
    if (page->done) {
      EXPECT_EQ(page->total_rows, static_cast<int64_t>(ids.size()));
      if (pages != nullptr) *pages = n;
      return ids;
    }
    cursor = page->next_cursor;
  }
}

TEST(ShardDynamicTableTest, ListRowsPagesEveryHeldRowOnceSkippingEvictedOnes) {
  DynamicFixture f("sgd", 6);  // 3 rows per shard
  f.Rows({2, 4, 6, 8, 10});    // one request may pass the bound
  f.Rows({12});                // evicts 2, 4 and 6: free slab rows, one reused
  EXPECT_EQ(f.shard->TableRowCounts()[0].rows, 3);
  int64_t pages = 0;
  std::vector<int64_t> ids = ListAll(f.shard.get(), 2, &pages);
  EXPECT_EQ(ids, (std::vector<int64_t>{8, 10, 12}));  // in id order
  EXPECT_GE(pages, 2);
  // The values are the rows' (here: their initial values).
  auto page = f.shard->ListRows({TaskRole::kChief, 0}, 0, 0, 10);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(
        std::vector<float>(page->values.begin() + i * 16, page->values.begin() + (i + 1) * 16),
        f.Init(page->ids[i]));
  }
  // Counts only; a new row changes the generation (a listing spanning it is void).
  auto counts = f.shard->ListRows({TaskRole::kChief, 0}, 0, 0, 0);
  ASSERT_TRUE(counts.ok());
  EXPECT_TRUE(counts->ids.empty());
  EXPECT_EQ(counts->total_rows, 3);
  f.Rows({14});
  auto later = f.shard->ListRows({TaskRole::kChief, 0}, 0, 0, 0);
  ASSERT_TRUE(later.ok());
  EXPECT_NE(later->generation, counts->generation);
  // A fixed table is pulled by id, not listed.
  TableFixture fixed("sgd");
  auto refused = fixed.shard->ListRows({TaskRole::kWorker, 0}, 0, 0, 10);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("is not dynamic"), absl::string_view::npos);
}

TEST(ShardDynamicTableTest, ReadOnlyPullsAndPullsAfterTheTargetCreateNothing) {
  DynamicFixture f("sgd", 0);
  f.Rows({2});
  // A worker that evaluates reads like the chief: initial values, nothing created.
  auto read = f.shard->PullRows({TaskRole::kWorker, 0}, {{0, {4, 2}}}, /*read_only=*/true);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::vector<float>(read->rows[0].begin(), read->rows[0].begin() + 16), f.Init(4));
  EXPECT_EQ(f.shard->TableRowCounts()[0].rows, 1);
  // Once training is done, a straggler's pull trains nothing and creates nothing.
  f.options.target_steps = 1;
  f.shard = f.Make();
  f.Rows({2});
  Shard::SparseGrad g{0, {2}, std::vector<float>(16, 1.0f)};
  ASSERT_TRUE(f.shard->Push({0, 0, 1}, f.DenseGrads(), {g}).ok());
  ASSERT_EQ(f.shard->version(), 1);
  f.Rows({6, 8});
  EXPECT_EQ(f.shard->TableRowCounts()[0].rows, 1);
  EXPECT_EQ(f.shard->stats().dynamic_rows, 1);
}

TEST(TableIdEncodingTest, RoundTripsEvery64BitValueExactlyInFloats) {
  for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{-1}, kBigId, INT64_MIN, INT64_MAX,
                     int64_t{0x123456789abcdef0}}) {
    float enc[kTableIdFloats];
    EncodeTableId(id, enc);
    for (float v : enc) EXPECT_LT(v, 4194304.0f);  // 2^22: exact in float32
    EXPECT_EQ(DecodeTableId(enc), id);
  }
}

}  // namespace
}  // namespace kubetrain
