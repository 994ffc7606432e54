// Prometheus plumbing shared by every task: a registry served on /metrics,
// and the bucket layouts kubetrain's histograms use.
#ifndef KUBETRAIN_CORE_METRICS_H_
#define KUBETRAIN_CORE_METRICS_H_

#include <memory>
#include <string>

#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace kubetrain {

class MetricsServer {
 public:
  // Serves `registry` on http://<bind_address>/metrics ("host:port"; port 0
  // picks a free one). Errors (port in use, bad address) name the address.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry);
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// 100 us .. ~100 s, for RPC and wait durations.
prometheus::Histogram::BucketBoundaries LatencyBuckets();
// 0, 1, 2, 4, ... 1024 steps, for staleness.
prometheus::Histogram::BucketBoundaries StalenessBuckets();

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_METRICS_H_
