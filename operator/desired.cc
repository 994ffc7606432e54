#include "operator/desired.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

using nlohmann::json;

constexpr char kJobLabel[] = "kubetrain.io/job-name";
constexpr char kTypeLabel[] = "kubetrain.io/replica-type";
constexpr char kIndexLabel[] = "kubetrain.io/replica-index";
constexpr char kConfigFile[] = "trainingjob.yaml";
// The container kubetrain injects TF_CONFIG into when a template has several.
constexpr const char* kTrainingContainerNames[] = {"kubetrain", "tensorflow"};
// Replica types in the order pods are listed in TF_CONFIG and status.
constexpr const char* kReplicaKeys[] = {"Chief", "PS", "Worker", "Evaluator"};

std::string Timestamp(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::optional<absl::Time> ParseTimestamp(const json& v) {
  if (!v.is_string()) return std::nullopt;
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, v.get<std::string>(), &t, &err)) return std::nullopt;
  return t;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The replica spec object for `key` in the raw job, matching keys case-insensitively
// as the parser does.
json RawReplicaSpec(const json& object, const std::string& key) {
  const json& specs = object.value("/spec/replicaSpecs"_json_pointer, json::object());
  for (auto& [k, v] : specs.items()) {
    if (Lower(k) == Lower(key)) return v;
  }
  return json::object();
}

bool ConditionTrue(const json& status, const std::string& type) {
  if (!status.contains("conditions")) return false;
  for (const auto& c : status["conditions"]) {
    if (c.value("type", "") == type) return c.value("status", "") == "True";
  }
  return false;
}

// Sets a condition, keeping lastTransitionTime when its status does not change.
void SetCondition(json* status, const std::string& type, bool value, const std::string& reason,
                  const std::string& message, absl::Time now) {
  json& conds = (*status)["conditions"];
  if (!conds.is_array()) conds = json::array();
  const std::string s = value ? "True" : "False";
  for (auto& c : conds) {
    if (c.value("type", "") != type) continue;
    if (c.value("status", "") != s) c["lastTransitionTime"] = Timestamp(now);
    if (c.value("status", "") != s || c.value("reason", "") != reason || c.value("message", "") != message) {
      c["lastUpdateTime"] = Timestamp(now);
    }
    c["status"] = s;
    c["reason"] = reason;
    c["message"] = message;
    return;
  }
  if (!value) return;  // an absent condition is already false
  conds.push_back({{"type", type},
                   {"status", s},
                   {"reason", reason},
                   {"message", message},
                   {"lastUpdateTime", Timestamp(now)},
                   {"lastTransitionTime", Timestamp(now)}});
}

std::string StateOf(const json& status) {
  for (const char* t : {"Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created"}) {
    if (ConditionTrue(status, t)) return t;
  }
  return "Pending";
}

bool Finished(const json& status) {
  return ConditionTrue(status, "Succeeded") || ConditionTrue(status, "Failed");
}

// Pods to delete when the job is over (or suspended), per cleanPodPolicy.
std::vector<std::string> PodsToClean(const std::vector<ObservedPod>& pods, const std::string& policy) {
  std::vector<std::string> out;
  for (const auto& p : pods) {
    if (p.deleting) continue;
    bool active = p.phase == "Running" || p.phase == "Pending" || p.phase.empty();
    if (policy == "All" || (policy == "Running" && active)) out.push_back(p.name);
  }
  return out;
}

void Finish(Actions* a, const std::string& type, const std::string& reason, const std::string& message,
            const std::vector<ObservedPod>& pods, const std::string& clean_policy, absl::Time now) {
  SetCondition(&a->status, "Running", false, reason, message, now);
  SetCondition(&a->status, "Restarting", false, reason, message, now);
  SetCondition(&a->status, type, true, reason, message, now);
  a->status["completionTime"] = Timestamp(now);
  a->events.push_back({type == "Failed" ? "Warning" : "Normal", reason, message});
  a->delete_pods = PodsToClean(pods, clean_policy);
}

// The job as controller of an object: garbage-collected with it, and how the
// operator tells its own objects from others of the same name.
json OwnerReferences(const JobObject& job) {
  return json::array({{{"apiVersion", "kubetrain.io/v1"},
                       {"kind", "TrainingJob"},
                       {"name", job.name},
                       {"uid", job.uid},
                       {"controller", true},
                       {"blockOwnerDeletion", true}}});
}

}  // namespace

