// Desired(), finish and cleanup: the final condition, cleanPodPolicy (after
// a grace period once the job succeeded) and ttlSecondsAfterFinished (which
// waits for PS tasks holding unsaved parameters, desired_hold.cc).
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {
namespace desired_internal {

using nlohmann::json;

std::vector<std::string> PodsToClean(const std::vector<ObservedPod>& pods,
                                     const std::string& policy) {
  std::vector<std::string> out;
  for (const auto& p : pods) {
    if (p.deleting) continue;
    const bool active = p.phase == "Running" || p.phase == "Pending" || p.phase.empty();
    if (policy == "All" || (policy == "Running" && active)) out.push_back(p.name);
  }
  return out;
}

void Finish(const char* type, const std::string& reason, const std::string& message,
            const std::vector<ObservedPod>& pods, const std::string& clean_policy, absl::Time now,
            Actions* a) {
  SetCondition(&a->status, condition::kRunning, false, reason, message, now);
  SetCondition(&a->status, condition::kRestarting, false, reason, message, now);
  SetCondition(&a->status, type, true, reason, message, now);
  a->status["completionTime"] = Timestamp(now);
  a->events.push_back(
      {std::string(type) == condition::kFailed ? "Warning" : "Normal", reason, message});
  a->delete_pods = PodsToClean(pods, clean_policy);
  a->create_pods.clear();  // a finished job starts nothing
  a->create_services.clear();
  a->create_config_map.reset();
  a->create_network_policy.reset();
  a->create_auth_secret.reset();
  a->patch_auth_secret.reset();
}

void AfterFinish(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                 const OperatorConfig& config, Actions* a) {
  const RunPolicy& policy = spec.run_policy;
  const absl::Time now = observed.now;
  const auto done_at = ParseTimestamp(a->status.value("completionTime", json()));
  // After success, PS tasks exit by themselves once the chief ends the job:
  // give them config.cleanup_grace before cleanPodPolicy removes what is left.
  const absl::Time clean_at =
      IsSucceeded(a->status) && done_at ? *done_at + config.cleanup_grace : absl::InfinitePast();
  if (now >= clean_at) {
    a->delete_pods = PodsToClean(observed.pods, policy.clean_pod_policy);
  } else {
    a->requeue_after = clean_at - now;
  }
  const bool ttl_due = policy.ttl_seconds_after_finished && done_at &&
                       now >= *done_at + absl::Seconds(*policy.ttl_seconds_after_finished);
  // The TTL stops PS tasks that may hold the only copy of the parameters
  // first, and deletes the job only once they are gone.
  const bool keep = KeepUnsavedParameters(job, spec, observed, config, ttl_due, a);
  if (ttl_due && !keep) {
    a->delete_job = true;
  } else if (policy.ttl_seconds_after_finished && done_at && !ttl_due) {
    const absl::Time due = *done_at + absl::Seconds(*policy.ttl_seconds_after_finished);
    if (!a->requeue_after || due - now < *a->requeue_after) a->requeue_after = due - now;
  }
}

}  // namespace desired_internal
}  // namespace kubetrain
