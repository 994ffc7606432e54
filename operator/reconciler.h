// One reconcile of one TrainingJob: observe (the job, its pods, Services,
// ConfigMap, Secret and NetworkPolicy, read from the informer cache,
// operator/job_cache.h: no request to the API server; the chief task's live
// progress; after a failed job, whether its PS tasks hold unsaved
// parameters) -> Desired() (pure,
// operator/desired.h) -> apply (creates with a bounded fan-out, deletes,
// status only when it changed, aggregated events).
//
// Expectations (operator/expectations.h): what a pass creates or deletes is
// expected before the request goes out; until the cache shows all of it (or
// the expectations time out) a later pass of the same job decides nothing,
// so a cache that lags cannot make it create or delete twice. A restarted
// operator starts from a fresh list, so it never duplicates a pod either.
//
// An object the API server refuses as invalid (400/422) fails the job
// (reason CreateRejected, with the API server's message) on the next pass
// instead of retrying forever.
//
// The job's credentials (Actions::create_auth_secret) are generated here,
// the one impure step, right before their Secret is created; Create never
// overwrites, and Desired() asks again only while the cache shows no Secret
// of this job, so a running job's key is never replaced. A Secret of that
// name that is not the job's leaves its pods waiting (a Warning Event).
//
// Gang scheduling (runPolicy.schedulingPolicy): the job's PodGroup is created
// before its pods (AlreadyExists counts as created). Once one of an API was
// created, that API's PodGroups are watched (JobCache::WatchPodGroups): from
// then on a PodGroup deleted by someone is created again and one whose spec
// differs is patched (Desired() decides from the cache); until that cache
// has listed, the PodGroups this operator created are taken to exist. When
// the PodGroup API is not served (its CRD is not installed: 404) that is
// remembered for every job using it, and a refusal (403, 422) for the job,
// for OperatorConfig::pod_group_retry: the jobs' pods wait (PodGroupFailing)
// and nothing is retried, listed or watched meanwhile; the operator runs on.
//
// Thread-safe: different jobs may be reconciled concurrently; the caller
// (the work queue) never runs two passes of one job at once.
#ifndef KUBETRAIN_OPERATOR_RECONCILER_H_
#define KUBETRAIN_OPERATOR_RECONCILER_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "operator/desired.h"
#include "operator/event_recorder.h"
#include "operator/expectations.h"
#include "operator/job_cache.h"
#include "operator/kube_client.h"

namespace kubetrain {

struct ReconcileOutcome {
  absl::Status status;                          // not OK: retry with backoff
  std::optional<absl::Duration> requeue_after;  // a timer (deadline, TTL) to honour
  std::string state;                            // the job's state after this pass ("" if gone)
};

// Reads a task's /metrics text given its pod IP (operator/progress.h); may
// return nullopt. Optional. Asked for the chief's (live progress) while a job
// runs, and for the running PS pods of a job whose PS tasks may hold
// parameters they could not save (PsTasksMayHoldParameters).
using TaskMetricsReader = std::function<std::optional<std::string>(const std::string& pod_ip)>;

struct ReconcilerOptions {
  // Writes in flight at once for one job. A job's pods go at once (a
  // template the API server refuses as invalid fails the job: one request
  // per task, once); after a pod create of the job failed otherwise (quota,
  // a webhook; retried with backoff), in two batches: the first of each
  // template (replica type), then the rest, so a retry costs one request
  // per template, not one per task.
  int create_parallelism = 16;
  // While a job's expectations are unmet, look again after this (the watch
  // event that meets them normally comes first).
  absl::Duration expectations_recheck = absl::Seconds(5);
  // Status changes that are only counts and progress (replicaStatuses,
  // progress) are written at most once per this per job: pods starting one
  // by one cost one status write, not one each. Conditions, the state and
  // restart history are written at once.
  absl::Duration status_coalesce = absl::Seconds(1);
};

class Reconciler {
 public:
  // Everything passed must outlive the reconciler. `client` is used for
  // writes only; reads come from `cache`.
  Reconciler(KubeClient* client, JobCache* cache, Expectations* expectations, OperatorConfig config,
             const Clock* clock, TaskMetricsReader metrics = nullptr,
             ReconcilerOptions options = ReconcilerOptions());

