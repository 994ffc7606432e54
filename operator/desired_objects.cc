// Desired(), creation: the Service, Pod and ConfigMap objects of a job.
#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/cluster_spec.h"
#include "core/log.h"
#include "operator/desired.h"
#include "operator/desired_internal.h"

namespace kubetrain {
namespace {

using nlohmann::json;

json TaskLabels(const std::string& job, const std::string& type, int index) {
  return {
      {kJobNameLabel, job}, {kReplicaTypeLabel, type}, {kReplicaIndexLabel, std::to_string(index)}};
}

// The kubetrain runtime container: kubetrain-ps for ps tasks, kubetrain-worker
// for worker, chief and evaluator tasks, reading the job from the ConfigMap.
json RuntimeContainer(const TrainingJob& spec, const std::string& type, int index,
                      bool with_credentials, const OperatorConfig& config) {
  const bool ps = type == "ps";
  json args = json::array({absl::StrCat("--config=", config.config_dir, "/", kConfigFileName),
                           absl::StrCat("--metrics_address=$(POD_IP):", config.metrics_port)});
  // A PS listens on every address of its pod (as TensorFlow's servers do), so
  // that `kubectl port-forward`, which connects to the pod's localhost, reaches
  // it: how the model is saved from PS tasks that hold it (desired_hold.cc).
  // The chief reports its result through the termination message.
  if (spec.IsChiefTask(type, index)) {
    args.push_back(absl::StrCat("--result_file=", kTerminationLogPath));
  }
  json env = json::array({{{"name", kTerminationLogEnv}, {"value", kTerminationLogPath}}});
  json ports = json::array({{{"name", "kubetrain"}, {"containerPort", config.port}},
                            {{"name", "metrics"}, {"containerPort", config.metrics_port}}});
  if (ps && config.bulk_port > 0) {
    // The bulk data plane: the job's NetworkPolicy admits its own tasks on
    // any port, so nothing else opens for it.
    env.push_back({{"name", kBulkPortEnv}, {"value", std::to_string(config.bulk_port)}});
    ports.push_back({{"name", "bulk"}, {"containerPort", config.bulk_port}});
  }
  json mounts = json::array(
      {{{"name", "kubetrain-config"}, {"mountPath", config.config_dir}, {"readOnly", true}}});
  if (with_credentials) {
    env.push_back({{"name", kAuthDirEnv}, {"value", config.auth_dir}});
    mounts.push_back({{"name", desired_internal::kAuthVolumeName},
                      {"mountPath", config.auth_dir},
                      {"readOnly", true}});
  } else if (ps) {
    // Only a job started without credentials (RunningWithoutCredentials):
    // its running workers hold no token, so a PS started again must run open
    // as its peers do, which kubetrain-ps refuses unless told so. An
    // environment variable, not --insecure: an older runtime ignores it.
    env.push_back({{"name", kInsecureEnv}, {"value", "1"}});
  }
  return {{"name", "kubetrain"},
          {"image", config.runtime_image},
          {"imagePullPolicy", config.image_pull_policy},
          {"command", json::array({ps ? "kubetrain-ps" : "kubetrain-worker"})},
          {"args", args},
          // A fatal error's reason becomes the termination message (the
          // Restarting and Failed conditions quote it). An environment
          // variable, not a flag: a runtime image older than the operator
          // ignores it instead of refusing to start.
          // The credentials' directory likewise (core/job_credentials.h).
          {"env", env},
          {"ports", ports},
          {"volumeMounts", mounts}};
}

bool IsRuntimeContainerJson(const json& c) {
  return c.is_object() && IsRuntimeContainer(c.value("name", ""), c.contains("command"));
}

// The runtime container with the user's `kubetrain` container laid over it:
// the user's fields win, except that the operator's flags come first (the
// user's args follow them), its env, ports and job-file mount are kept beside
// the user's, and an image left out is the operator's runtime image.
json CustomisedRuntimeContainer(const json& runtime, const json& user) {
  json c = user;
  c["command"] = runtime["command"];
  json args = runtime["args"];
  for (const json& a : user.value("args", json::array())) args.push_back(a);
  c["args"] = args;
  if (c.value("image", "").empty()) {
    c["image"] = runtime["image"];
    c["imagePullPolicy"] = runtime["imagePullPolicy"];
  }
  for (const char* list : {"env", "ports", "volumeMounts"}) {
    json merged = runtime[list];
    for (const json& e : user.value(list, json::array())) merged.push_back(e);
    c[list] = merged;
  }
  return c;
}

}  // namespace

namespace desired_internal {

// The replica spec object for `key` in the raw job, matching keys case-insensitively
// as the parser does.
json RawReplicaSpec(const json& object, const std::string& key) {
  const json& specs = object.value("/spec/replicaSpecs"_json_pointer, json::object());
  for (auto& [k, v] : specs.items()) {
    if (absl::AsciiStrToLower(k) == absl::AsciiStrToLower(key)) return v;
  }
  return json::object();
}

json OwnerReferences(const JobObject& job) {
  return json::array({{{"apiVersion", "kubetrain.io/v1"},
                       {"kind", "TrainingJob"},
                       {"name", job.name},
                       {"uid", job.uid},
                       {"controller", true},
                       {"blockOwnerDeletion", true}}});
}

json JobObjectMetadata(const JobObject& job, const std::string& name) {
  return {{"name", name},
          {"namespace", job.namespace_},
          {"labels", {{kJobNameLabel, job.name}}},
          {"ownerReferences", OwnerReferences(job)}};
}
}  // namespace desired_internal

using desired_internal::OwnerReferences;
using desired_internal::RawReplicaSpec;

TaskAddress ServiceAddress(const std::string& job, const std::string& ns,
                           const OperatorConfig& config) {
  return [=](const JobTask& t) {
    std::string host = absl::StrCat(ReplicaName(job, t.type, t.index), ".", ns, ".svc");
    if (!config.cluster_domain.empty()) absl::StrAppend(&host, ".", config.cluster_domain);
    return absl::StrCat(host, ":", config.port);
  };
}

json BuildService(const JobObject& job, const std::string& type, int index,
                  const OperatorConfig& config) {
  const json selector = TaskLabels(job.name, type, index);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", ReplicaName(job.name, type, index)},
            {"namespace", job.namespace_},
            {"labels", selector},
            {"ownerReferences", OwnerReferences(job)}}},
          {"spec",
           {{"clusterIP", "None"},
            {"publishNotReadyAddresses", true},  // DNS resolves before the pod is ready
            {"selector", selector},
            {"ports",
             json::array(
                 {{{"name", "kubetrain"}, {"port", config.port}, {"targetPort", config.port}}})}}}};
}

