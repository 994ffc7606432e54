// Desired(), gang scheduling (runPolicy.schedulingPolicy): the job's
// PodGroup, before its pods, kept as the job asks while it runs, and what
// each pod needs to be counted in it.
// Which PodGroup API follows from the pods' schedulerName
// (core/job_spec.h's GangSchedulerOf, TFJob's --gang-scheduler-name rule).
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/quantity.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {

using nlohmann::json;

const char* PodGroupApiVersion(GangScheduler scheduler) {
  return scheduler == GangScheduler::kVolcano ? "scheduling.volcano.sh/v1beta1"
                                              : "scheduling.x-k8s.io/v1alpha1";
}

namespace {

// A pod's request per resource (milli-units) as the scheduler counts it: the
// sum over its containers (each resource's request, else its limit, as the
// API server defaults a request to the limit), or the largest init
// container's if that is more. A quantity that does not parse is left out:
// the API server refuses that pod, naming it.
std::map<std::string, int64_t> PodRequests(const json& pod_spec) {
  auto container_requests = [](const json& c) {
    std::map<std::string, int64_t> out;
    for (const char* kind : {"limits", "requests"}) {  // requests win
      const json r = c.value("resources", json::object()).value(kind, json::object());
      if (!r.is_object()) continue;
      for (const auto& [name, q] : r.items()) {
        absl::StatusOr<int64_t> milli =
            ParseQuantityMilli(q.is_string() ? q.get<std::string>() : q.dump());
        if (milli.ok()) out[name] = *milli;
      }
    }
    return out;
  };
  std::map<std::string, int64_t> sum;
  for (const json& c : pod_spec.value("containers", json::array())) {
    for (const auto& [name, milli] : container_requests(c)) sum[name] += milli;
  }
  for (const json& c : pod_spec.value("initContainers", json::array())) {
    for (const auto& [name, milli] : container_requests(c)) {
      sum[name] = std::max(sum[name], milli);
    }
  }
  return sum;
}

}  // namespace

json MinResources(const JobObject& job, const TrainingJob& spec) {
  const SchedulingPolicy& policy = *spec.run_policy.scheduling_policy;
  json out = json::object();
  if (!policy.min_resources.empty()) {
    for (const auto& [name, quantity] : policy.min_resources) out[name] = quantity;
    return out;
  }
  // The tasks a gang of minAvailable is made of: the PS tasks first (no
  // worker makes progress without them), then the chief and the workers.
  int left = spec.min_available();
  std::map<std::string, int64_t> total;
  for (const char* type : {"PS", "Chief", "Worker", "Evaluator"}) {
    auto it = spec.replica_specs.find(type);
    if (it == spec.replica_specs.end() || left <= 0) continue;
    const int n = std::min(left, it->second.replicas);
    left -= n;
    const json tmpl =
        desired_internal::RawReplicaSpec(job.object, type).value("template", json::object());
    for (const auto& [name, milli] : PodRequests(tmpl.value("spec", json::object()))) {
      total[name] += milli * n;
    }
  }
  for (const auto& [name, milli] : total) out[name] = FormatQuantityMilli(milli);
  return out;
}

json BuildPodGroup(const JobObject& job, const TrainingJob& spec) {
  const SchedulingPolicy& policy = *spec.run_policy.scheduling_policy;
  const GangScheduler scheduler = GangSchedulerOf(spec.scheduler_name());
  json pg_spec = {{"minMember", spec.min_available()}};
  json min_resources = MinResources(job, spec);
  if (!min_resources.empty()) pg_spec["minResources"] = std::move(min_resources);
  if (scheduler == GangScheduler::kVolcano) {
    if (!policy.queue.empty()) pg_spec["queue"] = policy.queue;
    if (!policy.priority_class.empty()) pg_spec["priorityClassName"] = policy.priority_class;
  } else if (policy.schedule_timeout_seconds.has_value()) {
    pg_spec["scheduleTimeoutSeconds"] = *policy.schedule_timeout_seconds;
  }
  return {{"apiVersion", PodGroupApiVersion(scheduler)},
          {"kind", "PodGroup"},
          {"metadata", desired_internal::JobObjectMetadata(job, PodGroupName(job.name))},
          {"spec", pg_spec}};
}

json PodGroupSpecPatch(const json& desired, const json& observed) {
  json patch = json::object();
  const json seen = observed.is_object() ? observed : json::object();
  for (const auto& [key, want] : desired.items()) {
    if (seen.contains(key) && seen[key] == want) continue;
    json value = want;
    // A merge patch merges objects: what minResources no longer has goes.
    if (want.is_object() && seen.contains(key) && seen[key].is_object()) {
      for (const auto& had : seen[key].items()) {
        if (!want.contains(had.key())) value[had.key()] = nullptr;
      }
    }
    patch[key] = value;
  }
  for (const char* key : {"minResources", "scheduleTimeoutSeconds"}) {
    if (seen.contains(key) && !desired.contains(key)) patch[key] = nullptr;
  }
  return patch;
}

namespace desired_internal {

void DecorateGangPod(const JobObject& job, const TrainingJob& spec, const std::string& type,
                     json* labels, json* annotations, json* pod_spec) {
  if (!spec.run_policy.scheduling_policy.has_value()) return;
  const std::string scheduler_name = spec.scheduler_name();
  if (pod_spec->value("schedulerName", "").empty()) (*pod_spec)["schedulerName"] = scheduler_name;
  const std::string& priority = spec.run_policy.scheduling_policy->priority_class;
  if (!priority.empty() && pod_spec->value("priorityClassName", "").empty()) {
    (*pod_spec)["priorityClassName"] = priority;
  }
  if (GangSchedulerOf(scheduler_name) == GangScheduler::kVolcano) {
    (*annotations)[kVolcanoGroupNameAnnotation] = PodGroupName(job.name);
    (*annotations)[kVolcanoTaskSpecAnnotation] = type;
  } else {
    (*labels)[kSchedulerPluginsPodGroupLabel] = PodGroupName(job.name);
  }
}

void GangSchedule(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                  const OperatorConfig& config, Actions* a) {
  if (!spec.run_policy.scheduling_policy.has_value()) return;
  if (!observed.pod_group_blocked.empty()) {
    // Pods without their PodGroup would be placed one by one (or not at
    // all), which is what the gang was asked to prevent: they wait.
    a->create_pods.clear();
    const std::string message =
        absl::StrCat("PodGroup ", PodGroupName(job.name), " (",
                     PodGroupApiVersion(GangSchedulerOf(spec.scheduler_name())),
                     ") cannot be created, so no pod is: ", observed.pod_group_blocked,
                     "; retrying every ", absl::FormatDuration(config.pod_group_retry));
    if (!IsConditionTrue(a->status, condition::kPodGroupFailing)) {
      a->events.push_back({"Warning", observed.pod_group_blocked_reason, message});
    }
    SetCondition(&a->status, condition::kPodGroupFailing, true, observed.pod_group_blocked_reason,
                 message, observed.now);
    if (!a->requeue_after || config.pod_group_retry < *a->requeue_after) {
      a->requeue_after = config.pod_group_retry;
    }
    return;
  }
  if (!observed.pod_group_exists) {
    // New, or deleted by someone: (again) before any pod still to create.
    a->create_pod_group = BuildPodGroup(job, spec);
    return;
  }
  SetCondition(&a->status, condition::kPodGroupFailing, false, reason::kPodGroupCreated,
               absl::StrCat("PodGroup ", PodGroupName(job.name), " exists."), observed.now);
  if (observed.pod_group_spec) {
    json want = BuildPodGroup(job, spec);
    json patch = PodGroupSpecPatch(want["spec"], *observed.pod_group_spec);
    if (!patch.empty()) {
      a->patch_pod_group = {
          {"apiVersion", want["apiVersion"]},
          {"metadata",
           {{"name", want["metadata"]["name"]}, {"namespace", want["metadata"]["namespace"]}}},
          {"spec", std::move(patch)}};
    }
  }
}

}  // namespace desired_internal
}  // namespace kubetrain
