// Desired(), per-replica judgement: every task's pod becomes a TaskState for
// the job lifecycle (core/job_lifecycle.h); a running job's decision is
// carried out here (pods recreated after their backoff, counts, conditions).
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {

namespace {

constexpr size_t kMaxReason = 512;

// What a termination says: the last line of its message (the task's one-line
// reason, or the last log line under FallbackToLogsOnError), else the
// kubelet's reason; cut at kMaxReason bytes.
std::string TerminationWhy(const ObservedPod::Termination& t) {
  std::string why;
  for (absl::string_view line : absl::StrSplit(t.message, absl::ByAnyChar("\r\n"))) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) why = std::string(line);
  }
  if (why.size() > kMaxReason) why = absl::StrCat(why.substr(0, kMaxReason), "...");
  return why;
}

// "worker-0 exited 2 (detail): why", "worker-0 exited 137 (OOMKilled; detail)".
std::string Describe(const ObservedPod& pod, const std::string& detail) {
  if (!pod.last_termination) return "";
  const ObservedPod::Termination& t = *pod.last_termination;
  const std::string why = TerminationWhy(t);
  std::vector<std::string> notes;
  if (why.empty() && !t.reason.empty()) notes.push_back(t.reason);
  if (!detail.empty()) notes.push_back(detail);
  std::string s = absl::StrCat(pod.type, "-", pod.index, " exited ", t.exit_code);
  if (!notes.empty()) absl::StrAppend(&s, " (", absl::StrJoin(notes, "; "), ")");
  if (!why.empty()) absl::StrAppend(&s, ": ", why);
  return s;
}

const ObservedPod* PodOf(const Observed& observed, const std::string& name) {
  for (const ObservedPod& p : observed.pods) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace

std::string DescribeTermination(const ObservedPod& pod) { return Describe(pod, ""); }

namespace desired_internal {

using nlohmann::json;

namespace {

// Why each restarting task stopped, "; "-joined: the lifecycle's restarts
// (pods the operator recreates, now or after their backoff) and the
// containers the kubelet holds in CrashLoopBackOff (restarted in place).
std::string RestartReasons(const JobObject& job, const LifecycleDecision& decision,
                           const Observed& observed, bool* crash_looping) {
  std::vector<std::string> why;
  for (const Restart& r : decision.restarts) {
    const ObservedPod* pod = PodOf(observed, ReplicaName(job.name, r.task.type, r.task.index));
    std::string d = pod ? DescribeTermination(*pod) : "";
    why.push_back(d.empty() ? absl::StrCat(r.task.name(), " exited ", r.exit_code) : d);
  }
  *crash_looping = false;
  for (const ObservedPod& p : observed.pods) {
    if (p.deleting || p.waiting_reason != "CrashLoopBackOff") continue;
    *crash_looping = true;
    const std::string detail = absl::StrCat("CrashLoopBackOff, ", p.restart_count,
                                            p.restart_count == 1 ? " restart" : " restarts");
    std::string d = Describe(p, detail);
    why.push_back(d.empty() ? absl::StrCat(p.type, "-", p.index, " is in ", detail) : d);
  }
  return absl::StrJoin(why, "; ");
}

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
  const PodCredentials credentials = desired_internal::PodCredentialsOf(spec, observed);
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
      a->create_pods.push_back(
          BuildPod(job, spec, ReplicaKeyOf(id.type), id.index, credentials, config));
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
    const ObservedPod* observed_pod = PodOf(observed, pod);
    const std::string why = observed_pod && observed_pod->last_termination
                                ? TerminationWhy(*observed_pod->last_termination)
                                : "";
    a->events.push_back(
        {"Warning", reason::kRestarting,
         absl::StrCat("Pod ", pod, " exited with code ", r.exit_code,
                      "; recreating it (restartPolicy ", RestartPolicyName(r.policy), ")",
                      why.empty() ? "" : ": ", why)});
  }
  if (history.empty()) a->status.erase("taskRestarts");
  WriteReplicaStatuses(decision, due, a);

  bool running = false;
  for (const auto& [key, c] : decision.replicas) running = running || c.active > 0;
  bool crash_looping = false;
  const std::string why = RestartReasons(job, decision, observed, &crash_looping);
  if (!decision.restarts.empty() || crash_looping) {
    SetCondition(&a->status, condition::kRunning, false, reason::kRestarting,
                 decision.restarts.empty() ? "a replica is being restarted in place"
                                           : "a replica is being recreated",
                 now);
    SetCondition(&a->status, condition::kRestarting, true, reason::kRestarting,
                 absl::StrCat("TrainingJob ", job.name, " is restarting a replica: ", why, "."),
                 now);
    // The kubelet's backoff ends by itself: look again to see it run.
    if (crash_looping) a->requeue_after = config.progress_interval;
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
  const ObservedPod* observed_pod = PodOf(observed, pod);
  std::string message, why;
  if (failure.kind == FailureKind::kTaskFailed) {
    why = reason::kFailed;
    message = absl::StrCat("TrainingJob ", job.name, " has failed because ",
                           ReplicaKeyOf(failure.task.type), " replica ", failure.task.index,
                           " (pod ", pod, ") exited with code ", failure.exit_code,
                           " (restartPolicy ", RestartPolicyName(failure.policy), ")");
    const std::string last = observed_pod && observed_pod->last_termination
                                 ? TerminationWhy(*observed_pod->last_termination)
                                 : "";
    absl::StrAppend(&message, last.empty() ? "" : ": ", last, ".");
  } else {
    why = reason::kBackoffLimitExceeded;
    message = absl::StrCat("TrainingJob ", job.name,
                           " has failed because it exceeded backoffLimit (", failure.backoff_limit,
                           " restarts; ", failure.restarts, " needed, the last for pod ", pod, ")");
    const std::string last = observed_pod ? DescribeTermination(*observed_pod) : "";
    absl::StrAppend(&message, last.empty() ? "" : ": ", last, ".");
  }
  Finish(condition::kFailed, why, message, observed.pods, spec.run_policy.clean_pod_policy,
         observed.now, a);
}

}  // namespace desired_internal
}  // namespace kubetrain
