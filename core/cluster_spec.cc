#include "core/cluster_spec.h"

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {

using nlohmann::json;

const std::vector<std::string>& TfConfig::tasks(const std::string& job) const {
  static const std::vector<std::string>* const kEmpty = new std::vector<std::string>();
  auto it = cluster.find(job);
  return it == cluster.end() ? *kEmpty : it->second;
}

std::string JobTask::name() const { return absl::StrCat(type, "-", index); }

namespace {
// Replica spec keys in the order tasks are listed, with their TF_CONFIG types.
constexpr std::pair<const char*, const char*> kReplicaTypes[] = {
    {"Chief", "chief"}, {"PS", "ps"}, {"Worker", "worker"}, {"Evaluator", "evaluator"}};
}  // namespace

std::string TaskTypeOf(const std::string& replica_key) {
  for (const auto& [key, type] : kReplicaTypes) {
    if (replica_key == key) return type;
  }
  return absl::AsciiStrToLower(replica_key);
}

std::string ReplicaKeyOf(const std::string& task_type) {
  for (const auto& [key, type] : kReplicaTypes) {
    if (task_type == type) return key;
  }
  return "";
}

std::vector<JobTask> JobTasks(const TrainingJob& job) {
  std::vector<JobTask> tasks;
  for (const auto& [key, type] : kReplicaTypes) {
    auto it = job.replica_specs.find(key);
    if (it == job.replica_specs.end()) continue;
    for (int i = 0; i < it->second.replicas; ++i) tasks.push_back({type, i});
  }
  return tasks;
}

TfConfig BuildTfConfig(const TrainingJob& job, const TaskAddress& address, const JobTask& self) {
  TfConfig tf;
  for (const JobTask& t : JobTasks(job)) tf.cluster[t.type].push_back(address(t));
  tf.task_type = self.type;
  tf.task_index = self.index;
  return tf;
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
  // TFJob marshals a Go struct {Cluster, Task{Type, Index}, Environment}: its
  // fields in that order, the cluster map's keys sorted (std::map order).
  nlohmann::ordered_json doc;
  doc["cluster"] = nlohmann::ordered_json::object();
  for (const auto& [job, addresses] : config.cluster) doc["cluster"][job] = addresses;
  doc["task"]["type"] = config.task_type;
  doc["task"]["index"] = config.task_index;
  doc["environment"] = config.environment;
  return doc.dump();
}

}  // namespace kubetrain
