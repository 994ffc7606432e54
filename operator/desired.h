// The operator's decision, as a pure function: from a TrainingJob and what
// exists in the cluster for it (observed), what should be created, deleted
// and reported. No I/O and no clock reads: `observed.now` is an input, so
// every rule (restart policies, backoffLimit, deadlines, TTL, suspend,
// success) is unit-tested without a cluster (desired_test.cc).
//
// The job's lifecycle (restarts, backoffLimit, activeDeadlineSeconds, success
// policy, restart delays) is core/job_lifecycle.h's, the same `kubetrain run`
// uses; desired_lifecycle_test.cc runs the shared scenario table through
// Desired(). Desired() is split by concern (desired_internal.h): objects
// (desired_objects.cc), per-replica judgement (desired_replicas.cc), deadline
// (desired_deadline.cc), success (desired_success.cc), progress and result
// (desired_report.cc), suspend/resume (desired_suspend.cc), finish and
// cleanup (desired_finish.cc), gang scheduling (desired_gang.cc).
//
// Objects per replica (type t in ps/worker/chief/evaluator, index i; names
// and labels in operator/labels.h):
//   Service {job}-{t}-{i}: headless (clusterIP None), publishNotReadyAddresses,
//           port "kubetrain" (2222 by default), selecting exactly that pod;
//   Pod     {job}-{t}-{i}: labels kubetrain.io/{job-name,replica-type,
//           replica-index}, controller ownerReference to the job, TF_CONFIG
//           built from the Services' DNS names (core/cluster_spec.h). Without
//           a container in its template it runs the kubetrain runtime:
//           kubetrain-ps for ps, kubetrain-worker for worker/chief/evaluator;
//           the chief task (TrainingJob::IsChiefTask) writes its result to
//           /dev/termination-log, and every task its fatal error's reason
//           ($KUBETRAIN_TERMINATION_LOG). A PS task also serves the bulk
//           data plane on port "bulk" (OperatorConfig::bulk_port, given as
//           $KUBETRAIN_BULK_PORT); workers learn that port from the PS. The training container gets
//           terminationMessagePolicy FallbackToLogsOnError unless its
//           template sets one; the Restarting and Failed conditions quote
//           its last termination (DescribeTermination).
// PS pods that run the kubetrain runtime in a job with a checkpoint directory
// get terminationGracePeriodSeconds kPsTerminationGraceSeconds (unless their
// template sets one): a PS task stopped at the end (or deleted) writes a
// final checkpoint, and if it cannot, holds the parameters for
// `kubetrain export --from-ps` (desired_hold.cc); the kubelet must not kill
// it first.
// Plus one ConfigMap {job}-config holding the job (trainingjob.yaml), mounted
// into kubetrain runtime containers.
// Authentication (desired_auth.cc; docs/trainingjob.md, "Authentication and
// TLS"): one Secret {job}-auth holding the job key, a token per non-PS task
// (token.{type}-{i}) and, with OperatorConfig::job_tls, the job's CA and task
// certificate (core/job_credentials.h). Its content is random, so Desired()
// only asks for it (Actions::create_auth_secret) and the apply layer
// generates it; pods are created once the cache shows it holding their
// files, so an operator restart never regenerates it. Each runtime container
// mounts only its own files read-only at OperatorConfig::auth_dir (PS: job.key;
// others: their token as `token`; plus the TLS files), with
// KUBETRAIN_AUTH_DIR pointing there. Only the PS pods of a job started
// without credentials (RunningWithoutCredentials) get KUBETRAIN_INSECURE=1
// instead (kubetrain-ps refuses to run open without it). A Secret deleted while pods that use it
// run is never replaced (a new key would lock restarted tasks out of the
// running PS tasks): AuthSecretMissing, and the job fails (AuthSecretLost)
// when one of those tasks would have to be started again.
// One NetworkPolicy {job}: the job's pods accept ingress only from pods of
// the same job, except the metrics port (Prometheus, the operator's progress
// reads).
// Gang scheduling (runPolicy.schedulingPolicy, desired_gang.cc): one PodGroup
// {job} for the scheduler the templates name, created before any pod (pods
// wait while it cannot be created), recreated when it is deleted and patched
// when its spec differs while the job runs, and every pod names it: label
// scheduling.x-k8s.io/pod-group (scheduler-plugins) or annotation
// scheduling.k8s.io/group-name (Volcano); pods whose template names no
// schedulerName / priorityClassName get the job's.
#ifndef KUBETRAIN_OPERATOR_DESIRED_H_
#define KUBETRAIN_OPERATOR_DESIRED_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"
#include "core/cluster_spec.h"
#include "core/job_credentials.h"
#include "core/job_lifecycle.h"
#include "core/job_report.h"
#include "core/job_spec.h"
#include "operator/labels.h"

