// Whole jobs in one process: several in-process PS shards and several
// training loops (Train) on threads, on a fake clock, with faults injected
// through FaultyShardChannel. Sync (exact applied-gradient counts, one fused
// PushPull per step), backup
// workers, async (staleness recorded), bounded staleness (a slowed worker
// holds the fast one within maxStaleness + 1), a PS restart mid-job, and the
// chief of a job with a Chief replica following training without
// computing a gradient (Follow). Each runs plainly and with
// TrainerOptions::overlap_layers (the push overlapped with backprop).
#include "worker/trainer.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/model_file.h"
#include "worker/testing.h"

namespace kubetrain {
namespace {

using testjob::DynamicDataset;
using testjob::DynamicJobYaml;
using testjob::InProcessCluster;
using testjob::JobShape;
using testjob::JobYaml;
using testjob::TinyDataset;

// Every test runs twice: plainly and with TrainerOptions::overlap_layers.
class JobTest : public ::testing::TestWithParam<bool> {
 protected:
  void Make(const JobShape& shape) { MakeFromYaml(JobYaml(shape)); }
  void MakeFromYaml(const std::string& yaml) {
    auto config = TaskConfigFor(yaml, "worker", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = std::make_unique<TaskConfig>(std::move(*config));
    auto cluster = InProcessCluster::Create(*config_, &clock_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    for (int i = 0; i < config_->num_workers; ++i) {
      faulty_.emplace_back();
      clients_.push_back(NewClient(i, v1::TASK_TYPE_WORKER, &faulty_.back()));
    }
  }
  std::unique_ptr<PsClient> NewClient(int index, v1::TaskType type,
                                      std::vector<FaultyShardChannel*>* faulty = nullptr) {
    PsClient::Options o;
    o.task_type = type;
    o.task_index = index;
    o.fingerprint = config_->fingerprint;
    o.chunk_bytes = 4096;
    o.retry_timeout = absl::Seconds(30);
    return std::make_unique<PsClient>(o, &config_->placement, &clock_, cluster_->Channels(faulty),
                                      PsClientMetrics{});
  }
  // Runs Train for every worker on its own thread (worker 0 is the chief
  // unless the job has a Chief replica) and waits for all of them.
  std::vector<absl::StatusOr<TrainResult>> RunWorkers() {
    std::vector<absl::StatusOr<TrainResult>> results(clients_.size(),
                                                     absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < clients_.size(); ++i) {
      threads.emplace_back([this, i, &results] {
        TrainerOptions o;
        o.worker_index = static_cast<int>(i);
        o.is_chief = config_->job.IsChiefTask("worker", o.worker_index);
        o.progress_interval = absl::Hours(1);
        o.overlap_layers = GetParam();
        if (o.is_chief) o.export_model = export_model_;
        if (absl::Status s = clients_[i]->Connect(); !s.ok()) {
          results[i] = s;
          return;
        }
        results[i] =
            Train(*config_, o, clients_[i].get(), train_source_, o.is_chief ? &test_ : nullptr,
                  &clock_, TrainerMetrics{}, [](const Progress&) {});
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }
  ShardStatsSnapshot Stats(int ps) const { return cluster_->ps(ps)->shard()->stats(); }

  FakeClock clock_;
  Dataset train_ = TinyDataset(600, 1);
  DatasetSource train_source_{train_};
  Dataset test_ = TinyDataset(300, 2);
  std::unique_ptr<TaskConfig> config_;
  std::unique_ptr<InProcessCluster> cluster_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  std::vector<std::vector<FaultyShardChannel*>> faulty_;  // per worker, per PS
  std::string export_model_;                              // the chief's, if not empty
};

TEST_P(JobTest, SyncTwoPsThreeWorkersAppliesExactlyEveryGradientOfEveryStep) {
  Make({.ps = 2, .workers = 3, .steps = 30});
  auto results = RunWorkers();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_step, 30);
  }
  for (int ps = 0; ps < 2; ++ps) {
    EXPECT_EQ(Stats(ps).version, 30);
    EXPECT_EQ(Stats(ps).gradients_applied, 30 * 3);
    EXPECT_EQ(Stats(ps).stale_gradients_dropped, 0);
    EXPECT_TRUE(cluster_->ps(ps)->shard()->shutdown_requested());
    EXPECT_TRUE(cluster_->ps(ps)->shard()->all_workers_left());
  }
  // The chief's view: summed over both shards, and a model that learned.
  EXPECT_EQ(results[0]->ps_stats.gradients_applied(), 2 * 30 * 3);
  EXPECT_GT(results[0]->test_accuracy, 0.5);
  EXPECT_LT(results[1]->test_accuracy, 0);  // only the chief evaluates
  int local_steps = 0;
  for (const auto& r : results) local_steps += r->local_steps;
  EXPECT_EQ(local_steps, 30 * 3);
  // One round trip per step, each to every PS (a fused push and pull), after
  // one plain pull to start (and the chief's final pull of the model).
  for (int w = 0; w < 3; ++w) {
    for (int ps = 0; ps < 2; ++ps) {
      EXPECT_EQ(faulty_[w][ps]->calls(ShardRpc::kPushPull), results[w]->local_steps);
      EXPECT_EQ(faulty_[w][ps]->calls(ShardRpc::kPush), 0);
      EXPECT_EQ(faulty_[w][ps]->calls(ShardRpc::kPull), w == 0 ? 2 : 1);
    }
  }
}

TEST_P(JobTest, SyncBackupWorkersApplyExactlyReplicasToAggregatePerStep) {
  Make({.ps = 1, .workers = 3, .steps = 30, .training = "    replicasToAggregate: 2\n"});
  auto results = RunWorkers();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Stats(0).version, 30);
  EXPECT_EQ(Stats(0).gradients_applied, 30 * 2);
}

TEST_P(JobTest, AsyncAppliesEveryPushOnArrivalAndRecordsStaleness) {
  Make({.ps = 2, .workers = 2, .mode = "async", .steps = 40});
  // Both workers compute their first gradient on version 0: the second one
  // to arrive is one step stale.
  std::atomic<int> arrived{0};
  absl::Notification both_pulled;
  for (auto& channels : faulty_) {
    channels[0]->Before(ShardRpc::kPushPull, [&](int call) {
      if (call == 1) {
        if (++arrived == 2) both_pulled.Notify();
        both_pulled.WaitForNotification();
      }
      return absl::OkStatus();
    });
  }
  auto results = RunWorkers();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  for (int ps = 0; ps < 2; ++ps) {
    EXPECT_EQ(Stats(ps).version, 40);
    EXPECT_EQ(Stats(ps).gradients_applied, 40);  // every push until the target, none after
  }
  EXPECT_GE(Stats(0).staleness_max, 1);
  EXPECT_GE(results[0]->ps_stats.staleness_sum(), 1);
  EXPECT_EQ(results[0]->ps_stats.gradients_applied(), 2 * 40);
}

TEST_P(JobTest, BoundedStalenessHoldsTheFastWorkerWithinTauPlusOneOfTheSlowOne) {
  constexpr int kTau = 2;
  Make({.ps = 1, .workers = 2, .mode = "async", .steps = 40, .training = "    maxStaleness: 2\n"});
  // Worker 1 is the slow one: its first push waits until the test lets it go.
  absl::Notification release;
  std::atomic<int> slow_clock{0};  // the highest clock worker 1 started pushing
  std::atomic<int> worst_gap{0};
  faulty_[1][0]->Before(ShardRpc::kPushPull, [&](int call) {
    if (call == 1) release.WaitForNotification();
    slow_clock = call;  // one push per step, no retries: the call is its clock
    return absl::OkStatus();
  });
  faulty_[0][0]->Before(ShardRpc::kPushPull, [&](int call) {
    worst_gap = std::max(worst_gap.load(), call - slow_clock.load());
    return absl::OkStatus();
  });
  std::vector<absl::StatusOr<TrainResult>> results;
  std::thread job([&] { results = RunWorkers(); });
  // With worker 1 stuck at clock 0, worker 0 gets exactly tau + 1 steps
  // ahead and is then held by the PS.
  while (faulty_[0][0]->calls(ShardRpc::kPushPull) < kTau + 1 ||
         cluster_->ps(0)->held_pulls() == 0) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(faulty_[0][0]->calls(ShardRpc::kPushPull), kTau + 1);
  EXPECT_EQ(cluster_->ps(0)->held_pulls(), 1);
  release.Notify();
  job.join();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Stats(0).gradients_applied, 40);
  EXPECT_LE(worst_gap.load(), kTau + 1);
}

TEST_P(JobTest, APsRestartMidJobIsDetectedTheLostStepsCountedAndTheJobFinishes) {
  Make({.ps = 2, .workers = 2, .steps = 40});
  // Worker 0's 10th step on ps:1 (a fused push and pull) snapshots it; its
  // 25th restarts it from there.
  InProcessPs* ps1 = cluster_->ps(1);
  ShardCheckpoint snapshot;
  faulty_[0][1]->Before(ShardRpc::kPushPull, [&](int call) {
    if (call == 10) snapshot = ps1->shard()->Checkpoint();
    if (call == 25) return ps1->Restart(snapshot);
    return absl::OkStatus();
  });
  auto results = RunWorkers();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_step, 40);
    // Every worker saw ps:1 come back older.
    EXPECT_EQ(r->ps_restarts_seen, 1);
    EXPECT_GT(r->steps_lost, 0);
    EXPECT_LE(r->steps_lost, 25);
  }
  EXPECT_EQ(ps1->restarts(), 1);
  ASSERT_GT(snapshot.version, 0);
  EXPECT_EQ(Stats(1).restored_version, snapshot.version);
  EXPECT_EQ(Stats(1).version, 40);
  // The new ps:1 applied every step from its checkpoint on, with both workers.
  EXPECT_EQ(Stats(1).gradients_applied, 2 * (40 - snapshot.version));
  EXPECT_EQ(Stats(0).version, 40);
}

TEST_P(JobTest, ACoordinatorChiefFollowsEvaluatesAndEndsTheJobWithoutPushing) {
  Make({.ps = 2,
        .workers = 2,
        .chief = true,
        .steps = 30,
        .training = "    evaluation: {everySteps: 10}\n"});
  std::vector<FaultyShardChannel*> chief_channels;
  auto chief = NewClient(0, v1::TASK_TYPE_CHIEF, &chief_channels);
  // The chief waits on both PS tasks for each boundary while the workers
  // train: worker 0 starts steps 1, 11 and 21 only once it does.
  auto chief_waits_for = [&](int nth_pull) {
    for (int ps = 0; ps < 2; ++ps) {
      while (chief_channels[ps]->calls(ShardRpc::kPull) < nth_pull ||
             cluster_->ps(ps)->held_pulls(TaskRole::kChief) == 0) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
  };
  faulty_[0][0]->Before(ShardRpc::kPushPull, [&](int call) {
    if (call % 10 == 1) chief_waits_for(call / 10 + 1);
    return absl::OkStatus();
  });
  std::vector<Progress> reports;
  absl::StatusOr<TrainResult> followed = absl::UnknownError("not run");
  std::thread follower([&] {
    if (absl::Status s = chief->Connect(); !s.ok()) {
      followed = s;
      return;
    }
    FollowOptions o;
    o.progress_interval = absl::Seconds(1);  // on the fake clock: never passes
    followed = Follow(*config_, o, chief.get(), test_, &train_, &clock_, TrainerMetrics{},
                      [&](const Progress& p) { reports.push_back(p); });
  });
  auto results = RunWorkers();
  follower.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->test_accuracy, 0);  // worker 0 is a plain worker here
  }
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_EQ(followed->global_step, 30);
  EXPECT_GT(followed->test_accuracy, 0.5);
  EXPECT_GT(followed->final_loss, 0);
  EXPECT_EQ(followed->local_steps, 0);
  // Only the two workers' gradients, every step, on both shards.
  EXPECT_EQ(followed->ps_stats.gradients_applied(), 2 * 30 * 2);
  for (int ps = 0; ps < 2; ++ps) {
    EXPECT_EQ(Stats(ps).gradients_applied, 30 * 2);
    EXPECT_TRUE(cluster_->ps(ps)->shard()->shutdown_requested());
  }
  // Evaluated exactly at 10, 20 and the end, each read once; each evaluation is reported.
  EXPECT_EQ(chief_channels[0]->calls(ShardRpc::kPush), 0);
  EXPECT_EQ(chief_channels[0]->calls(ShardRpc::kPushPull), 0);
  EXPECT_EQ(chief_channels[0]->calls(ShardRpc::kPull), 3);
  std::vector<int64_t> evaluated_at;
  for (const Progress& p : reports) {
    if (p.accuracy.has_value() && (evaluated_at.empty() || evaluated_at.back() != p.global_step)) {
      evaluated_at.push_back(p.global_step);
    }
  }
  EXPECT_EQ(evaluated_at, (std::vector<int64_t>{10, 20, 30}));
  ASSERT_TRUE(reports.back().accuracy.has_value());
  EXPECT_DOUBLE_EQ(*reports.back().accuracy, followed->test_accuracy);
}

