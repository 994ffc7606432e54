#include "core/job_lifecycle.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1800000000);

TrainingJob Job(RestartPolicy worker_policy = RestartPolicy::kNever, int workers = 2,
                bool chief = false) {
  TrainingJob job;
  job.name = "j";
  job.replica_specs["PS"].replicas = 1;
  job.replica_specs["PS"].restart_policy = RestartPolicy::kOnFailure;
  job.replica_specs["Worker"].replicas = workers;
  job.replica_specs["Worker"].restart_policy = worker_policy;
  if (chief) job.replica_specs["Chief"].replicas = 1;
  return job;
}

// Every task of `job`, running.
std::vector<TaskState> Running(const TrainingJob& job) {
  std::vector<TaskState> tasks;
  for (const JobTask& id : JobTasks(job)) {
    TaskState t;
    t.task = id;
    t.phase = TaskPhase::kRunning;
    t.started = kStart;
    tasks.push_back(t);
  }
  return tasks;
}

TaskState& Task(std::vector<TaskState>& tasks, const std::string& name) {
  for (auto& t : tasks) {
    if (t.task.name() == name) return t;
  }
  ADD_FAILURE() << "no task " << name;
  return tasks.front();
}

void Fail(std::vector<TaskState>& tasks, const std::string& name, std::optional<int> code,
          absl::Time at = kStart + absl::Seconds(5)) {
  TaskState& t = Task(tasks, name);
  t.phase = TaskPhase::kFailed;
  t.exit_code = code;
  t.finished = at;
}

LifecycleDecision Decide(const TrainingJob& job, const std::vector<TaskState>& tasks,
                         absl::Time now = kStart + absl::Seconds(5)) {
  return DecideJob(job, tasks, kStart, now, kLocalBackoff);
}

TEST(RestartBackoffTest, DoublesFromZeroToTheCapLikeTheKubelet) {
  std::vector<absl::Duration> kubelet;
  for (int n = 1; n <= 8; ++n) kubelet.push_back(kKubeletBackoff.Delay(n));
  EXPECT_EQ(kubelet,
            (std::vector<absl::Duration>{absl::ZeroDuration(), absl::Seconds(10), absl::Seconds(20),
                                         absl::Seconds(40), absl::Seconds(80), absl::Seconds(160),
                                         absl::Minutes(5), absl::Minutes(5)}));
  EXPECT_EQ(kLocalBackoff.Delay(1), absl::Milliseconds(500));
  EXPECT_EQ(kLocalBackoff.Delay(2), absl::Seconds(1));
  EXPECT_EQ(kLocalBackoff.Delay(5), absl::Seconds(8));
  EXPECT_EQ(kLocalBackoff.Delay(10), absl::Seconds(256));
  EXPECT_EQ(kLocalBackoff.Delay(11), absl::Minutes(5));  // grows to minutes
  EXPECT_EQ(kLocalBackoff.Delay(1000), absl::Minutes(5));
}

TEST(JobLifecycleTest, RunningJobWaitsWithCounts) {
  TrainingJob job = Job();
  LifecycleDecision d = Decide(job, Running(job));
  EXPECT_EQ(d.outcome, JobOutcome::kRunning);
  EXPECT_TRUE(d.restarts.empty());
  EXPECT_FALSE(d.wake_at.has_value());
  EXPECT_EQ(d.replicas["Worker"].active, 2);
  EXPECT_EQ(d.replicas["PS"].active, 1);
}

TEST(JobLifecycleTest, NeverFailsTheJobNamingTheTask) {
  TrainingJob job = Job(RestartPolicy::kNever);
  auto tasks = Running(job);
  Fail(tasks, "worker-1", 2);
  LifecycleDecision d = Decide(job, tasks);
  EXPECT_EQ(d.outcome, JobOutcome::kFailed);
  EXPECT_EQ(d.failure.kind, FailureKind::kTaskFailed);
  EXPECT_EQ(d.failure.task.name(), "worker-1");
  EXPECT_EQ(d.failure.exit_code, 2);
  EXPECT_EQ(d.failure.policy, RestartPolicy::kNever);
  EXPECT_EQ(d.replicas["Worker"].failed, 1);
  EXPECT_STREQ(FailureKindName(d.failure.kind), "TaskFailed");
}

