// Desired(), activeDeadlineSeconds: the lifecycle judges it against
// status.startTime; here the start is recorded and a job past its deadline
// is ended.
#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {
namespace desired_internal {

absl::Time StartTime(absl::Time now, Actions* a) {
  if (!a->status.contains("startTime")) a->status["startTime"] = Timestamp(now);
  return ParseTimestamp(a->status["startTime"]).value_or(now);
}

void FailPastDeadline(const JobObject& job, const TrainingJob& spec, const Failure& failure,
                      const Observed& observed, Actions* a) {
  // The job's time is up: its running tasks stop even with cleanPodPolicy None.
  Finish(condition::kFailed, reason::kDeadlineExceeded,
         absl::StrCat("TrainingJob ", job.name, " ran longer than activeDeadlineSeconds (",
                      failure.deadline_seconds, " s)."),
         observed.pods, spec.run_policy.clean_pod_policy == "All" ? "All" : "Running", observed.now,
         a);
}

}  // namespace desired_internal
}  // namespace kubetrain
