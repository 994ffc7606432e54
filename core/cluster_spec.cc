#include "core/cluster_spec.h"

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {

using nlohmann::json;

const std::vector<std::string>& TfConfig::tasks(const std::string& job) const {
  static const std::vector<std::string>* const kEmpty = new std::vector<std::string>();
  auto it = cluster.find(job);
  return it == cluster.end() ? *kEmpty : it->second;
}

std::string TfConfig::self_address() const {
  const auto& t = tasks(task_type);
  return task_index >= 0 && task_index < static_cast<int>(t.size()) ? t[task_index] : "";
}

absl::StatusOr<int> PortOf(const std::string& address) {
  auto colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG: address \"", address, "\" is not host:port"));
  }
  return port;
}

absl::StatusOr<TfConfig> ParseTfConfig(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("TF_CONFIG: not a JSON object");
  }
  TfConfig config;
  auto cluster = doc.find("cluster");
  if (cluster == doc.end() || !cluster->is_object()) {
    return absl::InvalidArgumentError("TF_CONFIG: missing object \"cluster\"");
  }
  for (auto& [job, addresses] : cluster->items()) {
    if (!addresses.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TF_CONFIG: cluster.", job, " must be a list of \"host:port\""));
    }
    auto& out = config.cluster[job];
    for (auto& a : addresses) {
      if (!a.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TF_CONFIG: cluster.", job, " has a non-string address"));
      }
      auto port = PortOf(a.get<std::string>());
      if (!port.ok()) return port.status();
      out.push_back(a.get<std::string>());
    }
  }
  auto task = doc.find("task");
  if (task == doc.end() || !task->is_object()) {
    return absl::InvalidArgumentError("TF_CONFIG: missing object \"task\"");
  }
  auto type = task->find("type");
  auto index = task->find("index");
  if (type == task->end() || !type->is_string()) {
    return absl::InvalidArgumentError("TF_CONFIG: task.type must be a string");
  }
  config.task_type = type->get<std::string>();
  if (index != task->end()) {
    if (!index->is_number_integer()) {
      return absl::InvalidArgumentError("TF_CONFIG: task.index must be an integer");
    }
    config.task_index = index->get<int>();
  }
  if (config.task_index < 0 ||
      config.task_index >= static_cast<int>(config.tasks(config.task_type).size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TF_CONFIG: task ", config.task_type, ":", config.task_index, " is not in cluster.",
        config.task_type, " (", config.tasks(config.task_type).size(), " tasks)"));
  }
  auto env = doc.find("environment");
  if (env != doc.end() && env->is_string()) config.environment = env->get<std::string>();
  return config;
}

std::string SerializeTfConfig(const TfConfig& config) {
  // nlohmann::json objects are std::map-backed: keys come out sorted.
  json doc;
  doc["cluster"] = json::object();
  for (const auto& [job, addresses] : config.cluster) doc["cluster"][job] = addresses;
  doc["task"] = {{"type", config.task_type}, {"index", config.task_index}};
  if (!config.environment.empty()) doc["environment"] = config.environment;
  return doc.dump();
}

}  // namespace kubetrain
