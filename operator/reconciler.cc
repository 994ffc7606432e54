#include "operator/reconciler.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_credentials.h"
#include "core/log.h"
#include "operator/labels.h"
#include "operator/status.h"

namespace kubetrain {
namespace {

using nlohmann::json;

// An object of a kind the operator creates for a job (all core/v1 but NetworkPolicies).
ResourceRef Owned(const std::string& plural, const std::string& ns, const std::string& name = "") {
  return {plural == "networkpolicies" ? kNetworkPolicyApiPath : "/api/v1", plural, ns, name, ""};
}

// The kind named in Events for objects of `plural` worth an Event ("" = none).
const char* EventKind(const std::string& plural) {
  return plural == "pods" ? "Pod" : plural == "services" ? "Service" : "";
}

// The job's Secret as Desired() needs it: its keys, and the job key. (Its
// format is the runtime's to check: a PS refuses a malformed one, naming it.)
Observed::AuthSecret ObserveAuthSecret(const json& secret) {
  Observed::AuthSecret s;
  const json data = secret.value("data", json::object());
  if (!data.is_object()) return s;
  for (const auto& [key, value] : data.items()) s.keys.insert(key);
  std::string key;
  const json encoded = data.value(kJobKeyFile, json());
  if (encoded.is_string() && absl::Base64Unescape(encoded.get<std::string>(), &key)) {
    s.job_key = std::string(absl::StripAsciiWhitespace(key));
  }
  return s;
}

// The training container's status: named kubetrain or tensorflow, else the first.
std::optional<json> TrainingContainerStatus(const json& pod) {
  const json statuses = pod.value("/status/containerStatuses"_json_pointer, json::array());
  std::optional<json> found;
  for (const auto& s : statuses) {
    const std::string n = s.value("name", "");
    if (n == "kubetrain" || n == "tensorflow") return s;
    if (!found) found = s;
  }
  return found;
}

ObservedPod ObservePod(const json& pod) {
  ObservedPod p;
  p.name = pod.value("/metadata/name"_json_pointer, std::string());
  const json& labels = pod.value("/metadata/labels"_json_pointer, json::object());
  p.type = labels.value(kReplicaTypeLabel, "");
  p.index = std::atoi(labels.value(kReplicaIndexLabel, "0").c_str());
  p.phase = pod.value("/status/phase"_json_pointer, std::string());
  p.deleting = pod.contains("metadata") && pod["metadata"].contains("deletionTimestamp");
  if (p.deleting) {
    p.deletion_deadline =
        ParseTimestamp(pod["metadata"]["deletionTimestamp"]).value_or(absl::InfiniteFuture());
  }
  p.uses_auth_secret = pod.value("/metadata/annotations"_json_pointer, json::object())
                           .contains(kAuthSecretAnnotation);
  if (auto cs = TrainingContainerStatus(pod)) {
    p.restart_count = cs->value("restartCount", 0);
    const json terminated = cs->value("/state/terminated"_json_pointer, json());
    const json last = terminated.is_object()
                          ? terminated
                          : cs->value("/lastState/terminated"_json_pointer, json());
    if (last.is_object()) {
      p.last_termination = ObservedPod::Termination{
          last.value("exitCode", 0), last.value("reason", ""), last.value("message", "")};
    }
    p.waiting_reason = cs->value("/state/waiting/reason"_json_pointer, std::string());
    if (terminated.is_object()) {
      p.exit_code = terminated.value("exitCode", 0);
      p.termination_message = terminated.value("message", "");
      p.started =
          ParseTimestamp(terminated.value("startedAt", json())).value_or(absl::InfinitePast());
      p.finished =
          ParseTimestamp(terminated.value("finishedAt", json())).value_or(absl::InfinitePast());
    }
  }
  return p;
}

bool OwnedBy(const json& object, const std::string& uid) {
  for (const auto& ref : object.value("/metadata/ownerReferences"_json_pointer, json::array())) {
    if (ref.value("uid", "") == uid && ref.value("controller", false)) return true;
  }
  return false;
}

std::string NameOf(const json& object) {
  return object.value("/metadata/name"_json_pointer, std::string());
}

// Runs calls[i] for every i, at most `parallelism` at once, and returns the
// first error.
absl::Status RunBounded(size_t n, int parallelism,
                        const std::function<absl::Status(size_t)>& call) {
  if (n == 0) return absl::OkStatus();
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  absl::Status first;
  auto worker = [&] {
    for (size_t i; (i = next++) < n;) {
      absl::Status s = call(i);
      absl::MutexLock l(&mu);
      if (first.ok() && !s.ok()) first = s;
    }
  };
  const size_t threads = std::min<size_t>(n, std::max(1, parallelism));
  if (threads == 1) {
    worker();
    return first;
  }
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return first;
}

}  // namespace

Reconciler::Reconciler(KubeClient* client, JobCache* cache, Expectations* expectations,
                       OperatorConfig config, const Clock* clock, TaskMetricsReader metrics,
                       ReconcilerOptions options)
    : client_(client),
      cache_(cache),
      expectations_(expectations),
      config_(std::move(config)),
      clock_(clock),
      metrics_(std::move(metrics)),
      options_(options),
      events_(client, clock) {}

absl::Status Reconciler::DeleteAll(const std::string& ns, const std::string& job_name,
                                   const std::string& plural,
                                   const std::vector<std::string>& names) {
  const std::string key = ns + "/" + job_name;
  return RunBounded(names.size(), options_.create_parallelism, [&](size_t i) {
    const std::string what = plural + "/" + names[i];
    expectations_->ExpectDelete(key, what);
    absl::Status s = client_->Delete(Owned(plural, ns, names[i]), kPropagationBackground);
    if (!s.ok()) expectations_->Forget(key, what);
    if (s.ok()) Log("operator: deleted ", plural, " ", ns, "/", names[i]);
    return absl::IsNotFound(s) ? absl::OkStatus() : s;
  });
}

absl::Status Reconciler::CleanUp(const std::string& ns, const std::string& name) {
  // A real cluster's garbage collector removes a deleted job's children via
  // ownerReferences; doing it here too keeps clusters without one clean.
  const std::string key = ns + "/" + name;
  std::optional<ResourceRef> pod_group;
  {
    absl::MutexLock l(&mu_);
    auto it = pod_groups_.find(key);
    if (it != pod_groups_.end()) pod_group = it->second.ref;
    pod_groups_.erase(key);
    pod_group_blocked_.erase(key);
  }
  if (pod_group) {
    absl::Status s = client_->Delete(*pod_group, kPropagationBackground);
    if (!s.ok() && !absl::IsNotFound(s)) return s;
    if (s.ok()) Log("operator: deleted podgroups ", ns, "/", pod_group->name);
  }
  const std::vector<std::pair<const char*, std::vector<json>>> owned = {
      {"pods", cache_->Pods(key)},
      {"services", cache_->Services(key)},
      {"configmaps", cache_->ConfigMaps(key)},
      {"secrets", cache_->Secrets(key)},
      {"networkpolicies", cache_->NetworkPolicies(key)}};
  absl::Status first;
  for (const auto& [plural, objects] : owned) {
    std::vector<std::string> names;
    for (const auto& o : objects) {
      if (!o["metadata"].contains("deletionTimestamp")) names.push_back(NameOf(o));
    }
    absl::Status s = DeleteAll(ns, name, plural, names);
    if (first.ok()) first = s;
  }
  return first;
}

ReconcileOutcome Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  ReconcileOutcome out;
  const std::string key = ns + "/" + name;
  const std::optional<json> object = cache_->Job(ns, name);
  if (object) out.state = object->value("/status/state"_json_pointer, std::string());
  if (!expectations_->Satisfied(key)) {
    out.requeue_after = options_.expectations_recheck;
    return out;
  }
  if (!object) {
    {
      absl::MutexLock l(&mu_);
      rejected_.erase(key);
      create_failed_.erase(key);
      status_written_.erase(key);
    }
    events_.Forget(key);
    out.status = CleanUp(ns, name);
    return out;
  }
  try {
    JobObject job;
    job.name = name;
    job.namespace_ = ns;
    job.uid = (*object)["metadata"].value("uid", "");
    job.generation = (*object)["metadata"].value("generation", int64_t{0});
    job.deleting = (*object)["metadata"].contains("deletionTimestamp");
    job.status = object->value("status", json());
    job.object = *object;

    // When the pods wait only for the job's Secret, the objects go first
    // and the pass decides again at once: the cache shows them from the
    // creates' answers, so the pods need neither a watch round trip nor a
    // status write and a second pass.
    std::optional<ObjectsApplied> objects_applied;
    std::optional<absl::Duration> objects_requeue;
    Actions actions;
    for (int attempt = 0;; ++attempt) {
      Observed observed;
      observed.now = clock_->Now();
      for (const auto& cm : cache_->ConfigMaps(key)) {
        if (NameOf(cm) == ConfigMapName(name)) observed.config_map_exists = true;
      }
      for (const auto& np : cache_->NetworkPolicies(key)) {
        if (NameOf(np) == NetworkPolicyName(name) && OwnedBy(np, job.uid)) {
          observed.network_policy_exists = true;
        }
      }
      for (const auto& secret : cache_->Secrets(key)) {
        // Only this job's: a previous job's of the same name (being collected)
        // must not be mounted.
        if (NameOf(secret) == AuthSecretName(name) && OwnedBy(secret, job.uid) &&
            !secret["metadata"].contains("deletionTimestamp")) {
          observed.auth_secret = ObserveAuthSecret(secret);
        }
      }
      {
        absl::MutexLock l(&mu_);
        auto it = rejected_.find(key);
        if (it != rejected_.end()) observed.create_rejected = it->second;
      }
      // Live progress comes from whichever task is the chief (the Chief
      // replica's, else worker 0).
      auto spec = ParseTrainingJob(object->dump());
      const std::string chief_type = spec.ok() ? spec->chief_task_type() : "worker";
      // After a job that did not succeed, whether its PS tasks hold parameters
      // they could not save shows in their metrics.
      const bool read_ps = metrics_ && spec.ok() && IsFinished(job.status) &&
                           PsTasksMayHoldParameters(*spec, job.status);
      std::string chief_ip;
      for (const auto& pod : cache_->Pods(key)) {
        if (!OwnedBy(pod, job.uid)) continue;  // not ours (e.g. a previous job of the same name)
        observed.pods.push_back(ObservePod(pod));
        ObservedPod& p = observed.pods.back();
        const std::string ip = pod.value("/status/podIP"_json_pointer, std::string());
        if (p.type == chief_type && p.index == 0) chief_ip = ip;
        if (read_ps && p.type == "ps" && p.phase == "Running" && !ip.empty()) {
          const std::optional<std::string> text = metrics_(ip);
          p.holds_unsaved_parameters =
              text && MetricValue(*text, kHoldingUnsavedParametersMetric).value_or(0) == 1;
        }
      }
      for (const auto& svc : cache_->Services(key)) {
        if (OwnedBy(svc, job.uid)) observed.services.push_back(NameOf(svc));
      }
      if (spec.ok() && spec->run_policy.scheduling_policy.has_value()) {
        ObservePodGroup(ns, name, job.uid,
                        PodGroupApiVersion(GangSchedulerOf(spec->scheduler_name())), &observed);
      }
      // A job of the user's own containers serves no kubetrain metrics to read.
      if (metrics_ && !chief_ip.empty() && spec.ok() && spec->has_training &&
          !IsFinished(job.status)) {
        if (std::optional<std::string> text = metrics_(chief_ip)) {
          observed.progress = ProgressFromMetrics(*text);
        }
      }

      actions = Desired(job, observed, config_);
      if (attempt == 0 && PodsWaitForTheSecret(actions)) {
        ObjectsApplied o = ApplyObjects(job, actions, &objects_requeue);
        bool secret_cached = false;
        for (const auto& secret : cache_->Secrets(key)) {
          secret_cached |= NameOf(secret) == AuthSecretName(name) && OwnedBy(secret, job.uid);
        }
        if (o.status.ok() && o.pods_may_go && secret_cached && expectations_->Satisfied(key)) {
          continue;
        }
        objects_applied = o;  // this pass ends as it would have
      }
      break;
    }
    out.requeue_after = actions.requeue_after;
    if (objects_requeue && (!out.requeue_after || *objects_requeue < *out.requeue_after)) {
      out.requeue_after = objects_requeue;
    }
    out.status =
        Apply(job, actions, &out.requeue_after, objects_applied ? &*objects_applied : nullptr);
    out.state = actions.status.value("state", "");
    if (IsFinished(actions.status)) {
      absl::MutexLock l(&mu_);
      rejected_.erase(key);
      create_failed_.erase(key);
    }
    if (actions.delete_job && out.status.ok()) out.state.clear();
  } catch (const json::exception& e) {
    // A malformed object must not take the operator down.
    out.status =
        absl::InvalidArgumentError(absl::StrCat("trainingjob ", ns, "/", name, ": ", e.what()));
  }
  {
    absl::MutexLock l(&mu_);
    // A refusal seen in this pass: decide on it at once (the job fails).
    if (rejected_.count(key) && !out.requeue_after) out.requeue_after = absl::ZeroDuration();
  }
  return out;
}

