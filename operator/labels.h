// The names and labels of everything the operator creates for a TrainingJob,
// in one place: Desired() builds objects with them, the reconciler and the
// controller select by them.
//
//   {job}-{type}-{i}   Service and Pod of task i of replica type `type`
//                      ("ps", "worker", "chief", "evaluator")
//   {job}-config       ConfigMap holding the job as trainingjob.yaml
//   {job}              PodGroup (gang scheduling: runPolicy.schedulingPolicy)
//                      and NetworkPolicy (ingress to the job's pods)
//   {job}-auth         Secret holding the job's key, task tokens and TLS files
#ifndef KUBETRAIN_OPERATOR_LABELS_H_
#define KUBETRAIN_OPERATOR_LABELS_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace kubetrain {

// On every object of a job.
inline constexpr char kJobNameLabel[] = "kubetrain.io/job-name";
// On pods and services: which task.
inline constexpr char kReplicaTypeLabel[] = "kubetrain.io/replica-type";
inline constexpr char kReplicaIndexLabel[] = "kubetrain.io/replica-index";

// The job file's name in the ConfigMap (and where it is mounted).
inline constexpr char kConfigFileName[] = "trainingjob.yaml";
// The container kubetrain injects TF_CONFIG into when a template has several.
inline constexpr const char* kTrainingContainerNames[] = {"kubetrain", "tensorflow"};

// "{job}-{type}-{index}": a task's Pod and Service.
inline std::string ReplicaName(const std::string& job, const std::string& type, int index) {
  return absl::StrCat(job, "-", type, "-", index);
}

// Gang scheduling: how a pod names its PodGroup, per scheduler.
// scheduler-plugins (coscheduling): this label on the pod.
inline constexpr char kSchedulerPluginsPodGroupLabel[] = "scheduling.x-k8s.io/pod-group";
// Volcano: this annotation, and the replica type the pod belongs to.
inline constexpr char kVolcanoGroupNameAnnotation[] = "scheduling.k8s.io/group-name";
inline constexpr char kVolcanoTaskSpecAnnotation[] = "volcano.sh/task-spec";

// "{job}": the job's PodGroup (as TFJob's).
inline std::string PodGroupName(const std::string& job) { return job; }

// "{job}-config".
inline std::string ConfigMapName(const std::string& job) { return job + "-config"; }

// "{job}-auth": the job's credentials (operator/desired.h, "Authentication").
inline std::string AuthSecretName(const std::string& job) { return job + "-auth"; }

// "token.{type}-{index}": the Secret key holding that task's token (mounted
// into its pod as the file `token`).
inline std::string TokenKey(const std::string& type, int index) {
  return absl::StrCat("token.", type, "-", index);
}
inline constexpr char kTokenKeyPrefix[] = "token.";

// On the pods that mount the job's Secret: its name. A Secret missing while
// such a pod runs was deleted from under the job (it is never regenerated).
inline constexpr char kAuthSecretAnnotation[] = "kubetrain.io/auth-secret";

// "{job}": the job's NetworkPolicy.
inline std::string NetworkPolicyName(const std::string& job) { return job; }

// The label selector of a job's objects: "kubetrain.io/job-name={job}".
inline std::string JobSelector(const std::string& job) {
  return absl::StrCat(kJobNameLabel, "=", job);
}

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_LABELS_H_
