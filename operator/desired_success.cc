// Desired(), success: the lifecycle found the success policy met (the chief
// task succeeded, or every worker with AllWorkers). The chief's result goes
// into the status; cleanPodPolicy waits for the cleanup grace, so PS tasks
// can exit by themselves.
#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {
namespace desired_internal {

void Succeed(const JobObject& job, const TrainingJob& spec, const Observed& observed,
             const OperatorConfig& config, Actions* a) {
  const std::string chief = ReplicaName(job.name, spec.chief_task_type(), 0);
  for (const auto& p : observed.pods) {
    if (p.name == chief) ProjectResult(p.termination_message, observed.now, a);
  }
  Finish(condition::kSucceeded, reason::kSucceeded,
         absl::StrCat("TrainingJob ", job.name, " successfully completed."), observed.pods,
         spec.run_policy.clean_pod_policy, observed.now, a);
  a->delete_pods.clear();  // cleanPodPolicy applies after the grace period (AfterFinish)
  a->requeue_after = config.cleanup_grace;
}

}  // namespace desired_internal
}  // namespace kubetrain
