// Desired(), the chief's report in the job's status: `.status.progress` and
// `.status.result` are the camelCase projections of core/job_report.h's
// Progress and JobResult (docs/trainingjob.md, "The report"), and the PS
// tasks' checkpoint writes in the CheckpointFailing condition.
#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {
namespace desired_internal {

using nlohmann::json;

void ProjectCheckpointHealth(const Progress& p, absl::Time now, Actions* a) {
  const std::string message =
      CheckpointHealthText(p.checkpoint_failures, p.checkpoints_failing, p.checkpoint_error);
  if (SetCheckpointCondition(&a->status, p.checkpoint_failures, p.checkpoints_failing, message,
                             now)) {
    a->events.push_back({"Warning", reason::kCheckpointWriteFailed,
                         absl::StrCat("Checkpoint writes are failing: ", message,
                                      " (training goes on; spec.training.checkpoint.directory)")});
  }
}

void ProjectProgress(const Observed& observed, Actions* a) {
  if (!observed.progress) return;
  a->status["progress"] = ToJson(*observed.progress, NameStyle::kCamel);
  ProjectCheckpointHealth(*observed.progress, observed.now, a);
}

bool ProjectResult(const std::string& termination_message, absl::Time now, Actions* a) {
  if (termination_message.empty()) return false;
  const json j = json::parse(termination_message, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto result = JobResultFromJson(j);
  if (!result.ok()) return false;
  a->status["result"] = ToJson(*result, NameStyle::kCamel);
  // The final figures, for `kubectl get tj` and dashboards.
  const Progress final_progress = FinalProgress(*result);
  a->status["progress"] = ToJson(final_progress, NameStyle::kCamel);
  ProjectCheckpointHealth(final_progress, now, a);
  return true;
}

}  // namespace desired_internal
}  // namespace kubetrain