void Reconciler::ObservePodGroup(const std::string& ns, const std::string& name,
                                 const std::string& uid, const std::string& api_version,
                                 Observed* observed) {
  const std::string key = ns + "/" + name;
  const bool cached = cache_->PodGroupsSynced(api_version);
  if (cached) {
    const std::optional<json> pg = cache_->PodGroup(api_version, ns, PodGroupName(name));
    observed->pod_group_exists = pg && OwnedBy(*pg, uid);
    if (observed->pod_group_exists) observed->pod_group_spec = pg->value("spec", json::object());
  }
  absl::MutexLock l(&mu_);
  if (!cached) {
    auto it = pod_groups_.find(key);
    observed->pod_group_exists = it != pod_groups_.end() && it->second.uid == uid;
  }
  for (const std::string& k : {api_version, key}) {
    auto b = pod_group_blocked_.find(k);
    if (b == pod_group_blocked_.end()) continue;
    if (observed->now >= b->second.until) {
      pod_group_blocked_.erase(b);  // time to try again
      continue;
    }
    observed->pod_group_blocked_reason = b->second.reason;
    observed->pod_group_blocked = b->second.message;
    return;
  }
}

absl::StatusOr<bool> Reconciler::CreatePodGroup(const JobObject& job, const json& pod_group) {
  const std::string api_version = pod_group.value("apiVersion", "");
  const std::string key = job.namespace_ + "/" + job.name;
  ResourceRef ref{"/apis/" + api_version, "podgroups", job.namespace_, "", ""};
  const std::string what = "podgroups/" + NameOf(pod_group);
  expectations_->ExpectCreate(key, what);
  auto r = client_->Create(ref, pod_group);
  ref.name = NameOf(pod_group);
  if (!r.ok()) expectations_->Forget(key, what);
  if (r.ok() || absl::IsAlreadyExists(r.status())) {
    // The API is served: from now on its PodGroups are watched (an edit or a
    // delete re-queues the job).
    cache_->WatchPodGroups(api_version);
    absl::MutexLock l(&mu_);
    pod_groups_[key] = {job.uid, ref};
    pod_group_blocked_.erase(key);
    if (r.ok()) {
      Log("operator: created podgroups ", key, " (", api_version, ")");
      events_.Record({job.namespace_, job.name, job.uid}, "Normal", "SuccessfulCreatePodGroup",
                     absl::StrCat("Created PodGroup ", ref.name, " (", api_version, ")"));
    }
    return true;
  }
  const absl::Status& s = r.status();
  const absl::Time until = clock_->Now() + config_.pod_group_retry;
  absl::MutexLock l(&mu_);
  if (absl::IsNotFound(s)) {
    // The namespace exists (the job is in it): the API server does not serve
    // the resource, i.e. the gang scheduler's CRD is not installed.
    pod_group_blocked_[api_version] = {
        reason::kPodGroupAPIMissing,
        absl::StrCat("the API server does not serve podgroups in ", api_version,
                     " (is the gang scheduler's PodGroup CRD installed?): ", s.message()),
        until};
  } else if (absl::IsPermissionDenied(s) || absl::IsInvalidArgument(s)) {
    pod_group_blocked_[key] = {
        reason::kPodGroupRejected,
        absl::StrCat("the API server refused podgroups ", key, ": ", s.message()), until};
  } else {
    return s;  // transient: retried with backoff
  }
  Log("operator: cannot create podgroups ", key, ": ", s.message());
  return false;
}

