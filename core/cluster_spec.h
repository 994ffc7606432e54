// TF_CONFIG: the cluster spec every task reads, in the JSON TensorFlow uses:
//   {"cluster": {"ps": ["h:p", ...], "worker": [...]},
//    "task": {"type": "worker", "index": 0}, "environment": "cloud"}
// `kubetrain run` and the operator both build it with BuildTfConfig (only the
// task addresses differ: loopback ports vs per-task Service DNS names); PS and
// worker tasks parse it.
#ifndef KUBETRAIN_CORE_CLUSTER_SPEC_H_
#define KUBETRAIN_CORE_CLUSTER_SPEC_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/job_spec.h"

namespace kubetrain {

// The port a PS task serves the bulk data plane on (ps/bulk_server.h): the
// default of kubetrain-ps --bulk_port, set by the operator in its PS pods. An
// environment variable, not a flag, so that a runtime image older than the
// operator ignores it instead of refusing to start. Workers learn the port
// from the PS itself (ShardInfo), never from the cluster spec.
inline constexpr char kBulkPortEnv[] = "KUBETRAIN_BULK_PORT";

// One task of a job: its TF_CONFIG type ("chief", "ps", "worker",
// "evaluator": the replica type lower-cased) and its index in that type.
struct JobTask {
  std::string type;
  int index = 0;

  // "worker-1": the task's name in `kubetrain run` output (pods are "{job}-worker-1").
  std::string name() const;
  bool operator==(const JobTask& o) const { return type == o.type && index == o.index; }
  bool operator<(const JobTask& o) const {
    return type != o.type ? type < o.type : index < o.index;
  }
};

// "PS" -> "ps", "Worker" -> "worker", ... (TF_CONFIG job names).
std::string TaskTypeOf(const std::string& replica_key);
// The inverse: "ps" -> "PS", "worker" -> "Worker"; "" for an unknown type.
std::string ReplicaKeyOf(const std::string& task_type);

// Every task of `job`, in the order both runners list them: Chief, PS,
// Worker, Evaluator, each by index.
std::vector<JobTask> JobTasks(const TrainingJob& job);

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

// Where a task listens, "host:port".
using TaskAddress = std::function<std::string(const JobTask& task)>;

// The one TF_CONFIG builder: every task of `job` (JobTasks) at its address,
// and `self` as this task.
TfConfig BuildTfConfig(const TrainingJob& job, const TaskAddress& address, const JobTask& self);

// Byte-compatible with TFJob's (training-operator's Go struct order):
// {"cluster":{...job names sorted...},"task":{"type":...,"index":...},"environment":...}
// with no whitespace.
std::string SerializeTfConfig(const TfConfig& config);

// "host:port" -> port, or an error naming the address.
absl::StatusOr<int> PortOf(const std::string& address);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_CLUSTER_SPEC_H_
