// spec.replicaSpecs and spec.runPolicy: parsing, validation, and what the job derives from them.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_spec.h"
#include "core/job_spec_fields.h"
#include "core/quantity.h"

namespace kubetrain {
namespace spec_internal {
namespace {

absl::Status ParseRestartPolicy(const YAML::Node& node, const std::string& path,
                                RestartPolicy* out) {
  std::string s;
  KT_RETURN_IF_ERROR(ToString(node, path, &s));
  if (auto policy = RestartPolicyFromName(s)) {
    *out = *policy;
    return absl::OkStatus();
  }
  return CheckOneOf(path, s, {"Never", "OnFailure", "Always", "ExitCode"});
}

// TFJob accepts replica types in any case and normalises them.
std::string NormalizeReplicaType(const std::string& key) {
  std::string lower = absl::AsciiStrToLower(key);
  if (lower == "ps") return "PS";
  if (lower == "worker") return "Worker";
  if (lower == "chief") return "Chief";
  if (lower == "evaluator") return "Evaluator";
  return "";
}

// The runtime container's resources.limits.cpu (a quantity: "2", 1.5, "500m").
absl::Status ReadCpuLimit(const YAML::Node& container, const std::string& path, ReplicaSpec* out) {
  const YAML::Node resources = container["resources"];
  const YAML::Node limits = resources && resources.IsMap() ? resources["limits"] : YAML::Node();
  const YAML::Node cpu = limits && limits.IsMap() ? limits["cpu"] : YAML::Node();
  if (!cpu || cpu.IsNull()) return absl::OkStatus();
  const std::string cpath = path + ".resources.limits.cpu";
  if (!cpu.IsScalar()) return TypeError(cpath, "a quantity", cpu);
  absl::StatusOr<int64_t> milli = ParseQuantityMilli(cpu.Scalar());
  if (!milli.ok()) return FieldError(cpath, milli.status().message());
  if (*milli <= 0) return FieldError(cpath, absl::StrCat("must be > 0, got ", cpu.Scalar()));
  out->cpu_limit_milli = *milli;
  return absl::OkStatus();
}

// A resource name as Kubernetes spells one: "cpu", "memory",
// "nvidia.com/gpu", "hugepages-2Mi".
bool IsResourceName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' &&
        c != '/') {
      return false;
    }
  }
  return true;
}

// schedulingPolicy.minResources: resource name -> quantity (a string or a number).
absl::Status ReadMinResources(const Fields& f, std::map<std::string, std::string>* out) {
  const YAML::Node* n = f.Get("minResources");
  if (n == nullptr) return absl::OkStatus();
  Fields resources;
  KT_RETURN_IF_ERROR(Fields::Read(*n, f.PathOf("minResources"), {}, &resources));
  for (auto it = n->begin(); it != n->end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string path = resources.PathOf(name);
    if (!IsResourceName(name)) {
      return FieldError(path, "is not a resource name (e.g. cpu, memory, nvidia.com/gpu)");
    }
    if (!it->second.IsScalar()) return TypeError(path, "a quantity", it->second);
    absl::StatusOr<int64_t> q = ParseQuantityMilli(it->second.Scalar());
    if (!q.ok()) return FieldError(path, std::string(q.status().message()));
    out->emplace(name, it->second.Scalar());
  }
  return absl::OkStatus();
}

// runPolicy.schedulingPolicy: TFJob's fields.
absl::Status ParseSchedulingPolicy(const Fields& run_policy, RunPolicy* out) {
  const YAML::Node* n = run_policy.Get("schedulingPolicy");
  if (n == nullptr) return absl::OkStatus();
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(
      *n, run_policy.PathOf("schedulingPolicy"),
      {"minAvailable", "queue", "priorityClass", "scheduleTimeoutSeconds", "minResources"}, &f));
  SchedulingPolicy& p = out->scheduling_policy.emplace();
  KT_RETURN_IF_ERROR(ReadInt32(f, "minAvailable", &p.min_available));
  KT_RETURN_IF_ERROR(ReadString(f, "queue", &p.queue));
  KT_RETURN_IF_ERROR(ReadString(f, "priorityClass", &p.priority_class));
  KT_RETURN_IF_ERROR(ReadInt32(f, "scheduleTimeoutSeconds", &p.schedule_timeout_seconds));
  KT_RETURN_IF_ERROR(ReadMinResources(f, &p.min_resources));
  return absl::OkStatus();
}

