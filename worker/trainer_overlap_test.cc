// Whole sync jobs (1 or 2 PS, 2 workers, in one process) run plainly, with
// TrainerOptions::overlap_layers and with overlap_pull too: the PS tasks end
// with the same bits (dense parts, optimizer slots, table rows), for a dense
// MLP and for a wide & deep model with dynamic tables, with the chief's
// evaluations (a step computed on a pull still arriving is computed again
// after the evaluation); and with one fused round trip per step either way.
// A pull that fails mid-way (after some of its values were written and
// read) and a PS restarted from an older checkpoint before it is asked
// again end as on the plain path: the same bits.
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
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

enum class Mode { kPlain, kOverlapLayers, kOverlapPull };

// Wraps worker w's channel to PS p (a fault); null: none.
using WrapChannel = std::function<std::unique_ptr<ShardChannel>(int w, int p, InProcessCluster*,
                                                                std::unique_ptr<ShardChannel>)>;

JobRun RunJob(const TaskConfig& config, const FakeClock* clock, Mode mode, const Dataset& train,
              const Dataset& test, const WrapChannel& wrap = nullptr) {
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
    std::vector<std::unique_ptr<ShardChannel>> channels = run.cluster->Channels(&run.faulty[i]);
    for (int p = 0; wrap && p < static_cast<int>(channels.size()); ++p) {
      channels[p] = wrap(i, p, run.cluster.get(), std::move(channels[p]));
    }
    clients.push_back(std::make_unique<PsClient>(o, &config.placement, clock, std::move(channels),
                                                 PsClientMetrics{}));
  }
  run.results.assign(clients.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    threads.emplace_back([&, i] {
      TrainerOptions o;
      o.worker_index = static_cast<int>(i);
      o.is_chief = config.job.IsChiefTask("worker", o.worker_index);
      o.progress_interval = absl::Hours(1);
      o.overlap_layers = mode != Mode::kPlain;
      o.overlap_pull = mode == Mode::kOverlapPull;
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

// A fault: worker 0's `nth` fused push-pull to its PS fails (UNAVAILABLE)
// after `chunks` chunks of its pull were written; its PS restarts from the
// checkpoint taken before worker 0's `checkpoint_at`-th push-pull, before the
// pull is asked again. The values the worker reads after the fault are the
// restored ones; any value of the failed pull it used would show in the bits.
class FailMidPull : public ShardChannelWrapper {
 public:
  FailMidPull(std::unique_ptr<ShardChannel> target, InProcessPs* ps, int checkpoint_at, int nth,
              int chunks)
      : ShardChannelWrapper(std::move(target)),
        ps_(ps),
        checkpoint_at_(checkpoint_at),
        nth_(nth),
        chunks_(chunks) {}
  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override {
    ++calls_;
    if (calls_ == checkpoint_at_) from_ = ps_->shard()->Checkpoint();
    if (calls_ != nth_) return ShardChannelWrapper::PushPull(header, chunks, sparse, pull, sink);
    int written = 0;
    PushPullAnswer a = ShardChannelWrapper::PushPull(
        header, chunks, sparse, pull, [&](const PulledChunk& c) -> absl::Status {
          if (written == chunks_) return absl::UnavailableError("the link broke mid-pull");
          ++written;
          return sink(c);
        });
    EXPECT_EQ(written, chunks_);
    EXPECT_TRUE(a.push.ok()) << a.push.status();
    EXPECT_FALSE(a.pull.ok());
    restart_next_pull_ = true;
    return a;
  }
  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override {
    if (restart_next_pull_) {
      restart_next_pull_ = false;
      EXPECT_TRUE(from_.has_value());
      if (absl::Status s = ps_->Restart(from_); !s.ok()) return s;
      ++restarts_;
    }
    return ShardChannelWrapper::Pull(request, sink);
  }
  int restarts() const { return restarts_; }

 private:
  InProcessPs* const ps_;
  const int checkpoint_at_, nth_, chunks_;
  int calls_ = 0;  // the worker's one training thread calls
  bool restart_next_pull_ = false;
  int restarts_ = 0;
  std::optional<ShardCheckpoint> from_;
};

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
    const JobRun plain = RunJob(*config, &clock_, Mode::kPlain, train, test);
    ExpectOneRoundTripPerStep(plain);
    for (Mode mode : {Mode::kOverlapLayers, Mode::kOverlapPull}) {
      SCOPED_TRACE(mode == Mode::kOverlapPull ? "overlap_pull" : "overlap_layers");
      const JobRun overlapped = RunJob(*config, &clock_, mode, train, test);
      for (const JobRun* run : {&plain, &overlapped}) {
        for (const auto& r : run->results) {
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_EQ(r->global_step, config->target_steps);
        }
      }
      ExpectOneRoundTripPerStep(overlapped);
      ExpectSameBits(*config, plain, overlapped);
      EXPECT_EQ(overlapped.results[0]->test_metrics.loss, plain.results[0]->test_metrics.loss);
      EXPECT_EQ(overlapped.results[0]->test_accuracy, plain.results[0]->test_accuracy);
      for (size_t w = 0; w < plain.results.size(); ++w) {
        EXPECT_EQ(overlapped.results[w]->final_loss, plain.results[w]->final_loss) << w;
        EXPECT_EQ(overlapped.results[w]->local_steps, plain.results[w]->local_steps) << w;
      }
    }
  }

  FakeClock clock_;
};

std::string MlpYaml(int ps) {
  return absl::StrReplaceAll(
      JobYaml(
          {.ps = ps, .workers = 2, .steps = 25, .training = "    evaluation: {everySteps: 7}\n"}),
      {{"model: {type: softmax}", "model: {type: mlp, hiddenUnits: [16, 8]}"},
       {"type: sgd, learningRate: 0.5", "type: adam, learningRate: 0.01"}});
}

std::string WideAndDeepYaml(int ps) {
  return absl::StrReplaceAll(DynamicJobYaml(0),
                             {{"head: sigmoid", "head: wideAndDeep\n      wide: {columns: [c]}"},
                              {"steps: 150", "steps: 40"},
                              {"PS: {replicas: 2}", absl::StrCat("PS: {replicas: ", ps, "}")}});
}

TEST_F(TrainerOverlapTest, ASyncMlpJobEndsWithTheSameBitsOverlappedOrNot) {
  Compare(MlpYaml(2), TinyDataset(600, 1), TinyDataset(300, 2));
}

TEST_F(TrainerOverlapTest, ASyncMlpJobOnOnePsEndsWithTheSameBitsOverlappedOrNot) {
  Compare(MlpYaml(1), TinyDataset(600, 1), TinyDataset(300, 2));
}

TEST_F(TrainerOverlapTest, ASyncWideAndDeepJobWithDynamicTablesEndsWithTheSameBits) {
  Compare(WideAndDeepYaml(2), DynamicDataset(1200, 1, 60), DynamicDataset(400, 2, 70));
}

TEST_F(TrainerOverlapTest, ASyncWideAndDeepJobOnOnePsEndsWithTheSameBits) {
  Compare(WideAndDeepYaml(1), DynamicDataset(1200, 1, 60), DynamicDataset(400, 2, 70));
}

// One worker (so the run is deterministic through the restart), 1 PS: its
// 9th push-pull's pull breaks after 15 chunks (of 18: the first layer whole) and the PS comes back
// at the version before its 5th; plain and pull-overlapped end alike.
TEST_F(TrainerOverlapTest, APullThatBreaksMidWayEndsAsOnThePlainPath) {
  const std::string yaml =
      absl::StrReplaceAll(MlpYaml(1), {{"Worker: {replicas: 2}", "Worker: {replicas: 1}"}});
  auto config = TaskConfigFor(yaml, "worker", 0);
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<FailMidPull*> faults;
  const WrapChannel wrap = [&](int w, int p, InProcessCluster* cluster,
                               std::unique_ptr<ShardChannel> c) -> std::unique_ptr<ShardChannel> {
    auto f = std::make_unique<FailMidPull>(std::move(c), cluster->ps(p), 5, 9, 15);
    faults.push_back(f.get());
    return f;
  };
  const Dataset train = TinyDataset(600, 1), test = TinyDataset(300, 2);
  const JobRun clean = RunJob(*config, &clock_, Mode::kPlain, train, test);
  const JobRun plain = RunJob(*config, &clock_, Mode::kPlain, train, test, wrap);
  const JobRun pull = RunJob(*config, &clock_, Mode::kOverlapPull, train, test, wrap);
  ASSERT_EQ(faults.size(), 2u);
  for (const JobRun* run : {&clean, &plain, &pull}) {
    ASSERT_TRUE(run->results[0].ok()) << run->results[0].status();
    EXPECT_EQ(run->results[0]->global_step, config->target_steps);
  }
  for (FailMidPull* f : faults) EXPECT_EQ(f->restarts(), 1);
  EXPECT_GT(plain.results[0]->steps_lost, 0);
  EXPECT_EQ(pull.results[0]->steps_lost, plain.results[0]->steps_lost);
  EXPECT_EQ(pull.results[0]->local_steps, plain.results[0]->local_steps);
  EXPECT_EQ(pull.results[0]->final_loss, plain.results[0]->final_loss);
  EXPECT_EQ(pull.results[0]->test_metrics.loss, plain.results[0]->test_metrics.loss);
  ExpectSameBits(*config, plain, pull);
  // The fault mattered: the job took more steps than without it.
  EXPECT_GT(plain.results[0]->local_steps, clean.results[0]->local_steps);
}

}  // namespace
}  // namespace kubetrain