namespace kubetrain {

// A PS pod's termination grace period (see above): the time a PS task holds
// parameters it could not save, plus two minutes for the attempts at its
// final checkpoint before that.
inline constexpr int64_t kPsTerminationGraceSeconds =
    kDefaultKeepServingAfterCheckpointFailureSeconds + 120;

struct OperatorConfig {
  std::string runtime_image = "kubetrain-runtime:latest";
  std::string image_pull_policy = "IfNotPresent";
  std::string cluster_domain;  // "" -> {svc}.{ns}.svc; else {svc}.{ns}.svc.{domain}
  int port = 2222;
  int metrics_port = 9090;
  // PS pods serve Pull/Push/PushPull also on this port: the bulk data plane
  // (ps/bulk_server.h), faster than gRPC, with the same tokens and TLS;
  // workers learn it from the PS. -1: gRPC only.
  int bulk_port = 2223;
  std::string config_dir = "/etc/kubetrain";  // where the job's ConfigMap is mounted
  // After success, how long PS tasks get to exit by themselves before
  // cleanPodPolicy deletes what still runs.
  absl::Duration cleanup_grace = absl::Seconds(30);
  // While a job runs, how often its progress (read from the chief) is refreshed.
  absl::Duration progress_interval = absl::Seconds(5);
  // Delays before the operator recreates a failed pod (ExitCode replicas,
  // lost pods); the kubelet backs off OnFailure/Always containers it restarts
  // in place itself, with the same values.
  RestartBackoff restart_backoff = kKubeletBackoff;
  // Gang scheduling: while a job's PodGroup cannot be created (its CRD is
  // not installed, RBAC, ...), how often to try again.
  absl::Duration pod_group_retry = absl::Seconds(30);
  // New jobs' Secrets get a CA and a task certificate: TLS between the tasks.
  // An existing Secret keeps what it was created with.
  bool job_tls = true;
  std::string auth_dir = "/var/run/kubetrain/auth";  // where a pod's credentials are mounted
};

// The TrainingJob object as read from the API server.
struct JobObject {
  std::string name;
  std::string namespace_;
  std::string uid;
  int64_t generation = 0;
  nlohmann::json object;  // the whole object (spec is parsed from it)
  nlohmann::json status;  // .status as stored (may be null)
  bool deleting = false;  // metadata.deletionTimestamp set
};

struct ObservedPod {
  std::string name;
  std::string type;  // "ps", "worker", ...
  int index = 0;
  std::string phase;             // Pending, Running, Succeeded, Failed, Unknown
  std::optional<int> exit_code;  // of the training container, when terminated
  std::string termination_message;
  absl::Time started = absl::InfinitePast();   // its last termination: when that run began
  absl::Time finished = absl::InfinitePast();  // and when it ended
  int restart_count = 0;                       // container restarts done in place by the kubelet
  bool deleting = false;
  // Why its training container last ended: state.terminated, else
  // lastState.terminated (the run before an in-place restart). `message` is
  // the termination message: the task's one-line fatal reason
  // (--termination_log), or with terminationMessagePolicy
  // FallbackToLogsOnError the tail of its log.
  struct Termination {
    int exit_code = 0;
    std::string reason;  // the kubelet's: Error, OOMKilled, Completed, ...
    std::string message;
  };
  std::optional<Termination> last_termination;
  std::string waiting_reason;  // state.waiting.reason, e.g. CrashLoopBackOff
  // metadata.deletionTimestamp: when the kubelet kills what still runs of a
  // pod being deleted (InfiniteFuture: not being deleted).
  absl::Time deletion_deadline = absl::InfiniteFuture();
  // A PS task that could not write its final checkpoint and serves its
  // parameters read-only for `kubetrain export --from-ps` (its /metrics:
  // kHoldingUnsavedParametersMetric 1). Read only for the running PS pods of
  // a job for which PsTasksMayHoldParameters().
  bool holds_unsaved_parameters = false;
  bool uses_auth_secret = false;  // annotated kAuthSecretAnnotation: mounts the job's Secret
};

// "worker-0 exited 2: spec.training.dataset.path: ...": the task (pod
// `type`-`index`), its last exit code and the last line of its termination
// message (else the kubelet's reason: "exited 137 (OOMKilled)"), cut at 512
// bytes; "" if it has not terminated.
std::string DescribeTermination(const ObservedPod& pod);

struct Observed {
  absl::Time now;
  std::vector<ObservedPod> pods;      // pods labelled with this job's name
  std::vector<std::string> services;  // service names labelled with this job's name
  bool config_map_exists = false;
  bool network_policy_exists = false;
  // The job's Secret {job}-auth as the cache holds it, if this job owns one.
  struct AuthSecret {
    std::string job_key;         // data[job.key] decoded; "" if absent
    std::set<std::string> keys;  // every key of its data
  };
  std::optional<AuthSecret> auth_secret;
  // The chief's latest progress (read from its /metrics), if known.
  std::optional<Progress> progress;
  // The API server refused to create one of the job's objects as invalid
  // (400/422, e.g. a template container without an image): its message.
  // Retrying cannot help, so the job fails with reason CreateRejected.
  std::string create_rejected;
  // Gang scheduling: whether the job's PodGroup is known to exist (the
  // PodGroup cache shows it; before that cache has listed: this operator
  // created or found it), its spec as the cache shows it (nullopt: not
  // cached yet, so not compared), and why it cannot be created now
  // (reason is status.h's PodGroupAPIMissing or PodGroupRejected; "" = no
  // known obstacle).
  bool pod_group_exists = false;
  std::optional<nlohmann::json> pod_group_spec;
  std::string pod_group_blocked_reason;
  std::string pod_group_blocked;
};

struct JobEvent {
  std::string type;    // Normal | Warning
  std::string reason;  // e.g. TrainingJobRestarting
  std::string message;
};

// What the job's Secret must hold. The apply layer generates the credentials
// (GenerateJobCredentials) and builds the Secret with BuildAuthSecret.
struct AuthSecretRequest {
  bool tls = true;
  std::vector<JobTask> token_tasks;  // every task but the PS tasks
};

struct Actions {
  // Created before the pods; pods are created only once it exists.
  std::optional<nlohmann::json> create_pod_group;
  // The existing PodGroup's spec differs from what the job asks for
  // (schedulingPolicy or the templates' requests changed, or someone edited
  // it): its apiVersion and metadata (name, namespace), and in "spec" the
  // merge patch of its spec (PodGroupSpecPatch).
  std::optional<nlohmann::json> patch_pod_group;
  // Created before the pods; a pod is created only once the cache shows its
  // files in it.
  std::optional<AuthSecretRequest> create_auth_secret;
  // A merge patch of the existing Secret: tokens of tasks added since it was
  // created, null for tasks that no longer exist.
  std::optional<nlohmann::json> patch_auth_secret;
  std::optional<nlohmann::json> create_config_map;
  std::optional<nlohmann::json> create_network_policy;
  std::vector<nlohmann::json> create_services;
  std::vector<nlohmann::json> create_pods;
  std::vector<std::string> delete_pods;
  // The status the job should have now: conditions and state
  // (operator/status.h), startTime, completionTime, replicaStatuses (per
  // replica type: active, succeeded, failed, restarts, recreated),
  // taskRestarts (per task: restarts, consecutiveFailures: the restart
  // backoff's memory), progress and result (camelCase projections of the
  // chief's report, core/job_report.h).
  nlohmann::json status;
  std::vector<JobEvent> events;
  // When to look again by itself: a restart backoff, the deadline, the TTL,
  // the cleanup grace or the next progress refresh falls due then.
  std::optional<absl::Duration> requeue_after;
  bool delete_job = false;  // ttlSecondsAfterFinished has passed
};

Actions Desired(const JobObject& job, const Observed& observed, const OperatorConfig& config);

// Whether the PS tasks of a finished job (`status`) may hold parameters they
// could not save, so that the reconciler reads their metrics
// (ObservedPod::holds_unsaved_parameters) and Desired() keeps them and the
// job (condition ParametersHeld): the job did not succeed (a succeeded job's
// model is written), it has a checkpoint directory and its PS tasks run the
// kubetrain runtime.
bool PsTasksMayHoldParameters(const TrainingJob& spec, const nlohmann::json& status);

// Building blocks, exposed for tests.
// Where a task of `job` listens in the cluster: its Service's DNS name,
// {job}-{type}-{i}.{ns}.svc[.{cluster_domain}]:{port} (as TFJob's).
TaskAddress ServiceAddress(const std::string& job, const std::string& ns,
                           const OperatorConfig& config);
nlohmann::json BuildService(const JobObject& job, const std::string& type, int index,
                            const OperatorConfig& config);
// What a kubetrain runtime pod mounts of the job's Secret.
enum class PodCredentials {
  // Nothing: the job's pods were created by an operator that gave jobs no
  // credentials (an upgrade while it ran); its PS tasks run open, and a
  // restarted task must too, or it could not talk to them.
  kNone,
  kToken,        // the task's job key (PS) or token (every other task)
  kTokenAndTls,  // and the job's CA, the task certificate and its key
};
nlohmann::json BuildPod(const JobObject& job, const TrainingJob& spec, const std::string& spec_key,
                        int index, PodCredentials credentials, const OperatorConfig& config);
nlohmann::json BuildConfigMap(const JobObject& job);
// The job's Secret {job}-auth (type Opaque, owned by the job): job.key, the
// TLS files when `creds` has them, and token.{type}-{i} = TaskToken(job key,
// type, i) for each of `token_tasks`.
nlohmann::json BuildAuthSecret(const JobObject& job, const JobCredentials& creds,
                               const std::vector<JobTask>& token_tasks);
// The job's NetworkPolicy {job}: selects the job's pods; ingress from pods
// labelled with the same job on any port, and to the metrics port from anywhere.
nlohmann::json BuildNetworkPolicy(const JobObject& job, const OperatorConfig& config);
// The PodGroup's apiVersion for `scheduler`: "scheduling.x-k8s.io/v1alpha1"
// (scheduler-plugins) or "scheduling.volcano.sh/v1beta1" (Volcano).
const char* PodGroupApiVersion(GangScheduler scheduler);
// The job's PodGroup {job}, owned by it. scheduler-plugins: spec.minMember
// (minAvailable, else every task) and scheduleTimeoutSeconds; Volcano:
// spec.minMember, queue and priorityClassName; both: minResources (below). REQUIRES:
// spec.run_policy.scheduling_policy (validation guarantees a scheduler name).
nlohmann::json BuildPodGroup(const JobObject& job, const TrainingJob& spec);
// The PodGroup's minResources: schedulingPolicy.minResources as given, else
// the requests of the first minAvailable tasks (PS, then Chief, Worker,
// Evaluator) summed from their templates; {} when nothing requests anything.
nlohmann::json MinResources(const JobObject& job, const TrainingJob& spec);
// The merge patch of a PodGroup's spec that makes `observed` what `desired`
// (BuildPodGroup's spec) asks for; {} when nothing differs. The fields the
// operator sets are kept equal (minResources whole); minResources and
// scheduleTimeoutSeconds it no longer sets are removed; fields it never sets,
// or sets only sometimes and others default (queue, priorityClassName), are
// left to others when it does not set them.
nlohmann::json PodGroupSpecPatch(const nlohmann::json& desired, const nlohmann::json& observed);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_DESIRED_H_