absl::Status Reconciler::PatchPodGroup(const JobObject& job, const json& patch) {
  const ResourceRef ref{"/apis/" + patch.value("apiVersion", ""), "podgroups", job.namespace_,
                        NameOf(patch), ""};
  auto r = client_->MergePatch(ref, {{"spec", patch.at("spec")}});
  // Deleted meanwhile: its watch event brings the job back to create it.
  if (absl::IsNotFound(r.status())) return absl::OkStatus();
  if (!r.ok()) return r.status();
  Log("operator: updated podgroups ", job.namespace_, "/", ref.name, ": ", patch.at("spec").dump());
  events_.Record({job.namespace_, job.name, job.uid}, "Normal", "SuccessfulUpdatePodGroup",
                 absl::StrCat("Updated PodGroup ", ref.name, " spec: ", patch.at("spec").dump()));
  return absl::OkStatus();
}

absl::Status Reconciler::CreateAll(const JobObject& job, const std::string& plural,
                                   const std::vector<json>& objects, bool slow_start,
                                   std::vector<std::string>* already_exist) {
  if (objects.empty()) return absl::OkStatus();
  const std::string& ns = job.namespace_;
  const std::string key = ns + "/" + job.name;
  const EventTarget target{ns, job.name, job.uid};
  absl::Mutex mu;
  std::vector<std::string> created;
  auto create = [&](size_t i) -> absl::Status {
    const std::string name = NameOf(objects[i]);
    const std::string what = plural + "/" + name;
    expectations_->ExpectCreate(key, what);
    auto r = client_->Create(Owned(plural, ns), objects[i]);
    if (r.ok()) {
      // The answer is the object as stored: into the cache at once, so the
      // next pass need not wait for its watch event (meets the expectation).
      cache_->Created(plural, *r);
      absl::MutexLock l(&mu);
      created.push_back(name);
      return absl::OkStatus();
    }
    expectations_->Forget(key, what);
    if (absl::IsAlreadyExists(r.status())) {
      absl::MutexLock l(&mu);
      if (already_exist) already_exist->push_back(name);
      return absl::OkStatus();
    }
    if (slow_start) {
      absl::MutexLock l(&mu_);
      create_failed_.insert(key);
    }
    if (absl::IsInvalidArgument(r.status())) {
      absl::MutexLock l(&mu_);
      rejected_[key] =
          absl::StrCat("the API server refused ", plural, " ", name, ": ", r.status().message());
    }
    events_.Record(target, "Warning", "FailedCreate",
                   absl::StrCat("Creating ", plural, " ", name, ": ", r.status().message()));
    return r.status();
  };
  absl::Status status;
  bool failed_before = false;
  if (slow_start) {
    absl::MutexLock l(&mu_);
    failed_before = create_failed_.count(key) > 0;
  }
  if (!failed_before) {
    status = RunBounded(objects.size(), options_.create_parallelism, create);
  } else {
    // Slow start, once a create of this kind failed for the job (quota, a
    // webhook: retried with backoff): the first of each template (replica
    // type) alone, then the rest; stop at the first failure. A retry costs
    // one request per template, not one per task.
    std::vector<size_t> first, rest;
    std::set<std::string> types;
    for (size_t i = 0; i < objects.size(); ++i) {
      const json labels = objects[i].value("/metadata/labels"_json_pointer, json::object());
      const std::string type = labels.is_object() ? labels.value(kReplicaTypeLabel, "") : "";
      (types.insert(type).second ? first : rest).push_back(i);
    }
    status = RunBounded(first.size(), options_.create_parallelism,
                        [&](size_t i) { return create(first[i]); });
    if (status.ok()) {
      status = RunBounded(rest.size(), options_.create_parallelism,
                          [&](size_t i) { return create(rest[i]); });
    }
  }
  if (!created.empty()) {
    std::sort(created.begin(), created.end());
    const std::string kind = EventKind(plural);
    Log("operator: created ", plural, " ", ns, "/{", absl::StrJoin(created, ","), "}");
    if (!kind.empty()) {
      events_.Record(target, "Normal", "SuccessfulCreate" + kind,
                     absl::StrCat("Created ", kind, created.size() > 1 ? "s " : " ",
                                  absl::StrJoin(created, ", ")));
    }
  }
  return status;
}

