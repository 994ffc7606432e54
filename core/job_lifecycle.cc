#include "core/job_lifecycle.h"

#include <algorithm>

namespace kubetrain {
namespace {

// Exit code of a task that ended without one (a lost pod), as TFJob counts it.
constexpr int kLostExitCode = 137;

RestartPolicy PolicyOf(const TrainingJob& job, const JobTask& task) {
  auto it = job.replica_specs.find(ReplicaKeyOf(task.type));
  return it == job.replica_specs.end() ? RestartPolicy::kNever : it->second.restart_policy;
}

int ExitCodeOf(const TaskState& t) { return t.exit_code.value_or(kLostExitCode); }

bool Succeeded(const std::vector<TaskState>& tasks, const TrainingJob& job) {
  if (job.success_policy == "AllWorkers") {
    bool any = false;
    for (const TaskState& t : tasks) {
      if (t.task.type != "worker") continue;
      if (t.phase != TaskPhase::kSucceeded) return false;
      any = true;
    }
    return any;
  }
  for (const TaskState& t : tasks) {
    if (job.IsChiefTask(t.task.type, t.task.index)) return t.phase == TaskPhase::kSucceeded;
  }
  return false;
}

Restart PlanRestart(const TaskState& t, RestartPolicy policy, absl::Time now,
                    const RestartBackoff& backoff) {
  Restart r;
  r.task = t.task;
  r.exit_code = ExitCodeOf(t);
  r.policy = policy;
  const bool ran_fine = t.finished != absl::InfinitePast() && t.started != absl::InfinitePast() &&
                        t.finished - t.started >= backoff.reset_after;
  r.consecutive_failures = ran_fine ? 1 : t.consecutive_failures + 1;
  r.restarts = t.restarts + 1;
  if (t.finished == absl::InfinitePast()) {
    r.delay = absl::ZeroDuration();  // when it ended is unknown: no crash loop to slow down
    r.at = now;
  } else {
    r.delay = backoff.Delay(r.consecutive_failures);
    r.at = t.finished + r.delay;
  }
  return r;
}

}  // namespace

absl::Duration RestartBackoff::Delay(int consecutive) const {
  if (consecutive <= 1) return std::min(first, max);
  absl::Duration d = initial;
  for (int i = 2; i < consecutive && d < max; ++i) d *= 2;
  return std::min(d, max);
}

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kNone:
      return "";
    case FailureKind::kTaskFailed:
      return "TaskFailed";
    case FailureKind::kBackoffLimitExceeded:
      return "BackoffLimitExceeded";
    case FailureKind::kDeadlineExceeded:
      return "DeadlineExceeded";
  }
  return "";
}

std::vector<Restart> LifecycleDecision::DueRestarts(absl::Time now) const {
  std::vector<Restart> due;
  for (const Restart& r : restarts) {
    if (r.at <= now) due.push_back(r);
  }
  return due;
}

LifecycleDecision DecideJob(const TrainingJob& job, const std::vector<TaskState>& tasks,
                            absl::Time start, absl::Time now, const RestartBackoff& backoff) {
  LifecycleDecision d;
  const TaskState* permanent = nullptr;     // the first task that failed for good
  std::vector<const TaskState*> retryable;  // failed tasks their policy restarts
  const TaskState* restarted_most = nullptr;
  for (const TaskState& t : tasks) {
    const RestartPolicy policy = PolicyOf(job, t.task);
    ReplicaCounts& c = d.replicas[ReplicaKeyOf(t.task.type)];
    c.restarts += t.restarts + t.in_place_restarts;
    c.recreated += t.restarts;
    d.total_restarts += t.restarts + t.in_place_restarts;
    if (restarted_most == nullptr ||
        t.restarts + t.in_place_restarts >
            restarted_most->restarts + restarted_most->in_place_restarts) {
      restarted_most = &t;
    }
    switch (t.phase) {
      case TaskPhase::kRunning:
        ++c.active;
        break;
      case TaskPhase::kSucceeded:
        ++c.succeeded;
        break;
      case TaskPhase::kFailed:
        if (IsRetryable(policy, ExitCodeOf(t))) {
          retryable.push_back(&t);
        } else {
          ++c.failed;
          if (permanent == nullptr) permanent = &t;
        }
        break;
      case TaskPhase::kPending:
        break;
    }
  }

  const auto& deadline = job.run_policy.active_deadline_seconds;
  const absl::Time due = deadline ? start + absl::Seconds(*deadline) : absl::InfiniteFuture();
  if (now >= due) {
    d.outcome = JobOutcome::kFailed;
    d.failure.kind = FailureKind::kDeadlineExceeded;
    d.failure.deadline_seconds = *deadline;
    return d;
  }
  if (permanent != nullptr) {
    d.outcome = JobOutcome::kFailed;
    d.failure.kind = FailureKind::kTaskFailed;
    d.failure.task = permanent->task;
    d.failure.exit_code = ExitCodeOf(*permanent);
    d.failure.policy = PolicyOf(job, permanent->task);
    return d;
  }
  const auto& limit = job.run_policy.backoff_limit;
  const int64_t needed = d.total_restarts + static_cast<int64_t>(retryable.size());
  if (limit && needed > *limit) {
    // The task whose failure crossed the limit, or (restarted in place) the
    // one restarted most.
    const TaskState* culprit = retryable.empty() ? restarted_most : retryable.front();
    d.outcome = JobOutcome::kFailed;
    d.failure.kind = FailureKind::kBackoffLimitExceeded;
    d.failure.task = culprit->task;
    d.failure.exit_code = culprit->phase == TaskPhase::kFailed ? ExitCodeOf(*culprit) : 0;
    d.failure.policy = PolicyOf(job, culprit->task);
    d.failure.restarts = needed;
    d.failure.backoff_limit = *limit;
    return d;
  }
  if (Succeeded(tasks, job)) {
    d.outcome = JobOutcome::kSucceeded;
    return d;
  }
  if (deadline) d.wake_at = due;
  for (const TaskState* t : retryable) {
    Restart r = PlanRestart(*t, PolicyOf(job, t->task), now, backoff);
    if (r.at > now && (!d.wake_at || r.at < *d.wake_at)) d.wake_at = r.at;
    d.restarts.push_back(r);
  }
  return d;
}

}  // namespace kubetrain
