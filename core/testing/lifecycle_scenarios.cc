#include "core/testing/lifecycle_scenarios.h"

namespace kubetrain {
namespace {

using nlohmann::json;

constexpr char kInPlace[] =
    "the kubelet restarts OnFailure/Always containers in place (same pod); the operator does not "
    "restart them, it counts the restarts (pod restartCount) toward backoffLimit";

struct JobOptions {
  std::string worker_policy = "Never";
  std::optional<int> backoff_limit;
  std::optional<int> deadline_seconds;
  std::string success_policy;
  bool chief = false;
  bool evaluator = false;
};

json Job(const JobOptions& o) {
  json replicas = {{"PS", {{"replicas", 1}, {"restartPolicy", "OnFailure"}}},
                   {"Worker", {{"replicas", 2}, {"restartPolicy", o.worker_policy}}}};
  if (o.chief) replicas["Chief"] = {{"replicas", 1}};
  if (o.evaluator) replicas["Evaluator"] = {{"replicas", 1}};
  json spec = {{"replicaSpecs", replicas},
               {"training", {{"model", {{"type", "softmax"}}}, {"steps", 100}}}};
  json run_policy = json::object();
  if (o.backoff_limit) run_policy["backoffLimit"] = *o.backoff_limit;
  if (o.deadline_seconds) run_policy["activeDeadlineSeconds"] = *o.deadline_seconds;
  if (!run_policy.empty()) spec["runPolicy"] = run_policy;
  if (!o.success_policy.empty()) spec["successPolicy"] = o.success_policy;
  return {{"apiVersion", "kubetrain.io/v1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", "mnist"}, {"namespace", "default"}}},
          {"spec", spec}};
}

JobOptions Policy(const std::string& worker_policy) {
  JobOptions o;
  o.worker_policy = worker_policy;
  return o;
}

}  // namespace

std::vector<LifecycleScenario> LifecycleScenarios() {
  std::vector<LifecycleScenario> rows;
  auto add = [&](LifecycleScenario s) { rows.push_back(std::move(s)); };

  add({"NeverFailsTheJob", Job(Policy("Never")), {{10, "worker-1", 2}}, {"fail TaskFailed @10"}});
  add({"ExitCodeRestartsAKilledTask",
       Job(Policy("ExitCode")),
       {{10, "worker-1", 137}, {30, "worker-0", 0}},
       {"restart worker-1 @10", "succeed @30"},
       1,
       1});
  add({"ExitCodeErrorIsPermanent",
       Job(Policy("ExitCode")),
       {{10, "worker-0", 1}},
       {"fail TaskFailed @10"}});
  add({"ALostTaskCountsAs137",
       Job(Policy("ExitCode")),
       {{10, "worker-1", std::nullopt}, {30, "worker-0", 0}},
       {"restart worker-1 @10", "succeed @30"},
       1,
       1});
  add({"ALostTaskUnderNeverFails",
       Job(Policy("Never")),
       {{10, "worker-1", std::nullopt}},
       {"fail TaskFailed @10"}});
  {
    JobOptions o = Policy("ExitCode");
    o.backoff_limit = 1;
    add({"BackoffLimitAllowsThatManyRestarts",
         Job(o),
         {{10, "worker-1", 137}, {70, "worker-1", 137}},
         {"restart worker-1 @10", "fail BackoffLimitExceeded @70"},
         1,
         1});
    o.backoff_limit = 0;
    add({"BackoffLimitZeroFailsTheFirstRestart",
         Job(o),
         {{10, "worker-0", 143}},
         {"fail BackoffLimitExceeded @10"}});
  }
  // Delays 0, 10 s, 20 s (kKubeletBackoff): each failure 10 s or less into its run.
  add({"RestartsBackOffLikeTheKubelet",
       Job(Policy("ExitCode")),
       {{10, "worker-1", 137}, {20, "worker-1", 137}, {40, "worker-1", 137}, {100, "worker-0", 0}},
       {"restart worker-1 @10", "restart worker-1 @30", "restart worker-1 @60", "succeed @100"},
       3,
       3});
  {
    LifecycleScenario s{"OnFailureRestartsAnyFailure",
                        Job(Policy("OnFailure")),
                        {{10, "worker-1", 1}, {20, "worker-1", 1}, {100, "worker-0", 0}},
                        {"restart worker-1 @10", "restart worker-1 @30", "succeed @100"},
                        2,
                        2};
    s.operator_trace = std::vector<std::string>{"succeed @100"};
    s.operator_differs_because = kInPlace;
    add(s);
  }
  {
    JobOptions o = Policy("OnFailure");
    o.backoff_limit = 1;
    LifecycleScenario s{"InPlaceRestartsCountTowardTheLimit",
                        Job(o),
                        {{10, "worker-1", 1}, {70, "worker-1", 1}},
                        {"restart worker-1 @10", "fail BackoffLimitExceeded @70"},
                        1,
                        1};
    s.operator_trace = std::vector<std::string>{"fail BackoffLimitExceeded @70"};
    s.operator_total_restarts = 2;  // the kubelet already did the second restart
    s.operator_differs_because = kInPlace;
    add(s);
  }
  {
    LifecycleScenario s{"PsOnFailureRestarts",
                        Job(Policy("Never")),
                        {{10, "ps-0", 137}, {40, "worker-0", 0}},
                        {"restart ps-0 @10", "succeed @40"},
                        1,
                        0};
    s.operator_trace = std::vector<std::string>{"succeed @40"};
    s.operator_differs_because = kInPlace;
    add(s);
  }
  {
    JobOptions o;
    o.deadline_seconds = 60;
    add({"DeadlineIsATimer", Job(o), {}, {"fail DeadlineExceeded @60"}});
    add({"DeadlineComesBeforeALateSuccess",
         Job(o),
         {{60, "worker-0", 0}},
         {"fail DeadlineExceeded @60"}});
  }
  {
    JobOptions o;
    o.success_policy = "AllWorkers";
    add({"AllWorkersWaitsForEveryWorker",
         Job(o),
         {{10, "worker-0", 0}, {20, "worker-1", 0}},
         {"succeed @20"}});
  }
  {
    JobOptions o;
    o.chief = true;
    add({"TheChiefReplicaDecidesSuccess",
         Job(o),
         {{10, "worker-0", 0}, {20, "worker-1", 0}, {30, "chief-0", 0}},
         {"succeed @30"}});
  }
  add({"AFailureOutweighsTheChiefsSuccess",
       Job(Policy("Never")),
       {{10, "worker-0", 0}, {10, "worker-1", 1}},
       {"fail TaskFailed @10"}});
  {
    JobOptions o;
    o.evaluator = true;
    add({"AnEvaluatorFailureFailsTheJob",
         Job(o),
         {{10, "evaluator-0", 1}},
         {"fail TaskFailed @10"}});
  }
  {
    LifecycleScenario s{
        "AlwaysAndTheChiefsSuccess", Job(Policy("Always")), {{10, "worker-0", 0}}, {"succeed @10"}};
    s.operator_trace = std::vector<std::string>{};
    s.operator_total_restarts = 1;
    s.operator_differs_because =
        "with Always the kubelet restarts a container even after exit 0, so the chief's pod never "
        "reaches Succeeded (as in TFJob); locally Always acts as OnFailure";
    add(s);
  }
  return rows;
}

}  // namespace kubetrain