std::string ReplicaName(const std::string& job, const std::string& type, int index) {
  return absl::StrCat(job, "-", type, "-", index);
}

std::string ReplicaTypeLabel(const std::string& spec_key) { return Lower(spec_key); }

TfConfig BuildTfConfig(const std::string& job, const std::string& ns, const TrainingJob& spec,
                       const std::string& type, int index, const OperatorConfig& config) {
  TfConfig tf;
  for (const auto& [key, replica] : spec.replica_specs) {
    const std::string t = ReplicaTypeLabel(key);
    auto& hosts = tf.cluster[t];
    for (int i = 0; i < replica.replicas; ++i) {
      std::string host = absl::StrCat(ReplicaName(job, t, i), ".", ns, ".svc");
      if (!config.cluster_domain.empty()) absl::StrAppend(&host, ".", config.cluster_domain);
      hosts.push_back(absl::StrCat(host, ":", config.port));
    }
  }
  tf.task_type = type;
  tf.task_index = index;
  return tf;
}

json BuildService(const JobObject& job, const std::string& type, int index, const OperatorConfig& config) {
  const std::string name = ReplicaName(job.name, type, index);
  json selector = {{kJobLabel, job.name}, {kTypeLabel, type}, {kIndexLabel, std::to_string(index)}};
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", name},
            {"namespace", job.namespace_},
            {"labels", selector},
            {"ownerReferences",
             OwnerReferences(job)}}},
          {"spec",
           {{"clusterIP", "None"},
            {"publishNotReadyAddresses", true},  // DNS resolves before the pod is ready
            {"selector", selector},
            {"ports", json::array({{{"name", "kubetrain"}, {"port", config.port}, {"targetPort", config.port}}})}}}};
}

json BuildConfigMap(const JobObject& job) {
  // JSON is YAML: the tasks read this file with the same parser as kubetrain run.
  json doc = {{"apiVersion", job.object.value("apiVersion", "kubetrain.io/v1")},
              {"kind", "TrainingJob"},
              {"metadata", {{"name", job.name}, {"namespace", job.namespace_}}},
              {"spec", job.object.value("spec", json::object())}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", job.name + "-config"},
            {"namespace", job.namespace_},
            {"labels", {{kJobLabel, job.name}}},
            {"ownerReferences",
             OwnerReferences(job)}}},
          {"data", {{kConfigFile, doc.dump(2) + "\n"}}}};
}