// Gang scheduling: the pods must go to one gang scheduler, named by the
// templates (those that name none get it), and each field must be one that
// scheduler's PodGroup has, rather than be ignored.
absl::Status ValidateSchedulingPolicy(const TrainingJob& job) {
  const std::string path = "spec.runPolicy.schedulingPolicy";
  const SchedulingPolicy& p = *job.run_policy.scheduling_policy;
  std::string name, named_by;
  for (const auto& [type, replica] : job.replica_specs) {
    if (replica.scheduler_name.empty()) continue;
    const std::string where =
        absl::StrCat("spec.replicaSpecs.", type, ".template.spec.schedulerName");
    if (!name.empty() && replica.scheduler_name != name) {
      return FieldError(where, absl::StrCat("must be the same in every replica with ", path,
                                            " (one gang scheduler places all tasks), got ",
                                            Quote(replica.scheduler_name), " and ", Quote(name),
                                            " in ", named_by));
    }
    name = replica.scheduler_name;
    named_by = where;
  }
  if (name.empty()) {
    return FieldError(path,
                      "gang scheduling needs the gang scheduler's name: set schedulerName in a "
                      "replica's template.spec (\"volcano\" for Volcano; for scheduler-plugins "
                      "the name its scheduler runs as, e.g. \"scheduler-plugins-scheduler\")");
  }
  const GangScheduler scheduler = GangSchedulerOf(name);
  if (p.min_available.has_value()) {
    KT_RETURN_IF_ERROR(CheckRange(path + ".minAvailable", *p.min_available, 1, job.num_tasks()));
  }
  if (!p.queue.empty()) {
    if (scheduler != GangScheduler::kVolcano) {
      return FieldError(
          path + ".queue",
          absl::StrCat("only Volcano has queues (schedulerName: volcano); the "
                       "pods' scheduler ",
                       Quote(name), " reads scheduler-plugins' PodGroup, which has none"));
    }
    if (!IsDns1123Subdomain(p.queue)) {
      return FieldError(path + ".queue",
                        absl::StrCat("must be a DNS-1123 subdomain, got ", Quote(p.queue)));
    }
  }
  if (!p.priority_class.empty() && !IsDns1123Subdomain(p.priority_class)) {
    return FieldError(path + ".priorityClass",
                      absl::StrCat("must be a DNS-1123 subdomain, got ", Quote(p.priority_class)));
  }
  if (p.schedule_timeout_seconds.has_value()) {
    if (scheduler != GangScheduler::kSchedulerPlugins) {
      return FieldError(path + ".scheduleTimeoutSeconds",
                        "only scheduler-plugins' PodGroup has it; Volcano's has no timeout");
    }
    KT_RETURN_IF_ERROR(
        CheckAtLeast(path + ".scheduleTimeoutSeconds", *p.schedule_timeout_seconds, 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseReplicaSpecs(const YAML::Node& node, const std::string& path,
                               std::map<std::string, ReplicaSpec>* out) {
  if (!node.IsMap()) return TypeError(path, "a mapping", node);
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {
      return FieldError(path, absl::StrCat("keys must be strings, got ", Describe(it->first)));
    }
    const std::string& key = it->first.Scalar();
    std::string type = NormalizeReplicaType(key);
    if (type.empty()) {
      std::string hint = absl::AsciiStrToLower(key) == "master" ? "; use Chief" : "";
      return FieldError(
          Join(path, key),
          absl::StrCat("unknown replica type (known: PS, Worker, Chief, Evaluator)", hint));
    }
    std::string rpath = Join(path, type);
    if (out->count(type) > 0) {
      return FieldError(rpath, "duplicate replica type (keys are case-insensitive)");
    }
    ReplicaSpec spec;
    if (!it->second.IsNull()) {
      Fields f;
      KT_RETURN_IF_ERROR(
          Fields::Read(it->second, rpath, {"replicas", "restartPolicy", "template"}, &f));
      KT_RETURN_IF_ERROR(ReadInt32(f, "replicas", &spec.replicas));
      if (const YAML::Node* n = f.Get("restartPolicy")) {
        KT_RETURN_IF_ERROR(ParseRestartPolicy(*n, f.PathOf("restartPolicy"), &spec.restart_policy));
      }
      if (const YAML::Node* n = f.Get("template")) {
        if (!n->IsMap()) return TypeError(f.PathOf("template"), "a mapping", *n);
        YAML::Emitter emitter;
        emitter << *n;
        if (!emitter.good()) {
          return FieldError(f.PathOf("template"),
                            absl::StrCat("cannot re-emit: ", emitter.GetLastError()));
        }
        spec.template_yaml = emitter.c_str();
        const YAML::Node pod_spec = (*n)["spec"];
        const YAML::Node containers = pod_spec ? pod_spec["containers"] : YAML::Node();
        spec.own_containers = containers && containers.IsSequence() && containers.size() > 0;
        for (size_t i = 0; spec.own_containers && i < containers.size(); ++i) {
          const YAML::Node& c = containers[i];
          const std::string name =
              c.IsMap() && c["name"] && c["name"].IsScalar() ? c["name"].Scalar() : std::string();
          if (IsRuntimeContainer(name, c.IsMap() && c["command"])) {
            spec.own_containers = false;
            KT_RETURN_IF_ERROR(ReadCpuLimit(
                c, absl::StrCat(f.PathOf("template"), ".spec.containers[", i, "]"), &spec));
          }
        }
        // What gang scheduling needs to know of the pods (the rest of the
        // template is the API server's to validate).
        if (pod_spec && pod_spec.IsMap()) {
          const std::string spec_path = Join(f.PathOf("template"), "spec");
          for (auto [key, out] : {std::pair{"schedulerName", &spec.scheduler_name},
                                  std::pair{"priorityClassName", &spec.priority_class_name}}) {
            const YAML::Node v = pod_spec[key];
            if (v && !v.IsNull()) KT_RETURN_IF_ERROR(ToString(v, Join(spec_path, key), out));
          }
        }
      }
    }
    out->emplace(type, std::move(spec));
  }
  return absl::OkStatus();
}

absl::Status ParseRunPolicy(const Fields& spec, RunPolicy* out) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(
      ReadSection(spec, "runPolicy",
                  {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                   "backoffLimit", "suspend", "schedulingPolicy"},
                  &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadString(f, "cleanPodPolicy", &out->clean_pod_policy));
  KT_RETURN_IF_ERROR(ReadInt64(f, "ttlSecondsAfterFinished", &out->ttl_seconds_after_finished));
  KT_RETURN_IF_ERROR(ReadInt64(f, "activeDeadlineSeconds", &out->active_deadline_seconds));
  KT_RETURN_IF_ERROR(ReadInt32(f, "backoffLimit", &out->backoff_limit));
  KT_RETURN_IF_ERROR(ReadBool(f, "suspend", &out->suspend));
  return ParseSchedulingPolicy(f, out);
}

absl::Status ValidateReplicas(const TrainingJob& job) {
  static const std::vector<std::string> kTypes = {"PS", "Worker", "Chief", "Evaluator"};
  for (const auto& [type, spec] : job.replica_specs) {
    std::string path = Join("spec.replicaSpecs", type);
    if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
      return FieldError(path, "unknown replica type (known: PS, Worker, Chief, Evaluator)");
    }
    std::string rpath = Join(path, "replicas");
    if (type == "PS" || type == "Worker") {
      KT_RETURN_IF_ERROR(CheckRange(rpath, spec.replicas, 1, kMaxReplicas));
    } else if (spec.replicas != 1) {
      return FieldError(rpath, absl::StrCat("must be 1, got ", spec.replicas));
    }
  }
  for (const char* required : {"PS", "Worker"}) {
    if (job.replica_specs.count(required) == 0) {
      return FieldError(Join("spec.replicaSpecs", required), "required");
    }
  }
  return absl::OkStatus();
}

// spec.runPolicy (its schedulingPolicy against the replicas' scheduler).
absl::Status ValidateRunPolicy(const TrainingJob& job) {
  const RunPolicy& rp = job.run_policy;
  KT_RETURN_IF_ERROR(
      CheckOneOf("spec.runPolicy.cleanPodPolicy", rp.clean_pod_policy, {"All", "Running", "None"}));
  if (rp.ttl_seconds_after_finished.has_value()) {
    KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>("spec.runPolicy.ttlSecondsAfterFinished",
                                             *rp.ttl_seconds_after_finished, 0));
  }
  if (rp.active_deadline_seconds.has_value()) {
    KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>("spec.runPolicy.activeDeadlineSeconds",
                                             *rp.active_deadline_seconds, 1));
  }
  if (rp.backoff_limit.has_value()) {
    KT_RETURN_IF_ERROR(CheckAtLeast("spec.runPolicy.backoffLimit", *rp.backoff_limit, 0));
  }
  if (rp.scheduling_policy.has_value()) KT_RETURN_IF_ERROR(ValidateSchedulingPolicy(job));
  return absl::OkStatus();
}

}  // namespace spec_internal

