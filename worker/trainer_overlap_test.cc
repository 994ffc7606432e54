// Whole sync jobs (2 PS, 2 workers, in one process) run twice, plainly and
// with TrainerOptions::overlap_layers: the PS tasks end with the same bits
// (dense parts, optimizer slots, table rows), for a dense MLP and for a wide &
// deep model with dynamic tables; and with one fused round trip per step
// either way.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"
#include "worker/testing.h"
#include "worker/trainer.h"

namespace kubetrain {
namespace {

using testjob::DynamicDataset;
using testjob::DynamicJobYaml;
using testjob::InProcessCluster;
using testjob::JobShape;
using testjob::JobYaml;
using testjob::TinyDataset;

// A job run to its end: its PS tasks (left in memory) and the workers' results.
struct JobRun {
  std::unique_ptr<InProcessCluster> cluster;
  std::vector<absl::StatusOr<TrainResult>> results;
  std::vector<std::unique_ptr<PsClient>> clients;        // own the channels below
  std::vector<std::vector<FaultyShardChannel*>> faulty;  // per worker, per PS
};

JobRun RunJob(const TaskConfig& config, const FakeClock* clock, bool overlap, const Dataset& train,
              const Dataset& test) {
  JobRun run;
  auto cluster = InProcessCluster::Create(config, clock);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return run;
  run.cluster = std::move(*cluster);
  const DatasetSource source(train);
  std::vector<std::unique_ptr<PsClient>>& clients = run.clients;
  run.faulty.resize(config.num_workers);
  for (int i = 0; i < config.num_workers; ++i) {
    PsClient::Options o;
    o.task_index = i;
    o.fingerprint = config.fingerprint;
    o.chunk_bytes = 4096;
    o.retry_timeout = absl::Seconds(30);
    clients.push_back(std::make_unique<PsClient>(
        o, &config.placement, clock, run.cluster->Channels(&run.faulty[i]), PsClientMetrics{}));
  }
  run.results.assign(clients.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    threads.emplace_back([&, i] {
      TrainerOptions o;
      o.worker_index = static_cast<int>(i);
      o.is_chief = config.job.IsChiefTask("worker", o.worker_index);
      o.progress_interval = absl::Hours(1);
      o.overlap_layers = overlap;
      if (absl::Status s = clients[i]->Connect(); !s.ok()) {
        run.results[i] = s;
        return;
      }
      run.results[i] = Train(config, o, clients[i].get(), source, o.is_chief ? &test : nullptr,
                             clock, TrainerMetrics{}, [](const Progress&) {});
    });
  }
  for (auto& t : threads) t.join();
  return run;
}

// Every dense part and optimizer slot of every PS task, and every row of
// every dynamic table (by id), bit for bit.
void ExpectSameBits(const TaskConfig& config, const JobRun& a, const JobRun& b) {
  for (int ps = 0; ps < a.cluster->num_ps(); ++ps) {
    std::shared_ptr<Shard> x = a.cluster->ps(ps)->shard();
    std::shared_ptr<Shard> y = b.cluster->ps(ps)->shard();
    const ShardCheckpoint cx = x->Checkpoint(), cy = y->Checkpoint();
    ASSERT_EQ(cx.part_names, cy.part_names);
    EXPECT_EQ(cx.version, cy.version);
    int compared = 0;
    for (size_t p = 0; p < cx.part_names.size(); ++p) {
      // Table rows are listed by id below (a checkpoint holds them in
      // recency order, which follows the workers' interleaving).
      if (cx.part_names[p].find('@') != std::string::npos) continue;
      ASSERT_EQ(cx.values[p].size(), cy.values[p].size());
      EXPECT_EQ(std::memcmp(cx.values[p].data(), cy.values[p].data(), 4 * cx.values[p].size()), 0)
          << "ps:" << ps << " " << cx.part_names[p];
      ASSERT_EQ(cx.slots[p].size(), cy.slots[p].size());
      for (size_t k = 0; k < cx.slots[p].size(); ++k) {
        EXPECT_EQ(cx.slots[p][k], cy.slots[p][k]) << "ps:" << ps << " " << cx.part_names[p];
      }
      ++compared;
    }
    EXPECT_GT(compared, 0);
    for (size_t t = 0; t < config.placement.tables.size(); ++t) {
      if (!config.placement.tables[t].dynamic) continue;
      auto rx = x->ListRows({TaskRole::kWorker, 0}, static_cast<int>(t), 0, 1 << 20);
      auto ry = y->ListRows({TaskRole::kWorker, 0}, static_cast<int>(t), 0, 1 << 20);
      ASSERT_TRUE(rx.ok()) << rx.status();
      ASSERT_TRUE(ry.ok()) << ry.status();
      EXPECT_GT(rx->ids.size(), 0u);
      EXPECT_EQ(rx->ids, ry->ids) << config.placement.tables[t].name;
      ASSERT_EQ(rx->values.size(), ry->values.size());
      EXPECT_EQ(std::memcmp(rx->values.data(), ry->values.data(), 4 * rx->values.size()), 0)
          << "ps:" << ps << " rows of " << config.placement.tables[t].name;
    }
  }
}

void ExpectOneRoundTripPerStep(const JobRun& run) {
  for (size_t w = 0; w < run.faulty.size(); ++w) {
    ASSERT_TRUE(run.results[w].ok()) << run.results[w].status();
    for (FaultyShardChannel* ps : run.faulty[w]) {
      EXPECT_EQ(ps->calls(ShardRpc::kPushPull), run.results[w]->local_steps);
      EXPECT_EQ(ps->calls(ShardRpc::kPush), 0);
    }
  }
}

class TrainerOverlapTest : public ::testing::Test {
 protected:
  void Compare(const std::string& yaml, const Dataset& train, const Dataset& test) {
    auto config = TaskConfigFor(yaml, "worker", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    const JobRun plain = RunJob(*config, &clock_, false, train, test);
    const JobRun overlapped = RunJob(*config, &clock_, true, train, test);
    for (const JobRun* run : {&plain, &overlapped}) {
      for (const auto& r : run->results) {
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->global_step, config->target_steps);
      }
    }
    ExpectOneRoundTripPerStep(plain);
    ExpectOneRoundTripPerStep(overlapped);
    ExpectSameBits(*config, plain, overlapped);
    EXPECT_EQ(overlapped.results[0]->test_metrics.loss, plain.results[0]->test_metrics.loss);
    EXPECT_EQ(overlapped.results[0]->final_loss, plain.results[0]->final_loss);
  }

  FakeClock clock_;
};

TEST_F(TrainerOverlapTest, ASyncMlpJobEndsWithTheSameBitsOverlappedOrNot) {
  const std::string yaml =
      absl::StrReplaceAll(JobYaml({.ps = 2, .workers = 2, .steps = 25}),
                          {{"model: {type: softmax}", "model: {type: mlp, hiddenUnits: [16, 8]}"},
                           {"type: sgd, learningRate: 0.5", "type: adam, learningRate: 0.01"}});
  Compare(yaml, TinyDataset(600, 1), TinyDataset(300, 2));
}

TEST_F(TrainerOverlapTest, ASyncWideAndDeepJobWithDynamicTablesEndsWithTheSameBits) {
  const std::string yaml = absl::StrReplaceAll(
      DynamicJobYaml(0), {{"head: sigmoid", "head: wideAndDeep\n      wide: {columns: [c]}"},
                          {"steps: 150", "steps: 40"}});
  Compare(yaml, DynamicDataset(1200, 1, 60), DynamicDataset(400, 2, 70));
}

}  // namespace
}  // namespace kubetrain
