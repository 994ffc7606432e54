// Desired(), the chief's report in the job's status: `.status.progress` and
// `.status.result` are the camelCase projections of core/job_report.h's
// Progress and JobResult (docs/trainingjob.md, "The report").
#include "operator/desired_internal.h"

namespace kubetrain {
namespace desired_internal {

using nlohmann::json;

void ProjectProgress(const Observed& observed, Actions* a) {
  if (observed.progress) a->status["progress"] = ToJson(*observed.progress, NameStyle::kCamel);
}

bool ProjectResult(const std::string& termination_message, Actions* a) {
  if (termination_message.empty()) return false;
  const json j = json::parse(termination_message, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto result = JobResultFromJson(j);
  if (!result.ok()) return false;
  a->status["result"] = ToJson(*result, NameStyle::kCamel);
  // The final figures, for `kubectl get tj` and dashboards.
  a->status["progress"] = ToJson(FinalProgress(*result), NameStyle::kCamel);
  return true;
}

}  // namespace desired_internal
}  // namespace kubetrain
