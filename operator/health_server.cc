#include "operator/health_server.h"

#include <cpprest/http_listener.h>

#include "absl/strings/str_cat.h"

namespace kubetrain {

namespace http = web::http;

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address,
                                                                  std::function<bool()> ready) {
  std::unique_ptr<HealthServer> server(new HealthServer());
  server->ready_ = std::move(ready);
  server->listener_ = std::make_unique<http::experimental::listener::http_listener>(
      utility::conversions::to_string_t("http://" + address));
  HealthServer* self = server.get();
  server->listener_->support(http::methods::GET, [self](http::http_request req) {
    const std::string path = req.relative_uri().path();
    if (path == "/healthz") {
      req.reply(http::status_codes::OK, "ok");
    } else if (path == "/readyz") {
      const bool ready = self->ready_();
      req.reply(ready ? http::status_codes::OK : http::status_codes::ServiceUnavailable,
                ready ? "ok" : "not ready");
    } else {
      req.reply(http::status_codes::NotFound, "not found");
    }
  });
  try {
    server->listener_->open().wait();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve health checks on ", address, ": ", e.what()));
  }
  return server;
}

HealthServer::~HealthServer() {
  try {
    listener_->close().wait();
  } catch (const std::exception&) {
    // Already closed (or never opened): nothing to release.
  }
}

}  // namespace kubetrain
