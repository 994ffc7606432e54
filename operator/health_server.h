// The operator's probe endpoints over HTTP: /healthz answers 200 while the
// process serves; /readyz answers 200 only while `ready()` holds (it leads,
// if electing, and its watches have listed once), else 503. Anything else is
// 404. For the Deployment's liveness and readiness probes.
#ifndef KUBETRAIN_OPERATOR_HEALTH_SERVER_H_
#define KUBETRAIN_OPERATOR_HEALTH_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace web::http::experimental::listener {
class http_listener;
}  // namespace web::http::experimental::listener

namespace kubetrain {

class HealthServer {
 public:
  // Serves on `address` ("host:port") until destroyed. `ready` is called from
  // the server's threads: it must be thread-safe.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address,
                                                             std::function<bool()> ready);
  ~HealthServer();

 private:
  HealthServer() = default;
  std::function<bool()> ready_;
  std::unique_ptr<web::http::experimental::listener::http_listener> listener_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_HEALTH_SERVER_H_
