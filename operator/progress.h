// Live progress of a running job, read from its chief's /metrics (the same
// endpoint Prometheus scrapes), for status.progress and `kubectl get tj`.
#ifndef KUBETRAIN_OPERATOR_PROGRESS_H_
#define KUBETRAIN_OPERATOR_PROGRESS_H_

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"

namespace kubetrain {

// From Prometheus text: {"globalStep", "loss", "accuracy" (once evaluated)};
// nullopt if the text has no kubetrain_global_step.
std::optional<nlohmann::json> ParseProgress(const std::string& metrics_text);

// GET http://<pod_ip>:<port>/metrics with a short timeout; nullopt on any failure.
std::optional<nlohmann::json> ScrapeProgress(const std::string& pod_ip, int port, absl::Duration timeout);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_PROGRESS_H_
