// A task's /metrics (the same endpoint Prometheus scrapes), read by the
// operator: the chief's for live progress (core/job_report.h's
// ProgressFromMetrics, for status.progress and `kubectl get tj`), and those of
// PS tasks being stopped after a failed job, to see whether they hold
// parameters that could not be saved (kHoldingUnsavedParametersMetric).
#ifndef KUBETRAIN_OPERATOR_PROGRESS_H_
#define KUBETRAIN_OPERATOR_PROGRESS_H_

#include <optional>
#include <string>

#include "absl/time/time.h"

namespace kubetrain {

// The text of GET http://<pod_ip>:<port>/metrics, with a short timeout;
// nullopt on any failure (the task may not be up yet, or already gone).
std::optional<std::string> ScrapeMetrics(const std::string& pod_ip, int port,
                                         absl::Duration timeout);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_PROGRESS_H_
