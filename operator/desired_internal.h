// Desired()'s parts, one file per concern. Internal to operator/desired*.cc:
// every function is pure (no I/O, no clock reads) and changes only the
// Actions it is given.
#ifndef KUBETRAIN_OPERATOR_DESIRED_INTERNAL_H_
#define KUBETRAIN_OPERATOR_DESIRED_INTERNAL_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job_lifecycle.h"
#include "core/job_spec.h"
#include "operator/desired.h"

namespace kubetrain {
namespace desired_internal {

// desired_finish.cc: the end of a job and what comes after it.
// Pods to delete per cleanPodPolicy ("All", "Running": running and pending, "None").
std::vector<std::string> PodsToClean(const std::vector<ObservedPod>& pods,
                                     const std::string& policy);
// Sets the final condition (`type`: condition::kSucceeded or kFailed) and
// completionTime, records the event and deletes pods per `clean_policy`.
void Finish(const char* type, const std::string& reason, const std::string& message,
            const std::vector<ObservedPod>& pods, const std::string& clean_policy, absl::Time now,
            Actions* a);
// A finished job: cleanPodPolicy after the cleanup grace (after success),
// ttlSecondsAfterFinished.
// The PS pods go after their grace even while the job stays
// (KeepUnsavedParameters).
void AfterFinish(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                 const OperatorConfig& config, Actions* a);

// desired_hold.cc: a job that did not succeed, whose PS tasks may hold
// parameters they could not save (PsTasksMayHoldParameters). Sets
// ParametersHeld (True with the recipe to save the model while a PS task
// holds; False once none runs) and its Events; with `stop_running`, deletes
// the PS pods still running normally (so they save or hold). Looks again
// after config.progress_interval while a stopping PS task's state is not yet
// known. True while any PS task still runs: the job must stay (its ConfigMap
// and condition are the way to the model).
bool KeepUnsavedParameters(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                           const OperatorConfig& config, bool stop_running, Actions* a);

// desired_suspend.cc: runPolicy.suspend.
void Suspend(const JobObject& job, const Observed& observed, Actions* a);
void ResumeIfSuspended(const JobObject& job, absl::Time now, Actions* a);

// desired_gang.cc: runPolicy.schedulingPolicy. Queues the PodGroup while it
// is not known to exist (new, or deleted by someone), a patch of its spec
// when that differs from what the job asks for; while it cannot be created,
// holds back the pods queued so far (PodGroupFailing, a Warning, a retry
// after config.pod_group_retry).
void GangSchedule(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                  const OperatorConfig& config, Actions* a);
// What a pod of replica type `type` (lower-case) needs for gang scheduling:
// the PodGroup label or annotations, and the job's schedulerName and
// priorityClass where its template names none. No-op without a
// schedulingPolicy.
void DecorateGangPod(const JobObject& job, const TrainingJob& spec, const std::string& type,
                     nlohmann::json* labels, nlohmann::json* annotations, nlohmann::json* pod_spec);

// desired_auth.cc: the job's credentials and who mounts what of them.
inline constexpr char kAuthVolumeName[] = "kubetrain-auth";
// The Secret volume of task (type, index): only its own key or token and,
// with `tls`, the TLS files, read-only for the runtime's user.
nlohmann::json AuthVolume(const JobObject& job, const std::string& type, int index, bool tls);
// What the job's runtime pods mount: the token (and TLS files) of its Secret,
// or nothing when the job has no Secret and a live runtime pod of it mounts
// none (StartedWithoutCredentials: created by an older operator).
PodCredentials PodCredentialsOf(const TrainingJob& spec, const Observed& observed);
bool StartedWithoutCredentials(const TrainingJob& spec, const Observed& observed);
// Asks for the job's Secret while it does not exist (holding back every pod
// until it does), patches in the tokens of tasks added since, holds back pods
// whose files the cache does not show yet, and reports a Secret lost from
// under running tasks (AuthSecretMissing; the job fails once a pod that
// needs it must be created). A job started without credentials goes on
// without them (RunningWithoutCredentials).
void SecureJob(const JobObject& job, const TrainingJob& spec, const Observed& observed,
               const OperatorConfig& config, Actions* a);

// desired_objects.cc: the job as controller of an object (garbage-collected
// with it; how the operator tells its own objects from others of the same name).
nlohmann::json OwnerReferences(const JobObject& job);
// The metadata of a per-job object named `name`: the job's namespace, the
// label kubetrain.io/job-name (how the operator's caches select it) and the
// job as its controller.
nlohmann::json JobObjectMetadata(const JobObject& job, const std::string& name);
// The job's replica spec object for `key` ("PS", "Worker", ...), matching the
// keys case-insensitively as the parser does; {} if absent.
nlohmann::json RawReplicaSpec(const nlohmann::json& object, const std::string& key);

// desired_deadline.cc: activeDeadlineSeconds counts from status.startTime
// (set on the first reconcile and again on resume).
absl::Time StartTime(absl::Time now, Actions* a);
void FailPastDeadline(const JobObject& job, const TrainingJob& spec, const Failure& failure,
                      const Observed& observed, Actions* a);

// desired_replicas.cc: per-replica judgement through the lifecycle.
// Every task's state from its pod (or its absence) and status.taskRestarts;
// queues the Services and Pods that are missing.
std::vector<TaskState> ObserveTasks(const JobObject& job, const TrainingJob& spec,
                                    const Observed& observed, const OperatorConfig& config,
                                    Actions* a);
// Carries out a running job's decision: recreates the pods whose restart is
// due (deleting the failed pod; it is created again next time), waits for
// the others, sets Running/Restarting and the per-replica counts.
void ApplyRunning(const JobObject& job, const TrainingJob& spec, const LifecycleDecision& decision,
                  const Observed& observed, const OperatorConfig& config, Actions* a);
// Writes status.replicaStatuses from the decision (plus `restarting_now`
// restarts being carried out this pass).
void WriteReplicaStatuses(const LifecycleDecision& decision,
                          const std::vector<Restart>& restarting_now, Actions* a);
// A task failed for good, or backoffLimit was exceeded.
void FailForTask(const JobObject& job, const TrainingJob& spec, const Failure& failure,
                 const Observed& observed, Actions* a);

// desired_success.cc: the success policy was met.
void Succeed(const JobObject& job, const TrainingJob& spec, const Observed& observed,
             const OperatorConfig& config, Actions* a);

// desired_report.cc: the chief's report in status (camelCase, core/job_report.h).
// status.progress from the chief's live metrics, and CheckpointFailing.
void ProjectProgress(const Observed& observed, Actions* a);
// status.result and the final status.progress from the chief's termination
// message, and CheckpointFailing; false (status unchanged) if it holds no result.
bool ProjectResult(const std::string& termination_message, absl::Time now, Actions* a);
// CheckpointFailing from the PS tasks' checkpoint writes as the chief saw
// them (an Event when it turns True).
void ProjectCheckpointHealth(const Progress& p, absl::Time now, Actions* a);

}  // namespace desired_internal
}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_DESIRED_INTERNAL_H_