json BuildConfigMap(const JobObject& job) {
  // JSON is YAML: the tasks read this file with the same parser as kubetrain run.
  json doc = {{"apiVersion", job.object.value("apiVersion", "kubetrain.io/v1")},
              {"kind", "TrainingJob"},
              {"metadata", {{"name", job.name}, {"namespace", job.namespace_}}},
              {"spec", job.object.value("spec", json::object())}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", desired_internal::JobObjectMetadata(job, ConfigMapName(job.name))},
          {"data", {{kConfigFileName, doc.dump(2) + "\n"}}}};
}

json BuildPod(const JobObject& job, const TrainingJob& spec, const std::string& spec_key, int index,
              PodCredentials credentials, const OperatorConfig& config) {
  const std::string type = TaskTypeOf(spec_key);
  const ReplicaSpec& replica = spec.replica_specs.at(spec_key);
  json tmpl = RawReplicaSpec(job.object, spec_key).value("template", json::object());
  json pod_spec = tmpl.value("spec", json::object());
  json labels = tmpl.value("/metadata/labels"_json_pointer, json::object());
  labels.update(TaskLabels(job.name, type, index));
  json annotations = tmpl.value("/metadata/annotations"_json_pointer, json::object());
  desired_internal::DecorateGangPod(job, spec, type, &labels, &annotations, &pod_spec);
  const bool with_credentials = credentials != PodCredentials::kNone;

  const std::string tf_config = SerializeTfConfig(
      BuildTfConfig(spec, ServiceAddress(job.name, job.namespace_, config), {type, index}));
  json& containers = pod_spec["containers"];
  if (!containers.is_array() || containers.empty()) {
    containers = json::array({RuntimeContainer(spec, type, index, with_credentials, config)});
  } else if (auto it = std::find_if(containers.begin(), containers.end(), IsRuntimeContainerJson);
             it != containers.end()) {
    *it = CustomisedRuntimeContainer(RuntimeContainer(spec, type, index, with_credentials, config),
                                     *it);
  }
  if (!replica.own_containers) {
    json& volumes = pod_spec["volumes"];
    if (!volumes.is_array()) volumes = json::array();
    volumes.push_back(
        {{"name", "kubetrain-config"}, {"configMap", {{"name", ConfigMapName(job.name)}}}});
    if (with_credentials) {
      volumes.push_back(desired_internal::AuthVolume(job, type, index,
                                                     credentials == PodCredentials::kTokenAndTls));
      annotations[kAuthSecretAnnotation] = AuthSecretName(job.name);
    }
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
  env.insert(env.begin(), json{{"name", "POD_IP"},
                               {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}});
  env.push_back({{"name", "TF_CONFIG"}, {"value", tf_config}});
  // A task that dies without writing its termination message (a crash, a
  // user's program) still says why: the tail of its log.
  if (!containers[target].contains("terminationMessagePolicy")) {
    containers[target]["terminationMessagePolicy"] = "FallbackToLogsOnError";
  }
  // A stopped PS task writes its final checkpoint, or holds the parameters
  // it could not save for an export: the kubelet waits for it (desired.h).
  if (type == "ps" && !replica.own_containers && !spec.training.checkpoint_dir.empty() &&
      !pod_spec.contains("terminationGracePeriodSeconds")) {
    pod_spec["terminationGracePeriodSeconds"] = kPsTerminationGraceSeconds;
  }
  // OnFailure/Always: the kubelet restarts in place. Never/ExitCode: the
  // operator decides, from the exit code, whether to recreate the pod.
  pod_spec["restartPolicy"] = replica.restart_policy == RestartPolicy::kOnFailure ||
                                      replica.restart_policy == RestartPolicy::kAlways
                                  ? RestartPolicyName(replica.restart_policy)
                                  : "Never";
  json metadata = {{"name", ReplicaName(job.name, type, index)},
                   {"namespace", job.namespace_},
                   {"labels", labels},
                   {"ownerReferences", OwnerReferences(job)}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", metadata}, {"spec", pod_spec}};
}

}  // namespace kubetrain
