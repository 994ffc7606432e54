// The lifecycle scenario table: the same job histories run through both
// runners, `kubetrain run`'s JobRunner (cli/job_runner_lifecycle_test.cc, fake
// processes on a fake clock) and the operator's Desired()
// (operator/desired_lifecycle_test.cc, observed pods), and each must produce
// exactly the decisions listed here. Where the runners legitimately differ
// the row says so: `operator_trace` is set, with `operator_differs_because`.
//
// A trace lists, in time order, what the runner did: "restart worker-1 @10"
// (the task was started again 10 s after the job started), then at most one
// end: "fail TaskFailed @12", "fail BackoffLimitExceeded @70",
// "fail DeadlineExceeded @60" or "succeed @30". Both adapters run with the
// same RestartBackoff (kKubeletBackoff), so restart times must agree too.
#ifndef KUBETRAIN_CORE_TESTING_LIFECYCLE_SCENARIOS_H_
#define KUBETRAIN_CORE_TESTING_LIFECYCLE_SCENARIOS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kubetrain {

struct ScenarioEvent {
  int64_t at_seconds = 0;        // since the job started
  std::string task;              // "worker-1"
  std::optional<int> exit_code;  // nullopt: the task is lost (a pod evicted; locally SIGKILL, 137)
};

struct LifecycleScenario {
  std::string name;
  // The TrainingJob object (JSON is YAML: both runners parse it with
  // ParseTrainingJob): "mnist", PS 1 (OnFailure) + Worker 2 unless the row
  // changes it.
  nlohmann::json job;
  std::vector<ScenarioEvent> events;  // time order; the chief's exit 0 reports a result
  std::vector<std::string> trace;     // both runners, unless operator_trace is set
  int64_t total_restarts = 0;         // restarts at the end, in place or by the runner
  int64_t worker_restarts = 0;        // of which Worker tasks'
  // Where the operator legitimately differs (the kubelet restarts OnFailure
  // and Always containers in place, so the operator only counts those
  // restarts, including the one it cannot prevent).
  std::optional<std::vector<std::string>> operator_trace;
  // What the operator counts instead, total and Worker (every row that sets
  // it restarts only Worker tasks).
  std::optional<int64_t> operator_total_restarts;
  std::string operator_differs_because;
};

// Every row; names are unique and usable as test names.
std::vector<LifecycleScenario> LifecycleScenarios();

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_TESTING_LIFECYCLE_SCENARIOS_H_