using namespace spec_internal;  // NOLINT(build/namespaces): this section's helpers

int ReplicaSpec::threads() const {
  if (cpu_limit_milli <= 0) return 1;
  return static_cast<int>(std::clamp<int64_t>(cpu_limit_milli / 1000, 1, 1024));
}

int TrainingJob::num_ps() const {
  auto it = replica_specs.find("PS");
  return it == replica_specs.end() ? 0 : it->second.replicas;
}

int TrainingJob::num_workers() const {
  auto it = replica_specs.find("Worker");
  return it == replica_specs.end() ? 0 : it->second.replicas;
}

int TrainingJob::num_tasks() const {
  int n = 0;
  for (const auto& [type, replica] : replica_specs) n += replica.replicas;
  return n;
}

std::string TrainingJob::scheduler_name() const {
  for (const auto& [type, replica] : replica_specs) {
    if (!replica.scheduler_name.empty()) return replica.scheduler_name;
  }
  return "";
}

int TrainingJob::min_available() const {
  const auto& p = run_policy.scheduling_policy;
  return p.has_value() && p->min_available.has_value() ? *p->min_available : num_tasks();
}

GangScheduler GangSchedulerOf(const std::string& scheduler_name) {
  return scheduler_name == "volcano" ? GangScheduler::kVolcano : GangScheduler::kSchedulerPlugins;
}

