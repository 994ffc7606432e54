#include "operator/progress.h"

#include <cpprest/http_client.h>

#include "absl/strings/str_cat.h"

namespace kubetrain {

std::optional<std::string> ScrapeMetrics(const std::string& pod_ip, int port,
                                         absl::Duration timeout) {
  try {
    web::http::client::http_client_config config;
    config.set_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    web::http::client::http_client client(absl::StrCat("http://", pod_ip, ":", port), config);
    auto response = client.request(web::http::methods::GET, "/metrics").get();
    if (response.status_code() != web::http::status_codes::OK) return std::nullopt;
    return response.extract_string().get();
  } catch (const std::exception&) {
    return std::nullopt;  // the task may not be up yet, or already gone
  }
}

}  // namespace kubetrain