absl::Status Reconciler::CreateAuthSecret(const JobObject& job, const AuthSecretRequest& request) {
  // The only place a job's credentials are made: never again once the
  // Secret exists (Create does not overwrite; Desired() asks only while the
  // cache shows none).
  absl::StatusOr<JobCredentials> creds = GenerateJobCredentials(job.name, request.tls);
  if (!creds.ok()) {
    return absl::Status(creds.status().code(),
                        absl::StrCat("generating the credentials of trainingjob ", job.namespace_,
                                     "/", job.name, ": ", creds.status().message()));
  }
  const json secret = BuildAuthSecret(job, *creds, request.token_tasks);
  std::vector<std::string> taken;
  absl::Status s = CreateAll(job, "secrets", {secret}, false, &taken);
  if (!taken.empty()) {
    // Not this job's (the cache shows none of it): a deleted job's of the
    // same name not yet collected, or someone else's. Its pods wait.
    events_.Record({job.namespace_, job.name, job.uid}, "Warning", "FailedCreate",
                   absl::StrCat("Secret ", taken[0],
                                " already exists and does not belong to this TrainingJob; its "
                                "pods wait until it is gone"));
  }
  return s;
}

absl::Status Reconciler::PatchAuthSecret(const JobObject& job, const json& patch) {
  const ResourceRef ref = Owned("secrets", job.namespace_, AuthSecretName(job.name));
  auto r = client_->MergePatch(ref, patch);
  if (r.ok()) {
    Log("operator: updated the task tokens of ", ref.DebugString());
    return absl::OkStatus();
  }
  events_.Record(
      {job.namespace_, job.name, job.uid}, "Warning", "FailedUpdate",
      absl::StrCat("Updating the task tokens of Secret ", ref.name, ": ", r.status().message()));
  return r.status();
}

