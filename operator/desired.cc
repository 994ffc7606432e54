// Desired(): one pass of the operator's decision, composed from the parts in
// desired_internal.h.
#include "operator/desired.h"

#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {

using namespace desired_internal;  // NOLINT: this file only composes them

Actions Desired(const JobObject& job, const Observed& observed, const OperatorConfig& config) {
  Actions a;
  const absl::Time now = observed.now;
  a.status = job.status.is_object() ? job.status : nlohmann::json::object();
  a.status["observedGeneration"] = job.generation;
  if (job.deleting) return a;  // the garbage collector removes the children

  if (!IsConditionTrue(a.status, condition::kCreated)) {
    const std::string message = absl::StrCat("TrainingJob ", job.name, " is created.");
    SetCondition(&a.status, condition::kCreated, true, reason::kCreated, message, now);
    a.events.push_back({"Normal", reason::kCreated, message});
  }
  auto spec = ParseTrainingJob(job.object.dump());
  if (!spec.ok()) {
    // What the schema could not express: report it, create nothing.
    if (!IsFailed(a.status)) {
      Finish(condition::kFailed, reason::kInvalidSpec, std::string(spec.status().message()),
             observed.pods, "None", now, &a);
    }
  } else if (IsFinished(a.status)) {
    AfterFinish(job, *spec, observed, config, &a);
  } else if (!observed.create_rejected.empty()) {
    Finish(condition::kFailed, reason::kCreateRejected, observed.create_rejected, observed.pods,
           spec->run_policy.clean_pod_policy, now, &a);
  } else if (spec->run_policy.suspend) {
    Suspend(job, observed, &a);
  } else {
    ResumeIfSuspended(job, now, &a);
    if (!observed.config_map_exists) a.create_config_map = BuildConfigMap(job);
    if (!observed.network_policy_exists) {
      a.create_network_policy = BuildNetworkPolicy(job, config);
    }
    const absl::Time start = StartTime(now, &a);
    const std::vector<TaskState> tasks = ObserveTasks(job, *spec, observed, config, &a);
    const LifecycleDecision decision = DecideJob(*spec, tasks, start, now, config.restart_backoff);
    ProjectProgress(observed, &a);
    switch (decision.outcome) {
      case JobOutcome::kRunning:
        ApplyRunning(job, *spec, decision, observed, config, &a);
        SecureJob(job, *spec, observed, config, &a);
        if (!IsFinished(a.status)) GangSchedule(job, *spec, observed, config, &a);
        break;
      case JobOutcome::kSucceeded:
        WriteReplicaStatuses(decision, {}, &a);
        Succeed(job, *spec, observed, config, &a);
        break;
      case JobOutcome::kFailed:
        WriteReplicaStatuses(decision, {}, &a);
        if (decision.failure.kind == FailureKind::kDeadlineExceeded) {
          FailPastDeadline(job, *spec, decision.failure, observed, &a);
        } else {
          FailForTask(job, *spec, decision.failure, observed, &a);
        }
        break;
    }
  }
  a.status["state"] = StateOf(a.status);
  return a;
}

}  // namespace kubetrain