json BuildPod(const JobObject& job, const TrainingJob& spec, const std::string& spec_key, int index,
              const OperatorConfig& config) {
  const std::string type = ReplicaTypeLabel(spec_key);
  const ReplicaSpec& replica = spec.replica_specs.at(spec_key);
  json tmpl = RawReplicaSpec(job.object, spec_key).value("template", json::object());
  json pod_spec = tmpl.value("spec", json::object());
  json labels = tmpl.value("/metadata/labels"_json_pointer, json::object());
  labels[kJobLabel] = job.name;
  labels[kTypeLabel] = type;
  labels[kIndexLabel] = std::to_string(index);
  json annotations = tmpl.value("/metadata/annotations"_json_pointer, json::object());

  const std::string tf_config =
      SerializeTfConfig(BuildTfConfig(job.name, job.namespace_, spec, type, index, config));
  json& containers = pod_spec["containers"];
  if (!containers.is_array() || containers.empty()) {
    // The kubetrain runtime: PS or worker, reading the job from the ConfigMap.
    const bool ps = type == "ps";
    json args = json::array({absl::StrCat("--config=", config.config_dir, "/", kConfigFile),
                             absl::StrCat("--metrics_address=$(POD_IP):", config.metrics_port)});
    if (ps) args.push_back("--bind_host=$(POD_IP)");
    if (!ps && index == 0) args.push_back("--result_file=/dev/termination-log");
    containers = json::array({{{"name", "kubetrain"},
                               {"image", config.runtime_image},
                               {"imagePullPolicy", config.image_pull_policy},
                               {"command", json::array({ps ? "kubetrain-ps" : "kubetrain-worker"})},
                               {"args", args},
                               {"ports", json::array({{{"name", "kubetrain"}, {"containerPort", config.port}},
                                                      {{"name", "metrics"}, {"containerPort", config.metrics_port}}})},
                               {"volumeMounts", json::array({{{"name", "kubetrain-config"},
                                                              {"mountPath", config.config_dir},
                                                              {"readOnly", true}}})}}});
    json& volumes = pod_spec["volumes"];
    if (!volumes.is_array()) volumes = json::array();
    volumes.push_back({{"name", "kubetrain-config"}, {"configMap", {{"name", job.name + "-config"}}}});
  }
  // TF_CONFIG (and the pod IP) go into the training container: the one named
  // kubetrain or tensorflow, else the first.
  size_t target = 0;
  for (size_t i = 0; i < containers.size(); ++i) {
    const std::string n = containers[i].value("name", "");
    for (const char* want : kTrainingContainerNames) {
      if (n == want) target = i;
    }
  }
  json& env = containers[target]["env"];
  if (!env.is_array()) env = json::array();
  env.erase(std::remove_if(env.begin(), env.end(),
                           [](const json& e) {
                             const std::string n = e.value("name", "");
                             return n == "TF_CONFIG" || n == "POD_IP";
                           }),
            env.end());
  env.insert(env.begin(), json{{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}});
  env.push_back({{"name", "TF_CONFIG"}, {"value", tf_config}});
  // OnFailure/Always: the kubelet restarts in place. Never/ExitCode: the
  // operator decides, from the exit code, whether to recreate the pod.
  pod_spec["restartPolicy"] =
      replica.restart_policy == RestartPolicy::kOnFailure || replica.restart_policy == RestartPolicy::kAlways
          ? RestartPolicyName(replica.restart_policy)
          : "Never";
  json metadata = {{"name", ReplicaName(job.name, type, index)},
                   {"namespace", job.namespace_},
                   {"labels", labels},
                   {"ownerReferences",
                    OwnerReferences(job)}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", metadata}, {"spec", pod_spec}};
}

Actions Desired(const JobObject& job, const Observed& observed, const OperatorConfig& config) {
  Actions a;
  const absl::Time now = observed.now;
  a.status = job.status.is_object() ? job.status : json::object();
  a.status["observedGeneration"] = job.generation;
  if (job.deleting) return a;  // the garbage collector removes the children

  if (!ConditionTrue(a.status, "Created")) {
    SetCondition(&a.status, "Created", true, "TrainingJobCreated",
                 absl::StrCat("TrainingJob ", job.name, " is created."), now);
    a.events.push_back({"Normal", "TrainingJobCreated", absl::StrCat("TrainingJob ", job.name, " is created.")});
  }
  auto parsed = ParseTrainingJob(job.object.dump());
  if (!parsed.ok()) {
    // What the schema could not express: report it, create nothing.
    const std::string message(parsed.status().message());
    if (!ConditionTrue(a.status, "Failed")) {
      Finish(&a, "Failed", "InvalidSpec", message, observed.pods, "None", now);
    }
    a.status["state"] = StateOf(a.status);
    return a;
  }
  const TrainingJob& spec = *parsed;
  const RunPolicy& policy = spec.run_policy;

  if (Finished(a.status)) {
    // After success, PS tasks exit by themselves once the chief ends the job:
    // give them config.cleanup_grace before cleanPodPolicy removes what is left.
    auto done_at = ParseTimestamp(a.status.value("completionTime", json()));
    const absl::Time clean_at = ConditionTrue(a.status, "Succeeded") && done_at
                                    ? *done_at + config.cleanup_grace
                                    : absl::InfinitePast();
    if (now >= clean_at) {
      a.delete_pods = PodsToClean(observed.pods, policy.clean_pod_policy);
    } else {
      a.requeue_after = clean_at - now;
    }
    if (policy.ttl_seconds_after_finished) {
      if (auto done = ParseTimestamp(a.status.value("completionTime", json()))) {
        absl::Time due = *done + absl::Seconds(*policy.ttl_seconds_after_finished);
        if (now >= due) {
          a.delete_job = true;
        } else if (!a.requeue_after || due - now < *a.requeue_after) {
          a.requeue_after = due - now;
        }
      }
    }
    a.status["state"] = StateOf(a.status);
    return a;
  }

  if (policy.suspend) {
    for (const auto& p : observed.pods) {
      if (!p.deleting) a.delete_pods.push_back(p.name);
    }
    if (!ConditionTrue(a.status, "Suspended")) {
      a.events.push_back({"Normal", "TrainingJobSuspended", absl::StrCat("TrainingJob ", job.name, " is suspended.")});
    }
    SetCondition(&a.status, "Running", false, "TrainingJobSuspended", "suspended", now);
    SetCondition(&a.status, "Restarting", false, "TrainingJobSuspended", "suspended", now);
    SetCondition(&a.status, "Suspended", true, "TrainingJobSuspended", absl::StrCat("TrainingJob ", job.name, " is suspended."), now);
    a.status.erase("startTime");  // the deadline counts from the resume
    a.status["state"] = StateOf(a.status);
    return a;
  }
  if (ConditionTrue(a.status, "Suspended")) {
    SetCondition(&a.status, "Suspended", false, "TrainingJobResumed", absl::StrCat("TrainingJob ", job.name, " is resumed."), now);
    a.events.push_back({"Normal", "TrainingJobResumed", absl::StrCat("TrainingJob ", job.name, " is resumed.")});
  }

  if (!observed.config_map_exists) a.create_config_map = BuildConfigMap(job);
  if (!a.status.contains("startTime")) a.status["startTime"] = Timestamp(now);
  const absl::Time start = ParseTimestamp(a.status["startTime"]).value_or(now);
  if (policy.active_deadline_seconds) {
    absl::Time due = start + absl::Seconds(*policy.active_deadline_seconds);
    if (now >= due) {
      // The job's time is up: its running tasks stop even with cleanPodPolicy None.
      Finish(&a, "Failed", "DeadlineExceeded",
             absl::StrCat("TrainingJob ", job.name, " ran longer than activeDeadlineSeconds (",
                          *policy.active_deadline_seconds, " s)."),
             observed.pods, policy.clean_pod_policy == "All" ? "All" : "Running", now);
      a.status["state"] = StateOf(a.status);
      return a;
    }
    a.requeue_after = due - now;
  }

  std::map<std::string, const ObservedPod*> pods;
  for (const auto& p : observed.pods) pods[p.name] = &p;
  std::set<std::string> services(observed.services.begin(), observed.services.end());
  std::set<std::string> wanted;
  bool restarting = false, running = false;
  std::string failure;
  int64_t restarts_total = 0;
  json& replica_statuses = a.status["replicaStatuses"];
  if (!replica_statuses.is_object()) replica_statuses = json::object();

  for (const char* key : kReplicaKeys) {
    auto it = spec.replica_specs.find(key);
    if (it == spec.replica_specs.end()) continue;
    const ReplicaSpec& replica = it->second;
    const std::string type = ReplicaTypeLabel(key);
    json& rs = replica_statuses[key];
    if (!rs.is_object()) rs = json::object();
    int64_t recreated = rs.value("recreated", int64_t{0});
    int active = 0, succeeded = 0, failed = 0, in_place = 0;
    for (int i = 0; i < replica.replicas; ++i) {
      const std::string name = ReplicaName(job.name, type, i);
      wanted.insert(name);
      if (!services.count(name)) a.create_services.push_back(BuildService(job, type, i, config));
      auto pit = pods.find(name);
      if (pit == pods.end()) {
        a.create_pods.push_back(BuildPod(job, spec, key, i, config));
        continue;
      }
      const ObservedPod& pod = *pit->second;
      in_place += pod.restart_count;
      if (pod.deleting) continue;
      if (pod.phase == "Running") ++active;
      if (pod.phase == "Succeeded") ++succeeded;
      if (pod.phase != "Failed") continue;
      // No terminated state: the pod was lost (evicted, node gone) - retryable, as in TFJob.
      const int code = pod.exit_code.value_or(137);
      if (IsRetryable(replica.restart_policy, code)) {
        a.delete_pods.push_back(name);
        ++recreated;
        restarting = true;
        a.events.push_back({"Warning", "TrainingJobRestarting",
                            absl::StrCat("Pod ", name, " exited with code ", code, "; recreating it (restartPolicy ",
                                         RestartPolicyName(replica.restart_policy), ")")});
      } else {
        ++failed;
        if (failure.empty()) {
          failure = absl::StrCat("TrainingJob ", job.name, " has failed because ", key, " replica ", i, " (pod ",
                                 name, ") exited with code ", code, " (restartPolicy ",
                                 RestartPolicyName(replica.restart_policy), ").");
        }
      }
    }
    rs["active"] = active;
    rs["succeeded"] = succeeded;
    rs["failed"] = failed;
    rs["recreated"] = recreated;
    rs["restarts"] = recreated + in_place;
    restarts_total += recreated + in_place;
    running = running || active > 0;
  }
  // Pods of replicas that no longer exist (scaled down).
  for (const auto& p : observed.pods) {
    if (!wanted.count(p.name) && !p.deleting) a.delete_pods.push_back(p.name);
  }
  if (observed.progress) a.status["progress"] = *observed.progress;

  if (!failure.empty()) {
    Finish(&a, "Failed", "TrainingJobFailed", failure, observed.pods, policy.clean_pod_policy, now);
    a.create_pods.clear();
  } else if (policy.backoff_limit && restarts_total > *policy.backoff_limit) {
    Finish(&a, "Failed", "BackoffLimitExceeded",
           absl::StrCat("TrainingJob ", job.name, " has failed because it reached backoffLimit (",
                        *policy.backoff_limit, " restarts; ", restarts_total, " so far)."),
           observed.pods, policy.clean_pod_policy, now);
    a.create_pods.clear();
  } else {
    // Success: the chief (or worker 0), or every worker with AllWorkers.
    const bool has_chief = spec.replica_specs.count("Chief") > 0;
    const std::string chief = has_chief ? ReplicaName(job.name, "chief", 0) : ReplicaName(job.name, "worker", 0);
    auto succeeded = [&](const std::string& name) {
      auto pit = pods.find(name);
      return pit != pods.end() && pit->second->phase == "Succeeded";
    };
    bool done = succeeded(chief);
    if (spec.success_policy == "AllWorkers") {
      done = true;
      for (int i = 0; i < spec.num_workers(); ++i) done = done && succeeded(ReplicaName(job.name, "worker", i));
    }
    if (done) {
      auto pit = pods.find(chief);
      if (pit != pods.end() && !pit->second->termination_message.empty()) {
        auto result = json::parse(pit->second->termination_message, nullptr, false);
        if (result.is_object()) a.status["result"] = result;
      }
      Finish(&a, "Succeeded", "TrainingJobSucceeded", absl::StrCat("TrainingJob ", job.name, " successfully completed."),
             observed.pods, policy.clean_pod_policy, now);
      a.delete_pods.clear();  // cleanPodPolicy applies after the grace period (above)
      a.requeue_after = config.cleanup_grace;
      a.create_pods.clear();
      // The final figures, for `kubectl get tj` and dashboards.
      if (a.status.contains("result")) {
        const json& r = a.status["result"];
        json& p = a.status["progress"];
        if (!p.is_object()) p = json::object();
        if (r.contains("global_step")) p["globalStep"] = r["global_step"];
        if (r.contains("target_steps")) p["targetSteps"] = r["target_steps"];
        if (r.contains("test_accuracy")) p["accuracy"] = r["test_accuracy"];
        if (r.contains("final_loss")) p["loss"] = r["final_loss"];
        if (r.contains("examples_per_second")) p["examplesPerSecond"] = r["examples_per_second"];
      }
    } else if (restarting) {
      SetCondition(&a.status, "Running", false, "TrainingJobRestarting", "a replica is being recreated", now);
      SetCondition(&a.status, "Restarting", true, "TrainingJobRestarting",
                   absl::StrCat("TrainingJob ", job.name, " is restarting a replica."), now);
    } else if (running) {
      SetCondition(&a.status, "Restarting", false, "TrainingJobRunning", "running", now);
      SetCondition(&a.status, "Running", true, "TrainingJobRunning", absl::StrCat("TrainingJob ", job.name, " is running."), now);
      // Progress comes from the chief, not from events: look again soon.
      if (!a.requeue_after || config.progress_interval < *a.requeue_after) a.requeue_after = config.progress_interval;
    }
  }
  a.status["state"] = StateOf(a.status);
  return a;
}

}  // namespace kubetrain
