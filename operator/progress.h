// Live progress of a running job, read from its chief's /metrics (the same
// endpoint Prometheus scrapes) with core/job_report.h's ProgressFromMetrics,
// for status.progress and `kubectl get tj`.
#ifndef KUBETRAIN_OPERATOR_PROGRESS_H_
#define KUBETRAIN_OPERATOR_PROGRESS_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "core/job_report.h"

namespace kubetrain {

// GET http://<pod_ip>:<port>/metrics with a short timeout; nullopt on any
// failure (the chief may not be up yet, or already gone) or when the text
// has no global step yet.
std::optional<Progress> ScrapeProgress(const std::string& pod_ip, int port, absl::Duration timeout);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_PROGRESS_H_