namespace {
// True if `a` and `b` differ only in counts and progress.
bool OnlyCountsDiffer(const json& a, const json& b) {
  if (!a.is_object() || !b.is_object()) return false;
  json x = a, y = b;
  for (const char* k : {"replicaStatuses", "progress"}) {
    x.erase(k);
    y.erase(k);
  }
  return x == y;
}
}  // namespace

bool Reconciler::PodsWaitForTheSecret(const Actions& a) {
  return a.create_auth_secret && a.create_pods.empty() && a.delete_pods.empty() &&
         !a.patch_auth_secret && !a.delete_job;
}

Reconciler::ObjectsApplied Reconciler::ApplyObjects(const JobObject& job, const Actions& a,
                                                    std::optional<absl::Duration>* requeue_after) {
  // Gang scheduling: the PodGroup before any pod, or no pod.
  bool pods_may_go = true;
  absl::Status pod_group = absl::OkStatus();
  if (a.create_pod_group) {
    absl::StatusOr<bool> exists = CreatePodGroup(job, *a.create_pod_group);
    pods_may_go = exists.ok() && *exists;
    if (!exists.ok()) pod_group = exists.status();
    // Newly blocked: the next pass reports it (PodGroupFailing) at once.
    if (exists.ok() && !*exists) *requeue_after = absl::ZeroDuration();
  }
  // Pods after their Services, ConfigMap, Secret and NetworkPolicy exist, so
  // DNS, the mounted files and the isolation are there when a task starts.
  absl::Status applied = RunBounded(5, 5, [&](size_t i) {
    switch (i) {
      case 0:
        return CreateAll(job, "services", a.create_services, false);
      case 1:
        return a.create_config_map ? CreateAll(job, "configmaps", {*a.create_config_map}, false)
                                   : absl::OkStatus();
      case 2:
        return a.create_auth_secret ? CreateAuthSecret(job, *a.create_auth_secret)
                                    : absl::OkStatus();
      case 3:
        return a.patch_auth_secret ? PatchAuthSecret(job, *a.patch_auth_secret) : absl::OkStatus();
      default:
        return a.create_network_policy
                   ? CreateAll(job, "networkpolicies", {*a.create_network_policy}, false)
                   : absl::OkStatus();
    }
  });
  if (applied.ok()) applied = pod_group;
  if (applied.ok() && a.patch_pod_group) applied = PatchPodGroup(job, *a.patch_pod_group);
  return {applied, pods_may_go};
}