TEST(JobLifecycleTest, ExitCodeRestartsSignalsAndFailsOnErrors) {
  TrainingJob job = Job(RestartPolicy::kExitCode);
  auto tasks = Running(job);
  Fail(tasks, "worker-1", 137);
  LifecycleDecision d = Decide(job, tasks);
  EXPECT_EQ(d.outcome, JobOutcome::kRunning);
  ASSERT_EQ(d.restarts.size(), 1u);
  EXPECT_EQ(d.restarts[0].task.name(), "worker-1");
  EXPECT_EQ(d.restarts[0].exit_code, 137);
  EXPECT_EQ(d.restarts[0].delay, absl::Milliseconds(500));  // the local first restart
  EXPECT_EQ(d.restarts[0].restarts, 1);
  EXPECT_TRUE(d.DueRestarts(kStart + absl::Seconds(5)).empty());
  EXPECT_EQ(d.DueRestarts(kStart + absl::Milliseconds(5500)).size(), 1u);
  EXPECT_EQ(*d.wake_at, kStart + absl::Milliseconds(5500));
  Fail(tasks, "worker-1", 1);
  EXPECT_EQ(Decide(job, tasks).failure.kind, FailureKind::kTaskFailed);
}

TEST(JobLifecycleTest, ALostTaskCountsAs137) {
  TrainingJob job = Job(RestartPolicy::kExitCode);
  auto tasks = Running(job);
  Fail(tasks, "worker-0", std::nullopt, absl::InfinitePast());
  LifecycleDecision d = Decide(job, tasks);
  ASSERT_EQ(d.restarts.size(), 1u);
  EXPECT_EQ(d.restarts[0].exit_code, 137);
  EXPECT_EQ(d.restarts[0].at, kStart + absl::Seconds(5));  // unknown end: due now
  TrainingJob never = Job(RestartPolicy::kNever);
  EXPECT_EQ(Decide(never, tasks).failure.exit_code, 137);
}

TEST(JobLifecycleTest, OnFailureAndAlwaysRestartAnyFailure) {
  for (RestartPolicy p : {RestartPolicy::kOnFailure, RestartPolicy::kAlways}) {
    TrainingJob job = Job(p);
    auto tasks = Running(job);
    Fail(tasks, "worker-0", 1);
    EXPECT_EQ(Decide(job, tasks).restarts.size(), 1u) << RestartPolicyName(p);
  }
}

TEST(JobLifecycleTest, BackoffLimitAllowsExactlyThatManyRestarts) {
  TrainingJob job = Job(RestartPolicy::kExitCode);
  job.run_policy.backoff_limit = 1;
  auto tasks = Running(job);
  Fail(tasks, "worker-1", 137);
  LifecycleDecision first = Decide(job, tasks);
  ASSERT_EQ(first.restarts.size(), 1u);  // restart 1 of 1
  TaskState& w1 = Task(tasks, "worker-1");
  w1.restarts = first.restarts[0].restarts;
  w1.consecutive_failures = first.restarts[0].consecutive_failures;
  w1.phase = TaskPhase::kRunning;
  EXPECT_EQ(Decide(job, tasks).total_restarts, 1);
  Fail(tasks, "worker-0", 143);
  LifecycleDecision second = Decide(job, tasks);
  EXPECT_EQ(second.outcome, JobOutcome::kFailed);
  EXPECT_EQ(second.failure.kind, FailureKind::kBackoffLimitExceeded);
  EXPECT_EQ(second.failure.task.name(), "worker-0");
  EXPECT_EQ(second.failure.restarts, 2);
  EXPECT_EQ(second.failure.backoff_limit, 1);

  job.run_policy.backoff_limit = 0;  // any restart fails the job
  auto fresh = Running(job);
  Fail(fresh, "worker-1", 137);
  EXPECT_EQ(Decide(job, fresh).failure.kind, FailureKind::kBackoffLimitExceeded);
}

TEST(JobLifecycleTest, InPlaceRestartsCountTowardTheLimit) {
  TrainingJob job = Job(RestartPolicy::kOnFailure);
  job.run_policy.backoff_limit = 2;
  auto tasks = Running(job);
  Task(tasks, "worker-0").in_place_restarts = 2;
  EXPECT_EQ(Decide(job, tasks).outcome, JobOutcome::kRunning);  // 2 of 2
  EXPECT_EQ(Decide(job, tasks).replicas["Worker"].restarts, 2);
  EXPECT_EQ(Decide(job, tasks).replicas["Worker"].recreated, 0);
  Task(tasks, "worker-0").in_place_restarts = 3;
  LifecycleDecision d = Decide(job, tasks);
  EXPECT_EQ(d.failure.kind, FailureKind::kBackoffLimitExceeded);
  EXPECT_EQ(d.failure.task.name(), "worker-0");
}

