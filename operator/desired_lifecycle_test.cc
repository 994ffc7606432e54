// The lifecycle scenario table (core/testing/lifecycle_scenarios.h) through
// Desired(): a small simulation of the cluster around it. Each reconcile's
// Actions are applied (deleted pods vanish, created pods run at once); a task
// ending per the table becomes its pod's state, as the kubelet reports it
// (Never/ExitCode pods: phase Failed/Succeeded with the exit code; OnFailure/
// Always containers: restarted in place, restartCount + 1; a lost pod:
// Failed with no container state). Reconciles happen at every event and
// whenever Desired() asks to be requeued. cli/job_runner_lifecycle_test.cc
// runs the same table through `kubetrain run`'s driver.
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/testing/lifecycle_scenarios.h"
#include "operator/desired.h"
#include "operator/status.h"

namespace kubetrain {
namespace {

using nlohmann::json;

const absl::Time kStart = absl::FromUnixSeconds(1800000000);

class ClusterSim {
 public:
  explicit ClusterSim(const json& object) {
    job_.name = object["metadata"]["name"];
    job_.namespace_ = object["metadata"]["namespace"];
    job_.uid = "uid-1";
    job_.generation = 1;
    job_.object = object;
    spec_ = *ParseTrainingJob(object.dump());
    config_.restart_backoff = kKubeletBackoff;
  }

  // One round of reconciles at `now` (until nothing more is created or
  // deleted, as the watch would trigger them); returns the requeue.
  std::optional<absl::Duration> Reconcile(absl::Time now) {
    std::optional<absl::Duration> requeue;
    for (int round = 0; round < 5; ++round) {
      Observed o;
      o.now = now;
      for (const auto& [name, pod] : pods_) o.pods.push_back(pod);
      o.services.assign(services_.begin(), services_.end());
      o.config_map_exists = config_map_;
      o.auth_secret = secret_;
      job_.status = status_;
      const bool was_finished = IsFinished(status_);
      Actions a = Desired(job_, o, OperatorConfig(config_));
      const std::string at = absl::StrCat(" @", absl::ToInt64Seconds(now - kStart));
      for (const std::string& name : a.delete_pods) {
        auto it = pods_.find(name);
        if (!IsFinished(a.status) && it != pods_.end() && it->second.phase == "Failed") {
          trace_.push_back(absl::StrCat("restart ", it->second.type, "-", it->second.index, at));
        }
        pods_.erase(name);
      }
      for (const json& p : a.create_pods) {
        ObservedPod pod;
        pod.name = p["metadata"]["name"];
        pod.type = p["metadata"]["labels"][kReplicaTypeLabel];
        pod.index = std::stoi(p["metadata"]["labels"][kReplicaIndexLabel].get<std::string>());
        pod.phase = "Running";  // scheduled and started at once
        pod.started = now;
        pod.uses_auth_secret = p.value("/metadata/annotations"_json_pointer, json::object())
                                   .contains(kAuthSecretAnnotation);
        pods_[pod.name] = pod;
      }
      for (const json& svc : a.create_services)
        services_.insert(svc["metadata"]["name"].get<std::string>());
      if (a.create_config_map) config_map_ = true;
      if (a.create_auth_secret) {  // what the apply layer makes of the request
        secret_ = Observed::AuthSecret{std::string(64, 'f'), {kJobKeyFile}};
        for (const JobTask& t : a.create_auth_secret->token_tasks)
          secret_->keys.insert(TokenKey(t.type, t.index));
      }
      status_ = a.status;
      if (!was_finished && IsFinished(status_)) {
        const json* c = FindCondition(
            status_, IsSucceeded(status_) ? condition::kSucceeded : condition::kFailed);
        const std::string reason = (*c)["reason"];
        trace_.push_back(
            IsSucceeded(status_)
                ? "succeed" + at
                : absl::StrCat("fail ", reason == reason::kFailed ? "TaskFailed" : reason, at));
      }
      requeue = a.requeue_after;
      if (a.create_pods.empty() && a.delete_pods.empty() && !a.create_auth_secret) break;
    }
    return requeue;
  }

  // The task ends at `now` as the kubelet would report it.
  void End(const ScenarioEvent& e, absl::Time now) {
    ObservedPod* pod = nullptr;
    for (auto& [name, p] : pods_) {
      if (absl::StrCat(p.type, "-", p.index) == e.task) pod = &p;
    }
    ASSERT_NE(pod, nullptr) << e.task << " has no pod";
    if (!e.exit_code) {  // lost: evicted, its node gone
      pod->phase = "Failed";
      return;
    }
    const RestartPolicy policy = spec_.replica_specs.at(ReplicaKeyOf(pod->type)).restart_policy;
    const bool in_place = policy == RestartPolicy::kAlways ||
                          (policy == RestartPolicy::kOnFailure && *e.exit_code != 0);
    if (in_place) {
      ++pod->restart_count;  // the kubelet restarted the container; the pod keeps running
      return;
    }
    pod->phase = *e.exit_code == 0 ? "Succeeded" : "Failed";
    pod->exit_code = *e.exit_code;
    pod->finished = now;
    if (*e.exit_code == 0 && spec_.IsChiefTask(pod->type, pod->index)) {
      JobResult r;
      r.status = "Succeeded";
      r.global_step = 100;
      pod->termination_message = ToJson(r).dump();
    }
  }

  const std::vector<std::string>& trace() const { return trace_; }
  const json& status() const { return status_; }

 private:
  JobObject job_;
  TrainingJob spec_;
  OperatorConfig config_;
  json status_ = json::object();
  std::map<std::string, ObservedPod> pods_;
  std::set<std::string> services_;
  bool config_map_ = false;
  std::optional<Observed::AuthSecret> secret_;
  std::vector<std::string> trace_;
};

class DesiredLifecycleTest : public ::testing::TestWithParam<LifecycleScenario> {};

TEST_P(DesiredLifecycleTest, DecidesAsTheTableSays) {
  const LifecycleScenario& s = GetParam();
  ClusterSim sim(s.job);
  // Reconcile at every event and at every requeue, until the job is over or
  // 15 minutes after the last event.
  const absl::Time last = kStart + absl::Seconds(s.events.empty() ? 0 : s.events.back().at_seconds);
  absl::Time now = kStart;
  size_t next = 0;
  std::optional<absl::Duration> requeue = sim.Reconcile(now);
  while (!IsFinished(sim.status()) && now < last + absl::Minutes(15)) {
    absl::Time wake = requeue ? now + *requeue : absl::InfiniteFuture();
    if (next < s.events.size())
      wake = std::min(wake, kStart + absl::Seconds(s.events[next].at_seconds));
    if (wake == absl::InfiniteFuture()) break;
    now = wake;
    while (next < s.events.size() && kStart + absl::Seconds(s.events[next].at_seconds) == now) {
      sim.End(s.events[next++], now);
    }
    requeue = sim.Reconcile(now);
  }
  EXPECT_EQ(sim.trace(), s.operator_trace.value_or(s.trace)) << s.operator_differs_because;
  int64_t total = 0;
  for (const auto& [key, rs] : sim.status()["replicaStatuses"].items())
    total += rs["restarts"].get<int64_t>();
  EXPECT_EQ(total, s.operator_total_restarts.value_or(s.total_restarts));
  EXPECT_EQ(sim.status()["replicaStatuses"]["Worker"]["restarts"],
            s.operator_total_restarts.value_or(s.worker_restarts));
}

INSTANTIATE_TEST_SUITE_P(Table, DesiredLifecycleTest, ::testing::ValuesIn(LifecycleScenarios()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kubetrain