// A job with a dynamic table: rows are created as the workers first look
// ids up; the chief evaluates with the test set's rows read (nothing
// created), and its export holds exactly the rows the PS tasks hold, which
// evaluate as the chief did, the unseen ids at their initial values.
TEST_P(JobTest, ADynamicTableTrainsAndItsExportHoldsTheRowsAndEvaluatesAsTheChiefDid) {
  MakeFromYaml(DynamicJobYaml(0));
  train_ = DynamicDataset(1200, 1, 60);
  test_ = DynamicDataset(400, 2, 70);
  export_model_ = ::testing::TempDir() + "dynamic.ktm";
  auto results = RunWorkers();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  const TrainResult& chief = *results[0];
  EXPECT_GT(*chief.test_metrics.accuracy, 0.75);
  int64_t rows = 0;
  for (int ps = 0; ps < 2; ++ps) rows += cluster_->ps(ps)->shard()->TableRowCounts()[0].rows;
  EXPECT_EQ(rows, 60);  // the training values only: evaluation created none
  EXPECT_EQ(chief.ps_stats.dynamic_rows(), 60);
  EXPECT_EQ(chief.ps_stats.dynamic_rows_evicted(), 0);

  auto file = ReadModelFile(export_model_);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->stored_rows.size(), 1u);
  EXPECT_EQ(file->stored_rows[0].rows, 60);
  EXPECT_EQ(file->seed, 5u);
  const Model& model = *config_->model;
  Batch b;
  b.x = test_.images.data();
  b.labels = test_.labels.data();
  b.lookup_ids = test_.lookup_ids.data();
  b.size = test_.size;
  SparseBatch lookups = model.Lookups(b.lookup_ids, b.size);
  ASSERT_TRUE(KeepTableRows(model, CompactLookups(&lookups), &*file).ok());
  b.sparse = &lookups;
  const EvalMetrics again = model.Evaluate(file->params, b);
  EXPECT_EQ(again.accuracy, chief.test_metrics.accuracy);
  EXPECT_EQ(again.loss, chief.test_metrics.loss);
  EXPECT_EQ(again.auc, chief.test_metrics.auc);
}

TEST_P(JobTest, MaxRowsBoundsADynamicTableAndEvictionsAreCounted) {
  MakeFromYaml(DynamicJobYaml(20));  // 10 rows per PS task, 60 values
  train_ = DynamicDataset(1200, 1, 60);
  test_ = DynamicDataset(400, 2, 70);
  auto results = RunWorkers();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  for (int ps = 0; ps < 2; ++ps) {
    // A batch of 8 ids per worker may pass the bound until the next touch trims it.
    EXPECT_LE(cluster_->ps(ps)->shard()->TableRowCounts()[0].rows, 10 + 8);
  }
  EXPECT_GT(results[0]->ps_stats.dynamic_rows_evicted(), 0);
}

INSTANTIATE_TEST_SUITE_P(PlainAndOverlapped, JobTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OverlapLayers" : "Plain";
                         });

}  // namespace
}  // namespace kubetrain
