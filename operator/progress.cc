#include "operator/progress.h"

#include <sstream>

#include <cpprest/http_client.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {

std::optional<nlohmann::json> ParseProgress(const std::string& text) {
  nlohmann::json p = nlohmann::json::object();
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string name = line.substr(0, space);
    double v = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &v)) continue;
    if (name == "kubetrain_global_step") p["globalStep"] = static_cast<int64_t>(v);
    if (name == "kubetrain_training_loss") p["loss"] = v;
    if (name == "kubetrain_eval_accuracy" && v > 0) p["accuracy"] = v;
  }
  if (!p.contains("globalStep")) return std::nullopt;
  return p;
}

std::optional<nlohmann::json> ScrapeProgress(const std::string& pod_ip, int port, absl::Duration timeout) {
  try {
    web::http::client::http_client_config config;
    config.set_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    web::http::client::http_client client(absl::StrCat("http://", pod_ip, ":", port), config);
    auto response = client.request(web::http::methods::GET, "/metrics").get();
    if (response.status_code() != web::http::status_codes::OK) return std::nullopt;
    return ParseProgress(response.extract_string().get());
  } catch (const std::exception&) {
    return std::nullopt;  // the chief may not be up yet, or already gone
  }
}

}  // namespace kubetrain
