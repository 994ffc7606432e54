// PsTask on a fake clock, driven round by round (RunRound) as Serve drives
// it: checkpoint cadence (everySteps boundaries, everySeconds), the final
// save, restore on start (and refusal of another model's checkpoint), the
// shutdown grace, waiting for evaluators, Stop(), and the metric names.
#include "ps/ps_task.h"

#include <errno.h>

#include <atomic>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/testing/task_config_for.h"
#include "core/testing/temp_files.h"
#include "ps/in_process_shard_channel.h"

namespace kubetrain {
namespace {

struct JobOptions {
  int workers = 1;
  bool evaluator = false;
  std::string mode = "async";
  std::string hidden;    // "" = softmax; else an mlp's hiddenUnits, e.g. "[8]"
  std::string training;  // more lines under spec.training
};

// The config of ps:0 of a small job.
TaskConfig PsConfig(const JobOptions& o) {
  const std::string model = o.hidden.empty()
                                ? "{type: softmax}"
                                : absl::StrCat("{type: mlp, hiddenUnits: ", o.hidden, "}");
  const std::string yaml = absl::StrCat(
      "apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: {name: pstask}\nspec:\n",
      "  replicaSpecs:\n    PS: {replicas: 1}\n    Worker: {replicas: ", o.workers, "}\n",
      o.evaluator ? "    Evaluator: {replicas: 1}\n" : "", "  training:\n    mode: ", o.mode, "\n",
      "    model: ", model, "\n    optimizer: {type: adam}\n    steps: 100\n", o.training);
  auto config = TaskConfigFor(yaml, "ps", 0);
  EXPECT_TRUE(config.ok()) << config.status();
  return std::move(*config);
}

PsTaskOptions Quiet() {
  PsTaskOptions o;
  o.keep_serving_after_checkpoint_failure = absl::ZeroDuration();  // tests that hold say so
  o.metrics_address = "";
  o.bind_host = "127.0.0.1";
  o.port = 0;
  o.insecure = true;  // no credentials: the tests that check them say so
  return o;
}

std::vector<std::vector<float>> Grads(const Shard& shard) {
  std::vector<std::vector<float>> g;
  for (const auto& p : shard.parts()) g.emplace_back(p.num_elements(), 0.01f);
  return g;
}

// One async step from worker `w`.
void Step(Shard* shard, int w = 0) {
  ASSERT_TRUE(shard->Push({w, shard->version(), shard->version() + 1}, Grads(*shard)).ok());
}

std::vector<std::string> Checkpoints(const std::string& ckpt_dir) {
  return ListDir(ShardCheckpointDir(ckpt_dir, 0));
}

class PsTaskTest : public ::testing::Test {
 protected:
  std::unique_ptr<PsTask> Create(const JobOptions& o, PsTaskOptions options = Quiet()) {
    auto task =
        PsTask::Create(PsConfig(o), options, &clock_, std::make_shared<prometheus::Registry>());
    EXPECT_TRUE(task.ok()) << task.status();
    return task.ok() ? std::move(*task) : nullptr;
  }
  std::string CheckpointYaml(const std::string& extra) {
    ckpt_dir_ = NewTestDir("ckpt");
    return absl::StrCat("    checkpoint:\n      directory: ", ckpt_dir_, "\n", extra);
  }

  FakeClock clock_{absl::FromUnixSeconds(1700000000)};
  std::string ckpt_dir_;
};

TEST_F(PsTaskTest, WritesACheckpointAtEveryStepsBoundaryAndAFinalOne) {
  auto task = Create({.training = CheckpointYaml("      everySteps: 5\n")});
  ASSERT_NE(task, nullptr);
  for (int i = 0; i < 12; ++i) {
    Step(task->shard());
    EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));
  }
  EXPECT_EQ(Checkpoints(ckpt_dir_),
            (std::vector<std::string>{"ckpt-000000000005.ktc", "ckpt-000000000010.ktc"}));
  // The chief (worker 0 here) ends the job and the only worker leaves.
  ASSERT_TRUE(task->shard()->RequestShutdown({TaskRole::kWorker, 0}).ok());
  ASSERT_TRUE(task->shard()->Leave({TaskRole::kWorker, 0}).ok());
  EXPECT_TRUE(task->RunRound(absl::ZeroDuration()));
  EXPECT_TRUE(task->RunRound(absl::ZeroDuration()));  // over stays over; no second save
  EXPECT_EQ(Checkpoints(ckpt_dir_),
            (std::vector<std::string>{"ckpt-000000000005.ktc", "ckpt-000000000010.ktc",
                                      "ckpt-000000000012.ktc"}));
}

