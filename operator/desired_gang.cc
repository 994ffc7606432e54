// Desired(), gang scheduling (runPolicy.schedulingPolicy): the job's
// PodGroup, before its pods, and what each pod needs to be counted in it.
// Which PodGroup API follows from the pods' schedulerName
// (core/job_spec.h's GangSchedulerOf, TFJob's --gang-scheduler-name rule).
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {

using nlohmann::json;

const char* PodGroupApiVersion(GangScheduler scheduler) {
  return scheduler == GangScheduler::kVolcano ? "scheduling.volcano.sh/v1beta1"
                                              : "scheduling.x-k8s.io/v1alpha1";
}

json BuildPodGroup(const JobObject& job, const TrainingJob& spec) {
  const SchedulingPolicy& policy = *spec.run_policy.scheduling_policy;
  const GangScheduler scheduler = GangSchedulerOf(spec.scheduler_name());
  json pg_spec = {{"minMember", spec.min_available()}};
  if (scheduler == GangScheduler::kVolcano) {
    if (!policy.queue.empty()) pg_spec["queue"] = policy.queue;
    if (!policy.priority_class.empty()) pg_spec["priorityClassName"] = policy.priority_class;
  } else if (policy.schedule_timeout_seconds.has_value()) {
    pg_spec["scheduleTimeoutSeconds"] = *policy.schedule_timeout_seconds;
  }
  return {{"apiVersion", PodGroupApiVersion(scheduler)},
          {"kind", "PodGroup"},
          {"metadata",
           {{"name", PodGroupName(job.name)},
            {"namespace", job.namespace_},
            {"labels", {{kJobNameLabel, job.name}}},
            {"ownerReferences", desired_internal::OwnerReferences(job)}}},
          {"spec", pg_spec}};
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
  if (observed.pod_group_exists) {
    SetCondition(&a->status, condition::kPodGroupFailing, false, reason::kPodGroupCreated,
                 absl::StrCat("PodGroup ", PodGroupName(job.name), " exists."), observed.now);
    return;
  }
  a->create_pod_group = BuildPodGroup(job, spec);
}

}  // namespace desired_internal
}  // namespace kubetrain
