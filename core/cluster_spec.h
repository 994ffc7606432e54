// TF_CONFIG: the cluster spec every task reads, in the JSON TensorFlow uses:
//   {"cluster": {"ps": ["h:p", ...], "worker": [...]},
//    "task": {"type": "worker", "index": 0}, "environment": "cloud"}
// `kubetrain run` and the operator both produce it; PS and worker tasks parse it.
#ifndef KUBETRAIN_CORE_CLUSTER_SPEC_H_
#define KUBETRAIN_CORE_CLUSTER_SPEC_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kubetrain {

struct TfConfig {
  // Job name ("ps", "worker", "chief", "evaluator") -> task addresses "host:port".
  std::map<std::string, std::vector<std::string>> cluster;
  std::string task_type;
  int task_index = 0;
  std::string environment = "cloud";

  const std::vector<std::string>& tasks(const std::string& job) const;
  // The address of this task in the cluster.
  std::string self_address() const;
};

// Errors say what is wrong: not JSON, missing "cluster"/"task", a job that is
// not a list of "host:port" strings, an index outside its job.
absl::StatusOr<TfConfig> ParseTfConfig(const std::string& json);

// Byte-compatible with TFJob's: keys sorted, no whitespace.
std::string SerializeTfConfig(const TfConfig& config);

// "host:port" -> port, or an error naming the address.
absl::StatusOr<int> PortOf(const std::string& address);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_CLUSTER_SPEC_H_