TEST(JobLifecycleTest, DeadlineIsATimerAndComesFirst) {
  TrainingJob job = Job();
  job.run_policy.active_deadline_seconds = 60;
  auto tasks = Running(job);
  LifecycleDecision before = Decide(job, tasks, kStart + absl::Seconds(59));
  EXPECT_EQ(before.outcome, JobOutcome::kRunning);
  EXPECT_EQ(*before.wake_at, kStart + absl::Seconds(60));
  Task(tasks, "worker-0").phase = TaskPhase::kSucceeded;  // too late
  LifecycleDecision after = Decide(job, tasks, kStart + absl::Seconds(60));
  EXPECT_EQ(after.outcome, JobOutcome::kFailed);
  EXPECT_EQ(after.failure.kind, FailureKind::kDeadlineExceeded);
  EXPECT_EQ(after.failure.deadline_seconds, 60);
}

TEST(JobLifecycleTest, TheChiefDecidesSuccess) {
  TrainingJob job = Job();
  auto tasks = Running(job);
  Task(tasks, "worker-1").phase = TaskPhase::kSucceeded;
  EXPECT_EQ(Decide(job, tasks).outcome, JobOutcome::kRunning);
  Task(tasks, "worker-0").phase = TaskPhase::kSucceeded;
  LifecycleDecision d = Decide(job, tasks);
  EXPECT_EQ(d.outcome, JobOutcome::kSucceeded);
  EXPECT_EQ(d.replicas["Worker"].succeeded, 2);

  TrainingJob with_chief = Job(RestartPolicy::kNever, 2, /*chief=*/true);
  auto ct = Running(with_chief);
  Task(ct, "worker-0").phase = TaskPhase::kSucceeded;
  EXPECT_EQ(Decide(with_chief, ct).outcome, JobOutcome::kRunning);  // worker 0 is a plain worker
  Task(ct, "chief-0").phase = TaskPhase::kSucceeded;
  EXPECT_EQ(Decide(with_chief, ct).outcome, JobOutcome::kSucceeded);
}

TEST(JobLifecycleTest, AllWorkersWaitsForEveryWorker) {
  TrainingJob job = Job();
  job.success_policy = "AllWorkers";
  auto tasks = Running(job);
  Task(tasks, "worker-0").phase = TaskPhase::kSucceeded;
  EXPECT_EQ(Decide(job, tasks).outcome, JobOutcome::kRunning);
  Task(tasks, "worker-1").phase = TaskPhase::kSucceeded;
  EXPECT_EQ(Decide(job, tasks).outcome, JobOutcome::kSucceeded);
}

TEST(JobLifecycleTest, AFailureOutweighsTheChiefsSuccess) {
  TrainingJob job = Job();
  auto tasks = Running(job);
  Task(tasks, "worker-0").phase = TaskPhase::kSucceeded;
  Fail(tasks, "worker-1", 1);
  EXPECT_EQ(Decide(job, tasks).failure.kind, FailureKind::kTaskFailed);
}

TEST(JobLifecycleTest, RestartsBackOffAndResetAfterALongRun) {
  TrainingJob job = Job(RestartPolicy::kOnFailure);
  auto tasks = Running(job);
  TaskState& w = Task(tasks, "worker-1");
  w.restarts = 3;
  w.consecutive_failures = 3;
  w.started = kStart;
  Fail(tasks, "worker-1", 1, kStart + absl::Seconds(2));
  LifecycleDecision d = Decide(job, tasks, kStart + absl::Seconds(2));
  ASSERT_EQ(d.restarts.size(), 1u);
  EXPECT_EQ(d.restarts[0].consecutive_failures, 4);
  EXPECT_EQ(d.restarts[0].restarts, 4);
  EXPECT_EQ(d.restarts[0].delay, absl::Seconds(4));  // 1 s doubled twice
  EXPECT_EQ(d.restarts[0].at, kStart + absl::Seconds(6));
  EXPECT_EQ(*d.wake_at, kStart + absl::Seconds(6));
  EXPECT_TRUE(d.DueRestarts(kStart + absl::Seconds(5)).empty());
  EXPECT_EQ(d.DueRestarts(kStart + absl::Seconds(6)).size(), 1u);
  // The same observation later decides the same restart (idempotent).
  EXPECT_EQ(Decide(job, tasks, kStart + absl::Seconds(3)).restarts[0].at, d.restarts[0].at);
  // A run of 10 minutes starts the count again.
  Fail(tasks, "worker-1", 1, kStart + absl::Minutes(10));
  LifecycleDecision reset = Decide(job, tasks, kStart + absl::Minutes(10));
  EXPECT_EQ(reset.restarts[0].consecutive_failures, 1);
  EXPECT_EQ(reset.restarts[0].delay, absl::Milliseconds(500));
}

}  // namespace
}  // namespace kubetrain
