// Desired(), per-replica judgement: every task's pod becomes a TaskState for
// the job lifecycle (core/job_lifecycle.h); a running job's decision is
// carried out here (pods recreated after their backoff, counts, conditions).
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {
namespace desired_internal {

using nlohmann::json;

namespace {

// The lifecycle's view of a pod. A deleted pod is being replaced: pending.
TaskState FromPod(const ObservedPod& pod, TaskState t) {
  t.in_place_restarts = pod.restart_count;
  if (pod.deleting) return t;
  if (pod.phase == "Running") {
    t.phase = TaskPhase::kRunning;
  } else if (pod.phase == "Succeeded") {
    t.phase = TaskPhase::kSucceeded;
  } else if (pod.phase == "Failed") {
    // No exit code: the pod was lost (evicted, node gone); the lifecycle counts it as 137.
    t.phase = TaskPhase::kFailed;
    t.exit_code = pod.exit_code;
    t.started = pod.started;
    t.finished = pod.exit_code ? pod.finished : absl::InfinitePast();
  }
  return t;
}

}  // namespace

std::vector<TaskState> ObserveTasks(const JobObject& job, const TrainingJob& spec,
                                    const Observed& observed, const OperatorConfig& config,
                                    Actions* a) {
  std::map<std::string, const ObservedPod*> pods;
  for (const auto& p : observed.pods) pods[p.name] = &p;
  const std::set<std::string> services(observed.services.begin(), observed.services.end());
  const json history = a->status.value("taskRestarts", json::object());
  std::set<std::string> wanted;
  std::vector<TaskState> tasks;
  for (const JobTask& id : JobTasks(spec)) {
    const std::string name = ReplicaName(job.name, id.type, id.index);
    wanted.insert(name);
    if (!services.count(name))
      a->create_services.push_back(BuildService(job, id.type, id.index, config));
    TaskState t;
    t.task = id;
    const json h = history.is_object() ? history.value(id.name(), json::object()) : json::object();
    t.restarts = h.value("restarts", 0);
    t.consecutive_failures = h.value("consecutiveFailures", 0);
    auto it = pods.find(name);
    if (it == pods.end()) {
      a->create_pods.push_back(BuildPod(job, spec, ReplicaKeyOf(id.type), id.index, config));
      tasks.push_back(t);
    } else {
      tasks.push_back(FromPod(*it->second, t));
    }
  }
  // Pods of replicas that no longer exist (scaled down).
  for (const auto& p : observed.pods) {
    if (!wanted.count(p.name) && !p.deleting) a->delete_pods.push_back(p.name);
  }
  return tasks;
}

void WriteReplicaStatuses(const LifecycleDecision& decision,
                          const std::vector<Restart>& restarting_now, Actions* a) {
  json& statuses = a->status["replicaStatuses"];
  statuses = json::object();
  for (const auto& [key, c] : decision.replicas) {
    int64_t now = 0;
    for (const Restart& r : restarting_now) now += ReplicaKeyOf(r.task.type) == key;
    statuses[key] = {{"active", c.active},
                     {"succeeded", c.succeeded},
                     {"failed", c.failed},
                     {"restarts", c.restarts + now},
                     {"recreated", c.recreated + now}};
  }
}

void ApplyRunning(const JobObject& job, const TrainingJob& spec, const LifecycleDecision& decision,
                  const Observed& observed, const OperatorConfig& config, Actions* a) {
  const absl::Time now = observed.now;
  const std::vector<Restart> due = decision.DueRestarts(now);
  json& history = a->status["taskRestarts"];
  if (!history.is_object()) history = json::object();
  for (const Restart& r : due) {
    // Deleted now, created again (same name, same TF_CONFIG) once it is gone.
    const std::string pod = ReplicaName(job.name, r.task.type, r.task.index);
    a->delete_pods.push_back(pod);
    history[r.task.name()] = {{"restarts", r.restarts},
                              {"consecutiveFailures", r.consecutive_failures}};
    a->events.push_back(
        {"Warning", reason::kRestarting,
         absl::StrCat("Pod ", pod, " exited with code ", r.exit_code,
                      "; recreating it (restartPolicy ", RestartPolicyName(r.policy), ")")});
  }
  if (history.empty()) a->status.erase("taskRestarts");
  WriteReplicaStatuses(decision, due, a);

  bool running = false;
  for (const auto& [key, c] : decision.replicas) running = running || c.active > 0;
  if (!decision.restarts.empty()) {
    SetCondition(&a->status, condition::kRunning, false, reason::kRestarting,
                 "a replica is being recreated", now);
    SetCondition(&a->status, condition::kRestarting, true, reason::kRestarting,
                 absl::StrCat("TrainingJob ", job.name, " is restarting a replica."), now);
  } else if (running) {
    SetCondition(&a->status, condition::kRestarting, false, reason::kRunning, "running", now);
    SetCondition(&a->status, condition::kRunning, true, reason::kRunning,
                 absl::StrCat("TrainingJob ", job.name, " is running."), now);
    // Progress comes from the chief, not from events: look again soon.
    a->requeue_after = config.progress_interval;
  }
  if (decision.wake_at && (!a->requeue_after || *decision.wake_at - now < *a->requeue_after)) {
    a->requeue_after = *decision.wake_at - now;
  }
}

void FailForTask(const JobObject& job, const TrainingJob& spec, const Failure& failure,
                 const Observed& observed, Actions* a) {
  const std::string pod = ReplicaName(job.name, failure.task.type, failure.task.index);
  std::string message, why;
  if (failure.kind == FailureKind::kTaskFailed) {
    why = reason::kFailed;
    message = absl::StrCat("TrainingJob ", job.name, " has failed because ",
                           ReplicaKeyOf(failure.task.type), " replica ", failure.task.index,
                           " (pod ", pod, ") exited with code ", failure.exit_code,
                           " (restartPolicy ", RestartPolicyName(failure.policy), ").");
  } else {
    why = reason::kBackoffLimitExceeded;
    message =
        absl::StrCat("TrainingJob ", job.name, " has failed because it exceeded backoffLimit (",
                     failure.backoff_limit, " restarts; ", failure.restarts,
                     " needed, the last for pod ", pod, ").");
  }
  Finish(condition::kFailed, why, message, observed.pods, spec.run_policy.clean_pod_policy,
         observed.now, a);
}

}  // namespace desired_internal
}  // namespace kubetrain