TEST_F(PsTaskTest, EverySecondsFollowsTheClockAndSkipsAnUnchangedVersion) {
  auto task = Create({.training = CheckpointYaml("      everySeconds: 10\n")});
  ASSERT_NE(task, nullptr);
  Step(task->shard());
  task->RunRound(absl::ZeroDuration());
  clock_.Advance(absl::Seconds(9));
  task->RunRound(absl::ZeroDuration());
  EXPECT_TRUE(Checkpoints(ckpt_dir_).empty());
  clock_.Advance(absl::Seconds(1));
  task->RunRound(absl::ZeroDuration());
  EXPECT_EQ(Checkpoints(ckpt_dir_), (std::vector<std::string>{"ckpt-000000000001.ktc"}));
  clock_.Advance(absl::Seconds(25));  // nothing new to save
  task->RunRound(absl::ZeroDuration());
  EXPECT_EQ(Checkpoints(ckpt_dir_).size(), 1u);
  Step(task->shard());
  Step(task->shard());
  task->RunRound(absl::ZeroDuration());  // 25 s since the last save, and the version moved
  EXPECT_EQ(Checkpoints(ckpt_dir_),
            (std::vector<std::string>{"ckpt-000000000001.ktc", "ckpt-000000000003.ktc"}));
}

TEST_F(PsTaskTest, RestoresTheNewestCheckpointOnStartAndRefusesAnotherModels) {
  const std::string training = CheckpointYaml("");
  int64_t first_incarnation = 0;
  {
    auto task = Create({.training = training});
    ASSERT_NE(task, nullptr);
    first_incarnation = task->shard()->incarnation();
    for (int i = 0; i < 3; ++i) Step(task->shard());
    task->Stop();
    EXPECT_TRUE(task->RunRound(absl::ZeroDuration()));  // the final save
  }
  clock_.Advance(absl::Seconds(1));
  auto again = Create({.training = training});
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->shard()->version(), 3);
  EXPECT_EQ(again->shard()->stats().restored_version, 3);
  EXPECT_NE(again->shard()->incarnation(), first_incarnation);

  // The same directory for a different model: refused, naming the file.
  auto other = PsTask::Create(PsConfig({.hidden = "[8]", .training = training}), Quiet(), &clock_,
                              std::make_shared<prometheus::Registry>());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(std::string(other.status().message()), "ckpt-000000000003.ktc");
  EXPECT_CONTAINS(std::string(other.status().message()), "refusing to load it");
}

TEST_F(PsTaskTest, ShutdownGraceExpiresWhenAWorkerNeverLeaves) {
  PsTaskOptions options = Quiet();
  options.shutdown_grace = absl::Seconds(30);
  auto task = Create({.workers = 2}, options);
  ASSERT_NE(task, nullptr);
  EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));
  ASSERT_TRUE(task->shard()->RequestShutdown({TaskRole::kWorker, 0}).ok());
  ASSERT_TRUE(task->shard()->Leave({TaskRole::kWorker, 0}).ok());
  EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));  // worker 1 is still expected
  clock_.Advance(absl::Seconds(30));
  EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(task->RunRound(absl::ZeroDuration()));
}

TEST_F(PsTaskTest, EndsOnlyAfterTheChiefsShutdownAndEveryWorkerAndEvaluatorLeft) {
  auto task = Create({.workers = 1, .evaluator = true});
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->shard()->Leave({TaskRole::kWorker, 0}).ok());
  EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));  // no shutdown yet
  ASSERT_TRUE(task->shard()->RequestShutdown({TaskRole::kWorker, 0}).ok());
  EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));  // the evaluator still reads
  ASSERT_TRUE(task->shard()->Leave({TaskRole::kEvaluator, 0}).ok());
  EXPECT_TRUE(task->RunRound(absl::ZeroDuration()));
}