absl::Status Reconciler::Apply(const JobObject& job, const Actions& a,
                               std::optional<absl::Duration>* requeue_after,
                               const ObjectsApplied* objects) {
  const std::string& ns = job.namespace_;
  const EventTarget target{ns, job.name, job.uid};
  const ObjectsApplied o = objects ? *objects : ApplyObjects(job, a, requeue_after);
  absl::Status applied = o.status;
  if (applied.ok() && o.pods_may_go) applied = CreateAll(job, "pods", a.create_pods, true);
  absl::Status deleted = DeleteAll(ns, job.name, "pods", a.delete_pods);
  if (applied.ok()) applied = deleted;

  for (const auto& e : a.events) events_.Record(target, e.type, e.reason, e.message);

  const std::string key = ns + "/" + job.name;
  bool write = a.status != job.status;
  if (write && OnlyCountsDiffer(a.status, job.status)) {
    const absl::Time now = clock_->Now();
    absl::MutexLock l(&mu_);
    auto it = status_written_.find(key);
    if (it != status_written_.end() && now - it->second < options_.status_coalesce) {
      const absl::Duration wait = it->second + options_.status_coalesce - now;
      if (!*requeue_after || wait < **requeue_after) *requeue_after = wait;
      write = false;  // coalesced into a write once the interval has passed
    }
  }
  if (write) {
    // Replace (not merge) so removed keys go too; a conflict means the job
    // changed meanwhile: the caller retries after the cache has it.
    json updated = job.object;
    updated["status"] = a.status;
    auto r = client_->Replace(TrainingJobs(ns, job.name, "status"), updated);
    if (r.ok()) {
      cache_->UpdateJob(*r);
      absl::MutexLock l(&mu_);
      status_written_[key] = clock_->Now();
    } else if (applied.ok()) {
      applied = r.status();
    }
  }
  if (a.delete_job && applied.ok()) {
    Log("operator: ttlSecondsAfterFinished passed: deleting trainingjob ", ns, "/", job.name);
    absl::Status s = client_->Delete(TrainingJobs(ns, job.name), kPropagationBackground);
    if (!s.ok() && !absl::IsNotFound(s)) return s;
    events_.Forget(ns + "/" + job.name);
    return CleanUp(ns, job.name);
  }
  return applied;
}

}  // namespace kubetrain