  ReconcileOutcome Reconcile(const std::string& ns, const std::string& name);
  // Waits until the Events recorded so far are sent (they go in the background).
  void FlushEvents() { events_.Flush(); }

 private:
  // The objects before the pods: PodGroup, Services, ConfigMap, Secret,
  // NetworkPolicy.
  struct ObjectsApplied {
    absl::Status status;
    bool pods_may_go = true;  // false: the PodGroup does not exist
  };
  ObjectsApplied ApplyObjects(const JobObject& job, const Actions& actions,
                              std::optional<absl::Duration>* requeue_after);
  // Whether the pass creates the job's Secret and nothing but objects: its
  // pods wait for the Secret (Desired() asks for them once the cache shows it).
  static bool PodsWaitForTheSecret(const Actions& actions);
  // Sets *requeue_after when a status write was deferred (status_coalesce).
  // `objects`: ApplyObjects() already ran for these actions.
  absl::Status Apply(const JobObject& job, const Actions& actions,
                     std::optional<absl::Duration>* requeue_after,
                     const ObjectsApplied* objects = nullptr);
  absl::Status CleanUp(const std::string& ns, const std::string& name);
  // Creates `objects` of `plural` (expecting each first); remembers an
  // invalid-object refusal for the job. A name already taken counts as
  // created (and is added to *already_exist if given).
  absl::Status CreateAll(const JobObject& job, const std::string& plural,
                         const std::vector<nlohmann::json>& objects, bool slow_start,
                         std::vector<std::string>* already_exist = nullptr);
  // Generates the job's credentials and creates its Secret.
  absl::Status CreateAuthSecret(const JobObject& job, const AuthSecretRequest& request);
  // Adds and removes task tokens of the job's Secret.
  absl::Status PatchAuthSecret(const JobObject& job, const nlohmann::json& patch);
  absl::Status DeleteAll(const std::string& ns, const std::string& job_name,
                         const std::string& plural, const std::vector<std::string>& names);
  // Creates the job's PodGroup: true once it exists, false if it cannot be
  // created now (remembered in pod_group_blocked_), or a transient error.
  absl::StatusOr<bool> CreatePodGroup(const JobObject& job, const nlohmann::json& pod_group);
  // Sends Actions::patch_pod_group.
  absl::Status PatchPodGroup(const JobObject& job, const nlohmann::json& patch);
  // Fills observed's pod_group_* fields for a gang job whose PodGroup is of
  // `api_version`: from the PodGroup cache once it has listed, else from
  // pod_groups_.
  void ObservePodGroup(const std::string& ns, const std::string& name, const std::string& uid,
                       const std::string& api_version, Observed* observed);

  // Constant after construction.
  KubeClient* const client_;
  JobCache* const cache_;
  Expectations* const expectations_;
  const OperatorConfig config_;
  const Clock* const clock_;
  const TaskMetricsReader metrics_;
  const ReconcilerOptions options_;
  EventRecorder events_;

  absl::Mutex mu_;
  // job key -> the API server's message for an object it refused (see above).
  std::map<std::string, std::string> rejected_ ABSL_GUARDED_BY(mu_);
  // Jobs a pod create failed for (not AlreadyExists): their pods go in
  // slow start until the job finishes or is deleted.
  std::set<std::string> create_failed_ ABSL_GUARDED_BY(mu_);
  // job key -> when its status was last written.
  std::map<std::string, absl::Time> status_written_ ABSL_GUARDED_BY(mu_);
  // job key -> the PodGroup created (or found) for the job of that uid.
  struct PodGroupRecord {
    std::string uid;
    ResourceRef ref;
  };
  std::map<std::string, PodGroupRecord> pod_groups_ ABSL_GUARDED_BY(mu_);
  // Why PodGroups cannot be created, until when: keyed by API version
  // ("scheduling.x-k8s.io/v1alpha1": not served, for every job) or by job key
  // (refused for that job).
  struct PodGroupBlock {
    std::string reason;  // status.h: PodGroupAPIMissing | PodGroupRejected
    std::string message;
    absl::Time until;
  };
  std::map<std::string, PodGroupBlock> pod_group_blocked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_RECONCILER_H_
