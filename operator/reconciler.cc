#include "operator/reconciler.h"

#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "operator/labels.h"
#include "operator/status.h"

namespace kubetrain {
namespace {

using nlohmann::json;

ResourceRef Core(const std::string& plural, const std::string& ns, const std::string& name = "") {
  return {"/api/v1", plural, ns, name, ""};
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
  if (auto cs = TrainingContainerStatus(pod)) {
    p.restart_count = cs->value("restartCount", 0);
    const json terminated = cs->value("/state/terminated"_json_pointer, json());
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

// Runs the calls concurrently (a job's objects are created in parallel, not
// one by one) and returns the first error.
absl::Status RunAll(std::vector<std::function<absl::Status()>> calls) {
  std::vector<std::future<absl::Status>> futures;
  for (auto& c : calls) futures.push_back(std::async(std::launch::async, c));
  absl::Status first;
  for (auto& f : futures) {
    absl::Status s = f.get();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace

ResourceRef TrainingJobs(const std::string& ns, const std::string& name,
                         const std::string& subresource) {
  return {"/apis/kubetrain.io/v1", "trainingjobs", ns, name, subresource};
}

Reconciler::Reconciler(KubeClient* client, OperatorConfig config, const Clock* clock,
                       ProgressReader progress)
    : client_(client), config_(std::move(config)), clock_(clock), progress_(std::move(progress)) {}

absl::Status Reconciler::CleanUpOrphans(const std::string& ns, const std::string& name) {
  // A real cluster's garbage collector removes a deleted job's children via
  // ownerReferences; doing it here too keeps clusters without one clean.
  const std::string selector = JobSelector(name);
  std::vector<std::function<absl::Status()>> calls;
  for (const char* plural : {"pods", "services", "configmaps"}) {
    auto list = client_->List(Core(plural, ns), selector);
    if (!list.ok()) return list.status();
    for (const auto& item : (*list)["items"]) {
      std::string n = item["metadata"]["name"];
      std::string p = plural;
      calls.push_back([this, p, ns, n] {
        absl::Status s = client_->Delete(Core(p, ns, n), kPropagationBackground);
        return absl::IsNotFound(s) ? absl::OkStatus() : s;
      });
    }
  }
  return RunAll(std::move(calls));
}

ReconcileOutcome Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  ReconcileOutcome out;
  auto object = client_->Get(TrainingJobs(ns, name));
  if (absl::IsNotFound(object.status())) {
    out.status = CleanUpOrphans(ns, name);
    return out;
  }
  if (!object.ok()) {
    out.status = object.status();
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

    Observed observed;
    observed.now = clock_->Now();
    const std::string selector = JobSelector(name);
    auto pods = client_->List(Core("pods", ns), selector);
    auto services = client_->List(Core("services", ns), selector);
    auto config_map = client_->Get(Core("configmaps", ns, ConfigMapName(name)));
    if (!pods.ok()) return {pods.status()};
    if (!services.ok()) return {services.status()};
    if (!config_map.ok() && !absl::IsNotFound(config_map.status())) return {config_map.status()};
    observed.config_map_exists = config_map.ok();
    // Live progress comes from whichever task is the chief (the Chief
    // replica's, else worker 0).
    auto spec = ParseTrainingJob(object->dump());
    const std::string chief_type = spec.ok() ? spec->chief_task_type() : "worker";
    std::string chief_ip;
    for (const auto& pod : (*pods)["items"]) {
      if (!OwnedBy(pod, job.uid)) continue;  // not ours (e.g. a previous job of the same name)
      observed.pods.push_back(ObservePod(pod));
      if (observed.pods.back().type == chief_type && observed.pods.back().index == 0) {
        chief_ip = pod.value("/status/podIP"_json_pointer, std::string());
      }
    }
    for (const auto& svc : (*services)["items"]) {
      if (OwnedBy(svc, job.uid)) observed.services.push_back(svc["metadata"]["name"]);
    }
    if (progress_ && !chief_ip.empty()) observed.progress = progress_(chief_ip);

    Actions actions = Desired(job, observed, config_);
    out.status = Apply(job, actions);
    out.requeue_after = actions.requeue_after;
    out.state = actions.status.value("state", "");
    if (actions.delete_job && out.status.ok()) out.state.clear();
  } catch (const json::exception& e) {
    // A malformed object must not take the operator down.
    out.status =
        absl::InvalidArgumentError(absl::StrCat("trainingjob ", ns, "/", name, ": ", e.what()));
  }
  return out;
}

void Reconciler::RecordEvent(const JobObject& job, const JobEvent& e) {
  // Best effort: an event that cannot be written must not fail the reconcile.
  json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"generateName", job.name + "."}, {"namespace", job.namespace_}}},
                {"involvedObject",
                 {{"apiVersion", "kubetrain.io/v1"},
                  {"kind", "TrainingJob"},
                  {"name", job.name},
                  {"namespace", job.namespace_},
                  {"uid", job.uid}}},
                {"reason", e.reason},
                {"message", e.message},
                {"type", e.type},
                {"source", {{"component", "kubetrain-operator"}}},
                {"firstTimestamp", Timestamp(clock_->Now())},
                {"lastTimestamp", Timestamp(clock_->Now())},
                {"count", 1}};
  auto r = client_->Create(Core("events", job.namespace_), event);
  if (!r.ok())
    Log("operator: event ", e.reason, " for ", job.namespace_, "/", job.name,
        " not recorded: ", r.status().message());
}

absl::Status Reconciler::Apply(const JobObject& job, const Actions& a) {
  const std::string& ns = job.namespace_;
  std::vector<std::function<absl::Status()>> calls;
  auto create = [this, ns, &job](const std::string& plural, json object) {
    return [this, ns, plural, object, &job] {
      auto r = client_->Create(Core(plural, ns), object);
      const std::string name = object["metadata"]["name"].get<std::string>();
      if (r.ok()) {
        Log("operator: created ", plural, " ", ns, "/", name);
        if (plural == "pods" || plural == "services") {
          const std::string kind = plural == "pods" ? "Pod" : "Service";
          RecordEvent(job, {"Normal", "SuccessfulCreate" + kind, "Created " + kind + " " + name});
        }
      } else if (!absl::IsAlreadyExists(r.status())) {
        RecordEvent(job,
                    {"Warning", "FailedCreate",
                     absl::StrCat("Creating ", plural, " ", name, ": ", r.status().message())});
      }
      return absl::IsAlreadyExists(r.status()) ? absl::OkStatus() : r.status();
    };
  };
  if (a.create_config_map) calls.push_back(create("configmaps", *a.create_config_map));
  for (const auto& s : a.create_services) calls.push_back(create("services", s));
  // Pods after their Services and ConfigMap exist (below), so DNS and the
  // mounted job file are there when a task starts.
  if (absl::Status s = RunAll(std::move(calls)); !s.ok()) return s;
  calls.clear();
  for (const auto& p : a.create_pods) calls.push_back(create("pods", p));
  for (const auto& name : a.delete_pods) {
    calls.push_back([this, ns, name] {
      absl::Status s = client_->Delete(Core("pods", ns, name), kPropagationBackground);
      if (s.ok()) Log("operator: deleted pod ", ns, "/", name);
      return absl::IsNotFound(s) ? absl::OkStatus() : s;
    });
  }
  absl::Status applied = RunAll(std::move(calls));

  for (const auto& e : a.events) RecordEvent(job, e);

  if (a.status != job.status) {
    // Replace (not merge) so removed keys go too; a conflict means the job
    // changed meanwhile: the caller retries with a fresh read.
    json updated = job.object;
    updated["status"] = a.status;
    auto r = client_->Replace(TrainingJobs(ns, job.name, "status"), updated);
    if (!r.ok() && applied.ok()) applied = r.status();
  }
  if (a.delete_job && applied.ok()) {
    Log("operator: ttlSecondsAfterFinished passed: deleting trainingjob ", ns, "/", job.name);
    absl::Status s = client_->Delete(TrainingJobs(ns, job.name), kPropagationBackground);
    if (!s.ok() && !absl::IsNotFound(s)) return s;
    return CleanUpOrphans(ns, job.name);
  }
  return applied;
}

}  // namespace kubetrain