const char* GangSchedulerName(GangScheduler scheduler) {
  return scheduler == GangScheduler::kVolcano ? "volcano" : "scheduler-plugins";
}

int TrainingJob::effective_replicas_to_aggregate() const {
  return training.replicas_to_aggregate > 0 ? training.replicas_to_aggregate : num_workers();
}

const char* RestartPolicyName(RestartPolicy policy) {
  switch (policy) {
    case RestartPolicy::kNever:
      return "Never";
    case RestartPolicy::kOnFailure:
      return "OnFailure";
    case RestartPolicy::kAlways:
      return "Always";
    case RestartPolicy::kExitCode:
      return "ExitCode";
  }
  return "unknown";
}

std::optional<RestartPolicy> RestartPolicyFromName(const std::string& name) {
  for (auto policy : {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways,
                      RestartPolicy::kExitCode}) {
    if (name == RestartPolicyName(policy)) return policy;
  }
  return std::nullopt;
}

bool IsRetryable(RestartPolicy policy, int exit_code) {
  if (exit_code == 0) return false;
  switch (policy) {
    case RestartPolicy::kNever:
      return false;
    case RestartPolicy::kOnFailure:
    case RestartPolicy::kAlways:
      return true;
    case RestartPolicy::kExitCode:
      return exit_code >= 128;
  }
  return false;
}

}  // namespace kubetrain