TEST_F(PsTaskTest, StopEndsServeWithAFinalCheckpoint) {
  PsTaskOptions options = Quiet();
  options.tick = absl::Milliseconds(1);
  auto task = Create({.training = CheckpointYaml("")}, options);
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->Start().ok());
  EXPECT_GT(task->port(), 0);
  absl::Status served = absl::UnknownError("not returned");
  std::thread serve([&] { served = task->Serve(); });
  Step(task->shard());
  Step(task->shard());
  task->Stop();
  serve.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(Checkpoints(ckpt_dir_), (std::vector<std::string>{"ckpt-000000000002.ktc"}));
}

TEST_F(PsTaskTest, StopAnswersAHeldPullWithUnavailableSoTheWorkerAsksAgain) {
  PsTaskOptions options = Quiet();
  options.tick = absl::Milliseconds(1);
  auto task = Create({.workers = 2, .mode = "sync"}, options);
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->Start().ok());
  absl::Status served = absl::UnknownError("not returned");
  std::thread serve([&] { served = task->Serve(); });
  absl::Notification answered;
  absl::Status answer;
  // Worker 0 waits at the barrier of step 1, which worker 1 never reaches.
  task->shard()->Pull({0, 1, 0}, clock_.Now() + absl::Seconds(30), [&](auto s) {
    answer = s.status();
    answered.Notify();
  });
  EXPECT_FALSE(answered.HasBeenNotified());
  task->Stop();
  serve.join();
  ASSERT_TRUE(answered.HasBeenNotified());
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnavailable) << answer;
  EXPECT_NE(answer.message().find("ps:0 is stopping"), std::string::npos) << answer;
}

TEST_F(PsTaskTest, RefusesATaskThatIsNotAPs) {
  TaskConfig config = PsConfig({});
  config.tf.task_type = "worker";
  auto task =
      PsTask::Create(std::move(config), Quiet(), &clock_, std::make_shared<prometheus::Registry>());
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(task.status().message()), "kubetrain-ps runs \"ps\" tasks");
}

TEST_F(PsTaskTest, RefusesToRunOpenUnlessInsecureSaysSo) {
  PsTaskOptions options = Quiet();
  options.insecure = false;
  auto open =
      PsTask::Create(PsConfig({}), options, &clock_, std::make_shared<prometheus::Registry>());
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(open.status().message());
  EXPECT_CONTAINS(message, "ps:0 has no credentials");
  EXPECT_CONTAINS(message, "--auth_dir or $KUBETRAIN_AUTH_DIR, holding job.key");
  EXPECT_CONTAINS(message, "or pass --insecure (or KUBETRAIN_INSECURE=1) to run it open");
  // A job key is enough without the flag.
  options.credentials.job_key = std::string(64, 'a');
  EXPECT_TRUE(
      PsTask::Create(PsConfig({}), options, &clock_, std::make_shared<prometheus::Registry>())
          .ok());
  // And --insecure serves open.
  EXPECT_NE(Create({}, Quiet()), nullptr);
}

TEST_F(PsTaskTest, RegistersThePsMetricsUnderTheirDocumentedNames) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto task = PsTask::Create(PsConfig({}), Quiet(), &clock_, registry);
  ASSERT_TRUE(task.ok()) << task.status();
  std::set<std::string> names;
  for (const auto& family : registry->Collect()) names.insert(family.name);
  EXPECT_EQ(names, (std::set<std::string>{"kubetrain_absent_workers",
                                          "kubetrain_barrier_timeouts_total",
                                          "kubetrain_checkpoint_failures_total",
                                          "kubetrain_checkpoint_restores_total",
                                          "kubetrain_checkpoints_written_total",
                                          "kubetrain_global_step",
                                          "kubetrain_gradient_staleness_steps",
                                          "kubetrain_gradients_applied_total",
                                          "kubetrain_nonfinite_updates_total",
                                          "kubetrain_pull_bytes_total",
                                          "kubetrain_pull_hold_seconds",
                                          "kubetrain_push_bytes_total",
                                          "kubetrain_push_streams",
                                          "kubetrain_push_streams_refused_total",
                                          "kubetrain_ps_holding_unsaved_parameters",
                                          "kubetrain_pushes_rejected_total",
                                          "kubetrain_restored_version",
                                          "kubetrain_rpc_auth_failures_total",
                                          "kubetrain_rpc_duration_seconds",
                                          "kubetrain_sparse_pull_bytes_total",
                                          "kubetrain_sparse_push_bytes_total",
                                          "kubetrain_stale_gradients_dropped_total"}));
}

