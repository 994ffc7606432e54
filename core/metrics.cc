#include "core/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace kubetrain {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(bind_address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", bind_address, ": ", e.what()));
  }
  server->exposer_->RegisterCollectable(registry);
  auto ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? 0 : ports[0];
  return server;
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-4; v < 120; v *= 2.5) b.push_back(v);
  return b;
}

prometheus::Histogram::BucketBoundaries StalenessBuckets() {
  prometheus::Histogram::BucketBoundaries b = {0};
  for (double v = 1; v <= 1024; v *= 2) b.push_back(v);
  return b;
}

}  // namespace kubetrain
