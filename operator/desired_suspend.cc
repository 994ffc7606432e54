// Desired(), suspend and resume (runPolicy.suspend): a suspended job keeps
// its object but none of its pods; resuming starts it afresh, and its
// activeDeadlineSeconds counts from the resume.
#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {
namespace desired_internal {

void Suspend(const JobObject& job, const Observed& observed, Actions* a) {
  for (const auto& p : observed.pods) {
    if (!p.deleting) a->delete_pods.push_back(p.name);
  }
  const std::string message = absl::StrCat("TrainingJob ", job.name, " is suspended.");
  if (!IsConditionTrue(a->status, condition::kSuspended)) {
    a->events.push_back({"Normal", reason::kSuspended, message});
  }
  SetCondition(&a->status, condition::kRunning, false, reason::kSuspended, "suspended",
               observed.now);
  SetCondition(&a->status, condition::kRestarting, false, reason::kSuspended, "suspended",
               observed.now);
  SetCondition(&a->status, condition::kSuspended, true, reason::kSuspended, message, observed.now);
  a->status.erase("startTime");  // the deadline counts from the resume
}

void ResumeIfSuspended(const JobObject& job, absl::Time now, Actions* a) {
  if (!IsConditionTrue(a->status, condition::kSuspended)) return;
  const std::string message = absl::StrCat("TrainingJob ", job.name, " is resumed.");
  SetCondition(&a->status, condition::kSuspended, false, reason::kResumed, message, now);
  a->events.push_back({"Normal", reason::kResumed, message});
}

}  // namespace desired_internal
}  // namespace kubetrain