// Writes fail with `err` while it is non-zero (a disk that is full,
// read-only or broken), and work again once it is 0.
class SwitchableEnv : public EnvWrapper {
 public:
  SwitchableEnv() : EnvWrapper(FileEnv::Default()) {}
  absl::Status WriteFileAtomically(const std::string& path, const std::string& data) override {
    ++writes;
    if (err != 0 && failures_left != 0) {
      if (failures_left > 0) --failures_left;
      return OsError(err, "cannot create " + path);
    }
    return target()->WriteFileAtomically(path, data);
  }
  int err = 0;
  int failures_left = -1;  // < 0: every write fails while err != 0
  int writes = 0;
};

double Counter(prometheus::Registry& registry, const std::string& name) {
  for (const auto& family : registry.Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
  }
  return -1;
}

double Gauge(prometheus::Registry& registry, const std::string& name) {
  for (const auto& family : registry.Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].gauge.value;
  }
  return -1;
}

TEST_F(PsTaskTest, ACheckpointDirectoryThatCannotBeWrittenFailsAtStartNamingTheField) {
  for (int err : {ENOSPC, EROFS, EIO}) {
    SwitchableEnv env;
    env.err = err;
    PsTaskOptions options = Quiet();
    options.env = &env;
    auto task = PsTask::Create(PsConfig({.training = CheckpointYaml("      everySteps: 5\n")}),
                               options, &clock_, std::make_shared<prometheus::Registry>());
    ASSERT_FALSE(task.ok());
    EXPECT_EQ(task.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string msg(task.status().message());
    EXPECT_CONTAINS(msg, "spec.training.checkpoint.directory: " + ckpt_dir_ + " is not writable: ");
    EXPECT_CONTAINS(msg, ".kubetrain-probe-");
    EXPECT_CONTAINS(msg, std::strerror(err));
  }
}

TEST_F(PsTaskTest, AFailedCheckpointKeepsTrainingIsCountedAndRetried) {
  SwitchableEnv env;
  PsTaskOptions options = Quiet();
  options.env = &env;
  auto registry = std::make_shared<prometheus::Registry>();
  auto created = PsTask::Create(PsConfig({.training = CheckpointYaml("      everySteps: 5\n")}),
                                options, &clock_, registry);
  ASSERT_TRUE(created.ok()) << created.status();
  PsTask* task = created->get();
  env.err = ENOSPC;
  for (int i = 0; i < 5; ++i) Step(task->shard());
  EXPECT_FALSE(task->RunRound(absl::ZeroDuration()));
  EXPECT_EQ(Counter(*registry, "kubetrain_checkpoint_failures_total"), 1);
  EXPECT_TRUE(Checkpoints(ckpt_dir_).empty());
  // The shard's stats (GetStats, the chief's report) carry it with the OS error.
  ShardStatsSnapshot stats = task->shard()->stats();
  EXPECT_EQ(stats.checkpoint_failures, 1);
  EXPECT_TRUE(stats.checkpoint_failing);
  EXPECT_CONTAINS(stats.checkpoint_error, "ps:0 at version 5: ");
  EXPECT_CONTAINS(stats.checkpoint_error, std::strerror(ENOSPC));
  // Training goes on; no retry before the backoff (1 s) is over.
  Step(task->shard());
  task->RunRound(absl::ZeroDuration());
  EXPECT_EQ(Counter(*registry, "kubetrain_checkpoint_failures_total"), 1);
  clock_.Advance(absl::Seconds(1));
  task->RunRound(absl::ZeroDuration());  // the retry fails too: next one in 2 s
  EXPECT_EQ(Counter(*registry, "kubetrain_checkpoint_failures_total"), 2);
  env.err = 0;  // space again
  clock_.Advance(absl::Seconds(1));
  task->RunRound(absl::ZeroDuration());
  EXPECT_TRUE(Checkpoints(ckpt_dir_).empty());
  clock_.Advance(absl::Seconds(1));
  task->RunRound(absl::ZeroDuration());
  EXPECT_EQ(Checkpoints(ckpt_dir_), std::vector<std::string>{"ckpt-000000000006.ktc"});
  EXPECT_EQ(Counter(*registry, "kubetrain_checkpoints_written_total"), 1);
  // Written again: no longer failing; the count and the last error stay.
  stats = task->shard()->stats();
  EXPECT_EQ(stats.checkpoint_failures, 2);
  EXPECT_FALSE(stats.checkpoint_failing);
  EXPECT_CONTAINS(stats.checkpoint_error, std::strerror(ENOSPC));
}

TEST_F(PsTaskTest, AFinalCheckpointThatCannotBeWrittenEndsServeWithAnErrorNamingTheDirectory) {
  SwitchableEnv env;
  PsTaskOptions options = Quiet();
  options.env = &env;
  auto created = PsTask::Create(PsConfig({.training = CheckpointYaml("")}), options, &clock_,
                                std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(created.ok()) << created.status();
  PsTask* task = created->get();
  Step(task->shard());
  env.err = EIO;
  env.writes = 0;
  ASSERT_TRUE(task->shard()->RequestShutdown({TaskRole::kWorker, 0}).ok());
  ASSERT_TRUE(task->shard()->Leave({TaskRole::kWorker, 0}).ok());
  absl::Status served = task->Serve();
  EXPECT_EQ(env.writes, 4);  // final_checkpoint_attempts
  EXPECT_FALSE(served.ok());
  EXPECT_CONTAINS(std::string(served.message()),
                  "the final checkpoint of ps:0 at version 1 could not be written to "
                  "spec.training.checkpoint.directory " +
                      ckpt_dir_ + " after 4 attempts");
}

TEST_F(PsTaskTest, TheFinalCheckpointIsRetriedUntilItIsWritten) {
  SwitchableEnv env;
  PsTaskOptions options = Quiet();
  options.env = &env;
  std::atomic<int> signals{0};
  options.signals = &signals;
  auto created = PsTask::Create(PsConfig({.training = CheckpointYaml("")}), options, &clock_,
                                std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(created.ok()) << created.status();
  PsTask* task = created->get();
  Step(task->shard());
  Step(task->shard());
  // One failure, then the disk works: SIGTERM's final checkpoint is written.
  env.err = ENOSPC;
  env.failures_left = 1;
  env.writes = 0;
  signals = 1;
  EXPECT_TRUE(task->Serve().ok());
  EXPECT_EQ(env.writes, 2);
  EXPECT_EQ(Checkpoints(ckpt_dir_), std::vector<std::string>{"ckpt-000000000002.ktc"});
}

// A pull of the whole shard as the exporter (kubetrain export --from-ps)
// makes it, over the in-process transport: its version and values.
absl::StatusOr<std::pair<int64_t, std::vector<float>>> ExportPull(ShardChannel& channel) {
  v1::PullRequest request;
  request.set_task_type(v1::TASK_TYPE_EXPORTER);
  std::vector<float> values;
  auto header = channel.Pull(request, [&](const PulledChunk& c) {
    const size_t at = values.size();
    values.resize(at + c.data_bytes() / sizeof(float));
    c.CopyTo(reinterpret_cast<char*>(values.data() + at));
    return absl::OkStatus();
  });
  if (!header.ok()) return header.status();
  return std::make_pair(header->version(), std::move(values));
}

absl::StatusOr<v1::PushResponse> PushOnes(ShardChannel& channel, const Shard& shard) {
  std::vector<std::vector<float>> grads = Grads(shard);
  std::vector<ChunkRef> chunks;
  for (size_t i = 0; i < grads.size(); ++i) {
    chunks.push_back({&shard.parts()[i].name, 0, grads[i].data(), grads[i].size()});
  }
  v1::PushRequest::Header header;
  header.set_worker_index(0);
  header.set_version(shard.version());
  header.set_worker_clock(shard.version() + 1);
  return channel.Push(header, chunks);
}

class HoldingTest : public PsTaskTest {
 protected:
  // ps:0 of a trained job whose checkpoint directory turned read-only.
  void SetUp() override {
    PsTaskOptions options = Quiet();
    options.env = &env_;
    options.signals = &signals_;
    options.keep_serving_after_checkpoint_failure = absl::Minutes(10);
    const std::string training = CheckpointYaml("");
    config_ = PsConfig({.training = training});
    auto created = PsTask::Create(PsConfig({.training = training}), options, &clock_, registry_);
    ASSERT_TRUE(created.ok()) << created.status();
    task_ = std::move(*created);
    ps_ =
        InProcessPs::Over(config_, std::shared_ptr<Shard>(task_->shard(), [](Shard*) {}), &clock_);
    channel_ = ps_->NewChannel(64);  // several chunks per part
    for (int i = 0; i < 3; ++i) Step(task_->shard());
    auto before = ExportPull(*channel_);
    ASSERT_TRUE(before.ok()) << before.status();
    trained_ = before->second;
    env_.err = EROFS;
    env_.writes = 0;
  }

  SwitchableEnv env_;
  std::atomic<int> signals_{0};
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  TaskConfig config_;
  std::unique_ptr<PsTask> task_;
  std::unique_ptr<InProcessPs> ps_;
  std::unique_ptr<ShardChannel> channel_;
  std::vector<float> trained_;
};

TEST_F(HoldingTest, AFailedFinalCheckpointServesPullsRefusesPushesAndExitsAfterTheGrace) {
  signals_ = 1;  // SIGTERM (kubetrain run, the kubelet): the final checkpoint fails 4 times
  EXPECT_FALSE(task_->RunRound(absl::ZeroDuration()));
  EXPECT_EQ(env_.writes, 4);
  EXPECT_TRUE(task_->holding_parameters());
  EXPECT_EQ(Gauge(*registry_, "kubetrain_ps_holding_unsaved_parameters"), 1);
  // The exporter reads every value as trained, version 3.
  auto pulled = ExportPull(*channel_);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->first, 3);
  EXPECT_EQ(pulled->second, trained_);
  // A worker's push is refused and changes nothing.
  auto push = PushOnes(*channel_, *task_->shard());
  ASSERT_FALSE(push.ok());
  EXPECT_EQ(push.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(std::string(push.status().message()),
                  "ps:0 is read-only: its final checkpoint could not be written to "
                  "spec.training.checkpoint.directory " +
                      ckpt_dir_);
  EXPECT_EQ(task_->shard()->version(), 3);
  EXPECT_EQ(ExportPull(*channel_)->second, trained_);
  // Still serving until the grace is over (retries of the checkpoint fail).
  clock_.Advance(absl::Minutes(9));
  EXPECT_FALSE(task_->RunRound(absl::ZeroDuration()));
  EXPECT_TRUE(ExportPull(*channel_).ok());
  clock_.Advance(absl::Minutes(1));
  EXPECT_TRUE(task_->RunRound(absl::ZeroDuration()));
  EXPECT_FALSE(task_->holding_parameters());
  EXPECT_EQ(Gauge(*registry_, "kubetrain_ps_holding_unsaved_parameters"), 0);
  EXPECT_TRUE(Checkpoints(ckpt_dir_).empty());
}

TEST_F(HoldingTest, ASecondSigtermEndsTheHoldAtOnceAndServeFails) {
  // At the job's end (the chief's Shutdown, every worker gone) as on SIGTERM.
  ASSERT_TRUE(task_->shard()->RequestShutdown({TaskRole::kWorker, 0}).ok());
  ASSERT_TRUE(task_->shard()->Leave({TaskRole::kWorker, 0}).ok());
  EXPECT_FALSE(task_->RunRound(absl::ZeroDuration()));
  EXPECT_TRUE(task_->holding_parameters());
  EXPECT_FALSE(task_->RunRound(absl::ZeroDuration()));
  signals_ = 1;
  EXPECT_TRUE(task_->RunRound(absl::ZeroDuration()));
  EXPECT_FALSE(task_->holding_parameters());
}

TEST_F(HoldingTest, ServeReturnsTheCheckpointErrorAfterTheHold) {
  signals_ = 1;
  std::thread second_sigterm([&] {
    while (!task_->holding_parameters()) absl::SleepFor(absl::Milliseconds(1));
    signals_ = 2;
  });
  absl::Status served = task_->Serve();
  second_sigterm.join();
  EXPECT_FALSE(served.ok());
  EXPECT_CONTAINS(std::string(served.message()),
                  "the final checkpoint of ps:0 at version 3 could not be written");
}

TEST_F(HoldingTest, ACheckpointWrittenWhileHoldingEndsTheHoldWithSuccess) {
  signals_ = 1;
  EXPECT_FALSE(task_->RunRound(absl::ZeroDuration()));
  env_.err = 0;  // the disk is writable again
  clock_.Advance(absl::Minutes(1));
  EXPECT_TRUE(task_->RunRound(absl::ZeroDuration()));
  EXPECT_EQ(Checkpoints(ckpt_dir_), std::vector<std::string>{"ckpt-000000000003.ktc"});
}

}  // namespace
}  // namespace kubetrain
