// WorkerTask for each task type, over in-process PS tasks: a job with a Chief
// replica (a coordinator chief, two workers, an evaluator) and one without
// (worker 0 is the chief). The chief's report goes through the contract of
// core/job_report.h and is read back with its parser; the chief's gauges
// carry the metric names the operator reads.
#include "worker/worker_task.h"

#include <sys/stat.h>

#include <errno.h>

#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "core/testing/temp_files.h"
#include "worker/testing.h"

namespace kubetrain {
namespace {

using testjob::InProcessCluster;
using testjob::JobShape;
using testjob::JobYaml;
using testjob::TinyDataset;

// The value of the unlabelled gauge `name` in `registry`, or nullopt.
std::optional<double> Gauge(prometheus::Registry& registry, const std::string& name) {
  for (const auto& family : registry.Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].gauge.value;
  }
  return std::nullopt;
}

class WorkerTaskTest : public ::testing::Test {
 protected:
  struct Task {
    std::unique_ptr<WorkerTask> task;
    std::shared_ptr<prometheus::Registry> registry;
    std::vector<std::string> lines;  // its report lines
    absl::Status run = absl::UnknownError("not run");
  };

  void Make(const JobShape& shape) {
    yaml_ = JobYaml(shape);
    auto config = TaskConfigFor(yaml_, "worker", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    ps_config_ = std::make_unique<TaskConfig>(std::move(*config));
    auto cluster = InProcessCluster::Create(*ps_config_, &clock_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  absl::StatusOr<std::unique_ptr<WorkerTask>> CreateTask(const std::string& type, int index,
                                                         Task* out,
                                                         WorkerTaskOptions options = {}) {
    auto config = TaskConfigFor(yaml_, type, index);
    if (!config.ok()) return config.status();
    options.metrics_address = "";
    options.report_sink = [this, out](const std::string& line) {
      absl::MutexLock l(&mu_);
      out->lines.push_back(line);
    };
    out->registry = std::make_shared<prometheus::Registry>();
    return WorkerTask::Create(std::move(*config), options, &clock_, out->registry,
                              cluster_->Channels(), data_);
  }

  void Add(const std::string& type, int index, WorkerTaskOptions options = {}) {
    Task& t = tasks_[type + ":" + std::to_string(index)];
    auto task = CreateTask(type, index, &t, std::move(options));
    ASSERT_TRUE(task.ok()) << task.status();
    t.task = std::move(*task);
  }

  void RunAll() {
    std::vector<std::thread> threads;
    for (auto& [name, t] : tasks_) {
      threads.emplace_back([&t] { t.run = t.task->Run(); });
    }
    for (auto& th : threads) th.join();
  }

  // The chief's report lines, parsed with the contract's parser.
  std::vector<ReportLine> Reports(const Task& t) {
    std::vector<ReportLine> out;
    for (const auto& line : t.lines) {
      auto parsed = ParseReportLine(line);
      EXPECT_TRUE(parsed.has_value()) << line;
      if (parsed) out.push_back(*parsed);
    }
    return out;
  }

  FakeClock clock_;
  WorkerData data_{std::make_shared<const TrainingSet>(InMemoryTrainingSet(TinyDataset(600, 1))),
                   std::make_shared<const Dataset>(TinyDataset(300, 2))};
  std::string yaml_;
  std::unique_ptr<TaskConfig> ps_config_;
  std::unique_ptr<InProcessCluster> cluster_;
  absl::Mutex mu_;
  std::map<std::string, Task> tasks_;
};

TEST_F(WorkerTaskTest, AJobWithAChiefReplicaEndsWithTheCoordinatorsResult) {
  Make({.ps = 2,
        .workers = 2,
        .chief = true,
        .evaluator = true,
        .steps = 30,
        .training = "    evaluation: {everySteps: 10}\n"});
  const std::string dir = NewTestDir("chief");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  WorkerTaskOptions chief_options;
  chief_options.export_model = dir + "/model.ktm";
  chief_options.result_file = dir + "/result.json";
  Add("chief", 0, chief_options);
  Add("worker", 0);
  Add("worker", 1);
  Add("evaluator", 0);
  RunAll();
  for (auto& [name, t] : tasks_) EXPECT_TRUE(t.run.ok()) << name << ": " << t.run;

  Task& chief = tasks_["chief:0"];
  EXPECT_TRUE(chief.task->is_chief());
  std::vector<ReportLine> reports = Reports(chief);
  ASSERT_GE(reports.size(), 2u);
  for (size_t i = 0; i + 1 < reports.size(); ++i) EXPECT_TRUE(reports[i].progress.has_value());
  ASSERT_TRUE(reports.back().result.has_value());
  const JobResult& result = *reports.back().result;
  EXPECT_EQ(result.status, "Succeeded");
  EXPECT_EQ(result.mode, "sync");
  EXPECT_EQ(result.global_step, 30);
  EXPECT_EQ(result.target_steps, 30);
  EXPECT_EQ(result.gradients_applied,
            2 * 30 * 2);  // 2 shards x 30 steps x 2 workers: not the chief
  EXPECT_EQ(result.stale_gradients_dropped, 0);
  EXPECT_GT(result.test_accuracy, 0.5);
  EXPECT_GT(result.final_loss, 0);
  EXPECT_EQ(result.model_path, dir + "/model.ktm");
  EXPECT_FALSE(ReadFile(dir + "/model.ktm").empty());
  ASSERT_TRUE(chief.task->result().has_value());
  EXPECT_EQ(ToJson(*chief.task->result()), ToJson(result));
  EXPECT_EQ(ReadFile(dir + "/result.json"), ToJson(result).dump() + "\n");
  // The gauges the operator reads, under core/job_report.h's names.
  EXPECT_EQ(Gauge(*chief.registry, kTargetStepsMetric), 30);
  EXPECT_EQ(Gauge(*chief.registry, kGlobalStepMetric), 30);
  EXPECT_EQ(Gauge(*chief.registry, kEvalAccuracyMetric), result.test_accuracy);
  EXPECT_TRUE(Gauge(*chief.registry, kExamplesPerSecondMetric).has_value());

  // Nobody else reports or ends the job; the evaluator evaluated on its own.
  for (const char* name : {"worker:0", "worker:1", "evaluator:0"}) {
    EXPECT_FALSE(tasks_[name].task->is_chief()) << name;
    EXPECT_TRUE(tasks_[name].lines.empty()) << name;
    EXPECT_FALSE(tasks_[name].task->result().has_value()) << name;
    EXPECT_FALSE(Gauge(*tasks_[name].registry, kTargetStepsMetric).has_value()) << name;
  }
  EXPECT_GT(*Gauge(*tasks_["evaluator:0"].registry, kEvalAccuracyMetric), 0.5);
  for (int ps = 0; ps < 2; ++ps) {
    Shard* shard = cluster_->ps(ps)->shard().get();
    EXPECT_TRUE(shard->shutdown_requested());
    EXPECT_TRUE(shard->all_workers_left());
    EXPECT_TRUE(shard->all_evaluators_left());
    EXPECT_EQ(shard->stats().gradients_applied, 30 * 2);
  }
}

TEST_F(WorkerTaskTest, WithoutAChiefReplicaWorkerZeroTrainsAndReports) {
  Make({.ps = 1, .workers = 2, .mode = "async", .steps = 40});
  Add("worker", 0);
  Add("worker", 1);
  RunAll();
  for (auto& [name, t] : tasks_) ASSERT_TRUE(t.run.ok()) << name << ": " << t.run;
  Task& chief = tasks_["worker:0"];
  EXPECT_TRUE(chief.task->is_chief());
  std::vector<ReportLine> reports = Reports(chief);
  ASSERT_FALSE(reports.empty());
  ASSERT_TRUE(reports.back().result.has_value());
  EXPECT_EQ(reports.back().result->mode, "async");
  EXPECT_EQ(reports.back().result->global_step, 40);
  EXPECT_EQ(reports.back().result->gradients_applied, 40);
  EXPECT_EQ(Gauge(*chief.registry, kTargetStepsMetric), 40);
  EXPECT_TRUE(tasks_["worker:1"].lines.empty());
}

TEST_F(WorkerTaskTest, TheChiefReportsThePsTasksCheckpointFailuresWithTheOsError) {
  for (bool chief_replica : {true, false}) {
    SCOPED_TRACE(chief_replica ? "Chief replica" : "worker 0 is the chief");
    tasks_.clear();
    Make({.ps = 2, .workers = 1, .chief = chief_replica, .steps = 20});
    const std::string error =
        "ps:1 at version 0: cannot create /ckpt/ps-1/x: No space left on device";
    cluster_->ps(1)->shard()->RecordCheckpointWrite(absl::ResourceExhaustedError(error));
    const std::string chief_name = chief_replica ? "chief:0" : "worker:0";
    if (chief_replica) Add("chief", 0);
    Add("worker", 0);
    RunAll();
    for (auto& [name, t] : tasks_) ASSERT_TRUE(t.run.ok()) << name << ": " << t.run;
    Task& chief = tasks_[chief_name];
    std::vector<ReportLine> reports = Reports(chief);
    ASSERT_GE(reports.size(), 2u);
    for (size_t i = 0; i + 1 < reports.size(); ++i) {
      ASSERT_TRUE(reports[i].progress.has_value());
      EXPECT_EQ(reports[i].progress->checkpoint_failures, 1);
      EXPECT_EQ(reports[i].progress->checkpoints_failing, 1);
      EXPECT_EQ(reports[i].progress->checkpoint_error, error);
    }
    ASSERT_TRUE(reports.back().result.has_value());
    EXPECT_EQ(reports.back().result->checkpoint_failures, 1);
    EXPECT_EQ(reports.back().result->checkpoints_failing, 1);
    EXPECT_EQ(reports.back().result->checkpoint_error, error);
    // The gauges the operator reads: the count, and the failing PS tasks
    // labelled with the error (core/job_report.h).
    EXPECT_EQ(Gauge(*chief.registry, kCheckpointFailuresMetric), 1);
    EXPECT_EQ(Gauge(*chief.registry, kAbsentWorkersMetric), 0);
    bool found = false;
    for (const auto& family : chief.registry->Collect()) {
      if (family.name != kCheckpointsFailingMetric) continue;
      ASSERT_EQ(family.metric.size(), 1u);
      ASSERT_EQ(family.metric[0].label.size(), 1u);
      EXPECT_EQ(family.metric[0].label[0].name, kCheckpointErrorLabel);
      EXPECT_EQ(family.metric[0].label[0].value, error);
      EXPECT_EQ(family.metric[0].gauge.value, 1);
      found = true;
    }
    EXPECT_TRUE(found);
  }
}

// --threads: workers computing on 2 threads train the job to its end; 0
// takes the CPU limit; a negative count is a configuration error.
TEST_F(WorkerTaskTest, WorkersComputeOnTheirThreads) {
  Make({.ps = 1, .workers = 2, .mode = "sync", .steps = 20});
  Add("worker", 0, WorkerTaskOptions{.threads = 2});
  Add("worker", 1, WorkerTaskOptions{.threads = 0});
  EXPECT_EQ(tasks_["worker:0"].task->threads(), 2);
  EXPECT_GE(tasks_["worker:1"].task->threads(), 1);
  RunAll();
  for (auto& [name, t] : tasks_) ASSERT_TRUE(t.run.ok()) << name << ": " << t.run;
  std::vector<ReportLine> reports = Reports(tasks_["worker:0"]);
  ASSERT_FALSE(reports.empty());
  ASSERT_TRUE(reports.back().result.has_value());
  EXPECT_EQ(reports.back().result->global_step, 20);
  Task t;
  auto bad = CreateTask("worker", 0, &t, WorkerTaskOptions{.threads = -2});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(bad.status().message()), "threads must be >= 1");
}

TEST_F(WorkerTaskTest, ByDefaultAWorkerComputesOnTheWholeCoresOfItsTemplatesCpuLimit) {
  Make({.ps = 1, .workers = 2, .mode = "sync", .steps = 5});
  const std::string plain = "    Worker: {replicas: 2}\n";
  ASSERT_NE(yaml_.find(plain), std::string::npos);
  yaml_.replace(yaml_.find(plain), plain.size(),
                "    Worker:\n      replicas: 2\n      template:\n        spec:\n"
                "          containers:\n          - name: kubetrain\n"
                "            resources: {limits: {cpu: 2500m}}\n");
  Add("worker", 0);  // WorkerTaskOptions::kThreadsFromJob
  EXPECT_EQ(tasks_["worker:0"].task->threads(), 2);
  Add("worker", 1, WorkerTaskOptions{.threads = 1});  // the flag wins
  EXPECT_EQ(tasks_["worker:1"].task->threads(), 1);
}

TEST_F(WorkerTaskTest, RefusesTaskTypesItDoesNotRun) {
  Make({.ps = 1, .workers = 1});
  Task t;
  auto ps = CreateTask("ps", 0, &t);
  ASSERT_FALSE(ps.ok());
  EXPECT_EQ(ps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(ps.status().message()),
                  "kubetrain-worker runs \"worker\", \"chief\" and \"evaluator\" tasks");
  auto config = TaskConfigFor(yaml_, "worker", 0);
  ASSERT_TRUE(config.ok());
  config->tf.task_type = "chief";  // a job without a Chief replica
  auto chief =
      WorkerTask::Create(std::move(*config), WorkerTaskOptions{.metrics_address = ""}, &clock_,
                         std::make_shared<prometheus::Registry>(), cluster_->Channels(), data_);
  ASSERT_FALSE(chief.ok());
  EXPECT_CONTAINS(std::string(chief.status().message()), "has no Chief replica");
}

TEST_F(WorkerTaskTest, StopEndsRunWithCancelled) {
  Make({.ps = 1, .workers = 2});
  Add("worker", 0);  // worker 1 never comes: worker 0 waits at the first barrier
  Task& t = tasks_["worker:0"];
  std::thread run([&t] { t.run = t.task->Run(); });
  while (cluster_->ps(0)->held_pulls() == 0) absl::SleepFor(absl::Milliseconds(1));
  t.task->Stop();
  clock_.Advance(absl::Minutes(1));  // the PS lets go of the held pull ...
  cluster_->TickAll();
  run.join();  // ... and the task does not ask again
  EXPECT_EQ(t.run.code(), absl::StatusCode::kCancelled) << t.run;
  EXPECT_CONTAINS(std::string(t.run.message()), "worker:0: ");
}

TEST_F(WorkerTaskTest, AWorkerStartedWithAnotherSpecIsRefusedSayingWhatDiffers) {
  Make({.ps = 1, .workers = 1});
  // Same model and placement, another seed and learning rate.
  const std::string ps_yaml = yaml_;
  yaml_ = absl::StrReplaceAll(
      ps_yaml, {{"seed: 5", "seed: 6"}, {"learningRate: 0.5", "learningRate: 0.25"}});
  ASSERT_NE(yaml_, ps_yaml);
  Task& t = tasks_["worker:0"];
  auto task = CreateTask("worker", 0, &t);
  ASSERT_TRUE(task.ok()) << task.status();
  absl::Status s = (*task)->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  const std::string msg(s.message());
  EXPECT_CONTAINS(msg,
                  "differs: seed: 5 there, 6 here; optimizer.learningRate: 0.5 there, 0.25 here");
  EXPECT_CONTAINS(msg, "give every task the same job file");
}

// Model writes fail with `err` for the first `failures` attempts (< 0: all).
class FlakyDisk : public EnvWrapper {
 public:
  FlakyDisk(int err, int failures) : EnvWrapper(FileEnv::Default()), err_(err), left_(failures) {}
  absl::Status WriteFileAtomically(const std::string& path, const std::string& data) override {
    ++writes;
    if (left_ != 0 && absl::StrContains(path, "model.ktm")) {
      if (left_ > 0) --left_;
      return OsError(err_, "cannot create " + path);
    }
    return target()->WriteFileAtomically(path, data);
  }
  int writes = 0;

 private:
  const int err_;
  int left_;
};

TEST_F(WorkerTaskTest, TheChiefRetriesTheExportWithoutRetraining) {
  Make({.ps = 1, .workers = 1, .steps = 10});
  const std::string dir = NewTestDir("export");
  FlakyDisk disk(ENOSPC, 2);
  WorkerTaskOptions options;
  options.export_model = dir + "/model.ktm";
  options.export_policy.env = &disk;
  Add("worker", 0, options);
  RunAll();
  Task& chief = tasks_["worker:0"];
  ASSERT_TRUE(chief.run.ok()) << chief.run;
  ASSERT_TRUE(chief.task->result().has_value());
  EXPECT_EQ(chief.task->result()->export_failures, 2);
  EXPECT_EQ(chief.task->result()->model_path, dir + "/model.ktm");
  EXPECT_EQ(chief.task->result()->global_step, 10);  // not one step more
  EXPECT_FALSE(ReadFile(dir + "/model.ktm").empty());
  EXPECT_TRUE(cluster_->ps(0)->shard()->shutdown_requested());
}

TEST_F(WorkerTaskTest, AnExportThatNeverWorksFailsNamingTheDirectoryAndLeavesThePsRunning) {
  const std::string dir = NewTestDir("export");
  Make({.ps = 1,
        .workers = 1,
        .steps = 10,
        .training = "    checkpoint: {directory: " + dir + "}\n"});
  FlakyDisk disk(EROFS, -1);
  WorkerTaskOptions options;
  options.export_policy.env = &disk;
  options.export_policy.attempts = 3;
  Add("worker", 0, options);
  RunAll();
  Task& chief = tasks_["worker:0"];
  ASSERT_FALSE(chief.run.ok());
  const std::string msg(chief.run.message());
  EXPECT_CONTAINS(msg, "cannot export the final model to " + dir +
                           "/model.ktm (spec.training.checkpoint.directory) after 3 attempts");
  EXPECT_CONTAINS(msg, "Read-only file system");
  // The job was not ended: the PS still holds the trained parameters.
  EXPECT_FALSE(cluster_->ps(0)->shard()->shutdown_requested());
  EXPECT_EQ(cluster_->ps(0)->shard()->version(), 10);
}

TEST_F(WorkerTaskTest, TheChiefProbesTheExportDirectoryAtStart) {
  const std::string dir = NewTestDir("export");
  Make({.ps = 1, .workers = 2, .training = "    checkpoint: {directory: " + dir + "}\n"});
  WorkerTaskOptions options;
  Task& chief = tasks_["worker:0"];
  // The probe writes a file other than the model: make every write fail.
  class FullDisk : public EnvWrapper {
   public:
    using EnvWrapper::EnvWrapper;
    absl::Status WriteFileAtomically(const std::string& path, const std::string&) override {
      return OsError(ENOSPC, "cannot create " + path);
    }
  } full(FileEnv::Default());
  options.export_policy.env = &full;
  auto task = CreateTask("worker", 0, &chief, options);
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(std::string(task.status().message()),
                  "spec.training.checkpoint.directory: " + dir + " is not writable: ");
  EXPECT_CONTAINS(std::string(task.status().message()), "No space left on device");
  // Another worker does not export: it does not care.
  Task& other = tasks_["worker:1"];
  EXPECT_TRUE(CreateTask("worker", 1, &other, options).ok());
}

}  // namespace
}  // namespace kubetrain
