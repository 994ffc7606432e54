// The job lifecycle as one pure function, shared by both runners: from the
// job's spec, where each task is, when the job started and the time now,
// what happens next: restart a task (now or after a backoff), fail the job
// (and why), succeed, or wait. No I/O and no clock reads: `now` is an input.
//
// `kubetrain run` (cli/job_runner.h) feeds it process exits; the operator's
// Desired() (operator/desired.h) feeds it pods. A scenario table
// (core/testing/lifecycle_scenarios.h) runs through both callers and requires
// the same decisions from each.
//
// The rules (docs/trainingjob.md, "Restarts, backoffLimit and the job's end"):
//  - activeDeadlineSeconds counts from `start`; once it has passed the job
//    fails (kDeadlineExceeded) before anything else is judged.
//  - A failed task is restarted or fails the job per its replica type's
//    restartPolicy (IsRetryable, core/job_spec.h). A task that ended without
//    an exit code (a lost pod: evicted, its node gone) counts as 137.
//  - backoffLimit N allows N restarts in total: restarts done by the runner
//    plus those done in place by someone else (the kubelet, for OnFailure and
//    Always pods). A failure that would need restart N+1, or in-place restarts
//    beyond N, fail the job (kBackoffLimitExceeded).
//  - Success (checked after failures): the chief task succeeded
//    (TrainingJob::IsChiefTask: the Chief replica, else worker 0), or with
//    successPolicy AllWorkers every worker task. PS and Evaluator never count.
//  - A task is restarted after a delay that doubles with each failure in a
//    row up to a cap, as the kubelet's CrashLoopBackOff (RestartBackoff); a run
//    that lasted `reset_after` starts the count again.
#ifndef KUBETRAIN_CORE_JOB_LIFECYCLE_H_
#define KUBETRAIN_CORE_JOB_LIFECYCLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/cluster_spec.h"
#include "core/job_spec.h"

namespace kubetrain {

// The restart delay schedule of one task.
struct RestartBackoff {
  absl::Duration first;        // before the first restart (after one failure)
  absl::Duration initial;      // before the second restart in a row, doubling after
  absl::Duration max;          // the cap
  absl::Duration reset_after;  // a run at least this long resets the count

  // The delay before the restart that follows `consecutive` failures in a row
  // (>= 1): first, then initial, 2 x initial, ... capped at max.
  absl::Duration Delay(int consecutive) const;
};

// The kubelet's CrashLoopBackOff: the first restart at once, then 10 s
// doubling to 5 min, reset after 10 min of running. The operator uses it for
// the pods it recreates, so a pod recreated by the operator and a container
// restarted in place by the kubelet back off alike.
inline constexpr RestartBackoff kKubeletBackoff{absl::ZeroDuration(), absl::Seconds(10),
                                                absl::Minutes(5), absl::Minutes(10)};
// `kubetrain run`'s: 0.5 s, 1 s, 2 s, ... doubling to the same 5 min cap; the
// short start keeps a local retry quick.
inline constexpr RestartBackoff kLocalBackoff{absl::Milliseconds(500), absl::Seconds(1),
                                              absl::Minutes(5), absl::Minutes(10)};

enum class TaskPhase {
  kPending,  // not started yet, or being (re)created
  kRunning,
  kSucceeded,  // ended with exit code 0
  kFailed,     // ended with a non-zero exit code, or was lost (no exit code)
};

// One task as the runner sees it now, plus what the runner remembers of it
// between decisions (`restarts`, `consecutive_failures`: set them from a
// Restart once it has been carried out).
struct TaskState {
  JobTask task;
  TaskPhase phase = TaskPhase::kPending;
  std::optional<int> exit_code;                // kFailed; nullopt = lost (counts as 137)
  absl::Time started = absl::InfinitePast();   // kFailed: when the run that ended began
  absl::Time finished = absl::InfinitePast();  // kFailed: when it ended (InfinitePast: unknown)
  int in_place_restarts = 0;                   // restarts someone else did (the kubelet)
  int restarts = 0;                            // restarts this runner did
  int consecutive_failures = 0;                // failures in a row so far
};

enum class JobOutcome { kRunning, kSucceeded, kFailed };

enum class FailureKind {
  kNone,
  kTaskFailed,            // a task failed and its restartPolicy does not restart it
  kBackoffLimitExceeded,  // runPolicy.backoffLimit
  kDeadlineExceeded,      // runPolicy.activeDeadlineSeconds
};
// "TaskFailed", "BackoffLimitExceeded", "DeadlineExceeded" ("" for kNone).
const char* FailureKindName(FailureKind kind);

// Why the job failed, with what each runner needs to word its own message.
struct Failure {
  FailureKind kind = FailureKind::kNone;
  JobTask task;       // kTaskFailed / kBackoffLimitExceeded: the task that decided it
  int exit_code = 0;  // of that task (137 for a lost one; 0 if it was restarted in place)
  RestartPolicy policy = RestartPolicy::kNever;  // of that task's replica type
  int64_t restarts = 0;          // kBackoffLimitExceeded: restarts the job would need
  int backoff_limit = 0;         // kBackoffLimitExceeded
  int64_t deadline_seconds = 0;  // kDeadlineExceeded
};

// A failed task to start again.
struct Restart {
  JobTask task;
  int exit_code = 0;  // how it ended (137 for a lost one)
  RestartPolicy policy = RestartPolicy::kNever;
  absl::Duration delay;          // the backoff before this restart
  absl::Time at;                 // when it is due: `finished` + delay (now if unknown)
  int restarts = 0;              // the task's TaskState::restarts once restarted
  int consecutive_failures = 0;  // its TaskState::consecutive_failures once restarted
};

struct ReplicaCounts {
  int active = 0;  // running
  int succeeded = 0;
  int failed = 0;         // failed for good (not restarted)
  int64_t restarts = 0;   // restarts so far, in place or by the runner
  int64_t recreated = 0;  // of which by the runner
};

struct LifecycleDecision {
  JobOutcome outcome = JobOutcome::kRunning;
  Failure failure;  // kFailed
  // kRunning: failed tasks to restart, in task order, each due at `at` (now
  // or later). A runner carries out those due and waits for the others.
  std::vector<Restart> restarts;
  // kRunning: when the decision changes by itself (a restart falls due, the
  // deadline passes); nullopt: only when a task changes.
  std::optional<absl::Time> wake_at;
  std::map<std::string, ReplicaCounts> replicas;  // by replica key ("PS", "Worker", ...)
  int64_t total_restarts = 0;                     // restarts so far, every task

  // The restarts due at `now`.
  std::vector<Restart> DueRestarts(absl::Time now) const;
};

// `tasks`: every task of the job (JobTasks order), as observed; `start`: when
// the job (last) started, for activeDeadlineSeconds. Restart policies are the
// spec's (a caller that overrides them passes a job with them changed).
LifecycleDecision DecideJob(const TrainingJob& job, const std::vector<TaskState>& tasks,
                            absl::Time start, absl::Time now, const RestartBackoff& backoff);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_JOB_LIFECYCLE_H_
