// Desired(), authentication and isolation: the job's Secret (key, tokens,
// TLS files), what each pod mounts of it, and the job's NetworkPolicy.
#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {

using nlohmann::json;

namespace {

// The Secret keys every pod of a TLS job mounts beside its key or token.
constexpr const char* kTlsFiles[] = {kCaCertFile, kCertFile, kKeyFile};

// World-readable inside the one container that mounts them: the kubelet
// writes them as root and the runtime runs as another user (the images'
// 65532, or the template's runAsUser). 0440 would need an fsGroup, which
// makes the kubelet chown every volume of the pod, the user's data included.
constexpr int kAuthFileMode = 0444;

// The Secret key holding what task (type, index) proves itself with: the job
// key for a PS, else its own token (the split of CredentialsForTask, which
// `kubetrain run` writes, core/job_credentials.h).
std::string CredentialKey(const std::string& type, int index) {
  return type == "ps" ? kJobKeyFile : TokenKey(type, index);
}

std::vector<JobTask> TokenTasks(const TrainingJob& spec) {
  std::vector<JobTask> tasks;
  for (const JobTask& t : JobTasks(spec)) {
    if (t.type != "ps") tasks.push_back(t);
  }
  return tasks;
}

bool UsesAuthSecret(const json& pod) {
  return pod.value("/metadata/annotations"_json_pointer, json::object())
      .contains(kAuthSecretAnnotation);
}

// The Secret is gone (or unusable) while pods that mounted it run: they keep
// their copy, but none of them can be started again with a new key, so the
// job goes on as long as no such pod has to be created, and fails when one does.
void SecretLost(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                const std::string& what, Actions* a) {
  const std::string secret = AuthSecretName(job.name);
  const std::string message = absl::StrCat(
      "Secret ", secret, " ", what, " while tasks that use it run: they keep their copy, but ",
      "none of them can be started again (a new key would lock it out of the running PS tasks)");
  if (!IsConditionTrue(a->status, condition::kAuthSecretMissing)) {
    a->events.push_back({"Warning", reason::kAuthSecretLost, message});
  }
  SetCondition(&a->status, condition::kAuthSecretMissing, true, reason::kAuthSecretLost, message,
               observed.now);
  auto needs = std::find_if(a->create_pods.begin(), a->create_pods.end(), UsesAuthSecret);
  if (needs == a->create_pods.end()) return;
  const std::string pod = (*needs)["metadata"]["name"];
  desired_internal::Finish(
      condition::kFailed, reason::kAuthSecretLost,
      absl::StrCat("TrainingJob ", job.name, " has failed because Secret ", secret, " ", what,
                   " while it ran, and pod ", pod,
                   " cannot be started without it (a new key would lock it out of the "
                   "running PS tasks); delete and re-create the TrainingJob to run it again."),
      observed.pods, spec.run_policy.clean_pod_policy, observed.now, a);
}

}  // namespace

json BuildAuthSecret(const JobObject& job, const JobCredentials& creds,
                     const std::vector<JobTask>& token_tasks) {
  json data = {{kJobKeyFile, absl::Base64Escape(creds.job_key)}};
  if (!creds.ca_cert_pem.empty()) {
    data[kCaCertFile] = absl::Base64Escape(creds.ca_cert_pem);
    data[kCertFile] = absl::Base64Escape(creds.cert_pem);
    data[kKeyFile] = absl::Base64Escape(creds.key_pem);
  }
  for (const JobTask& t : token_tasks) {
    data[TokenKey(t.type, t.index)] = absl::Base64Escape(TaskToken(creds.job_key, t.type, t.index));
  }
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"type", "Opaque"},
          {"metadata", desired_internal::JobObjectMetadata(job, AuthSecretName(job.name))},
          {"data", data}};
}

json BuildNetworkPolicy(const JobObject& job, const OperatorConfig& config) {
  const json same_job = {{"matchLabels", {{kJobNameLabel, job.name}}}};
  return {
      {"apiVersion", "networking.k8s.io/v1"},
      {"kind", "NetworkPolicy"},
      {"metadata", desired_internal::JobObjectMetadata(job, NetworkPolicyName(job.name))},
      {"spec",
       {{"podSelector", same_job},
        {"policyTypes", json::array({"Ingress"})},
        {"ingress",
         json::array({// The tasks talk to each other on any port (a user's own
                      // containers may use more than the training port).
                      {{"from", json::array({{{"podSelector", same_job}}})}},
                      // Prometheus and the operator's progress reads.
                      {{"ports",
                        json::array({{{"protocol", "TCP"}, {"port", config.metrics_port}}})}}})}}}};
}

namespace desired_internal {

json AuthVolume(const JobObject& job, const std::string& type, int index, bool tls) {
  json items = json::array(
      {{{"key", CredentialKey(type, index)}, {"path", type == "ps" ? kJobKeyFile : kTokenFile}}});
  if (tls) {
    for (const char* f : kTlsFiles) items.push_back({{"key", f}, {"path", f}});
  }
  return {{"name", kAuthVolumeName},
          {"secret",
           {{"secretName", AuthSecretName(job.name)},
            {"defaultMode", kAuthFileMode},
            {"items", items}}}};
}

bool StartedWithoutCredentials(const TrainingJob& spec, const Observed& observed) {
  if (observed.auth_secret) return false;
  return std::any_of(observed.pods.begin(), observed.pods.end(), [&](const ObservedPod& p) {
    if (p.deleting || p.uses_auth_secret) return false;
    auto replica = spec.replica_specs.find(ReplicaKeyOf(p.type));
    return replica != spec.replica_specs.end() && !replica->second.own_containers;
  });
}

PodCredentials PodCredentialsOf(const TrainingJob& spec, const Observed& observed) {
  if (observed.auth_secret) {
    return observed.auth_secret->keys.count(kCaCertFile) ? PodCredentials::kTokenAndTls
                                                         : PodCredentials::kToken;
  }
  return StartedWithoutCredentials(spec, observed) ? PodCredentials::kNone : PodCredentials::kToken;
}

void SecureJob(const JobObject& job, const TrainingJob& spec, const Observed& observed,
               const OperatorConfig& config, Actions* a) {
  if (StartedWithoutCredentials(spec, observed)) {
    // Its PS tasks run open and hold the only copy of the parameters: a key
    // now would lock their running workers out, so the job finishes as it began.
    SetCondition(&a->status, condition::kRunningWithoutCredentials, true,
                 reason::kStartedWithoutCredentials,
                 absl::StrCat("the pods of TrainingJob ", job.name,
                              " were created by an operator that gave jobs no credentials: its "
                              "tasks run without tokens or TLS; re-create the TrainingJob to "
                              "run it with them"),
                 observed.now);
    return;
  }
  // Its old pods are gone: from here on it runs with credentials.
  SetCondition(&a->status, condition::kRunningWithoutCredentials, false, reason::kCredentialsIssued,
               "the job's pods mount its Secret", observed.now);
  if (!observed.auth_secret) {
    const bool in_use =
        std::any_of(observed.pods.begin(), observed.pods.end(),
                    [](const ObservedPod& p) { return p.uses_auth_secret && !p.deleting; });
    if (in_use) {
      SecretLost(job, spec, observed, "was deleted", a);
    } else {
      // No task holds a key yet: a fresh Secret, then the pods.
      a->create_auth_secret = AuthSecretRequest{config.job_tls, TokenTasks(spec)};
      a->create_pods.clear();
    }
    return;
  }
  const Observed::AuthSecret& secret = *observed.auth_secret;
  if (secret.job_key.empty()) {
    SecretLost(job, spec, observed, "has no job.key", a);
    return;
  }
  // Replica counts changed: tokens for the new tasks, none for removed ones.
  json data = json::object();
  std::set<std::string> wanted;
  for (const JobTask& t : TokenTasks(spec)) {
    const std::string key = TokenKey(t.type, t.index);
    wanted.insert(key);
    if (!secret.keys.count(key)) {
      data[key] = absl::Base64Escape(TaskToken(secret.job_key, t.type, t.index));
    }
  }
  for (const std::string& key : secret.keys) {
    if (absl::StartsWith(key, kTokenKeyPrefix) && !wanted.count(key)) data[key] = nullptr;
  }
  if (!data.empty()) a->patch_auth_secret = json{{"data", data}};
  // A pod whose file the cache does not show yet waits for it (the kubelet
  // would not start it without).
  a->create_pods.erase(
      std::remove_if(a->create_pods.begin(), a->create_pods.end(),
                     [&](const json& pod) {
                       if (!UsesAuthSecret(pod)) return false;
                       const json& labels = pod["metadata"]["labels"];
                       const std::string key =
                           CredentialKey(labels[kReplicaTypeLabel].get<std::string>(),
                                         std::stoi(labels[kReplicaIndexLabel].get<std::string>()));
                       return !secret.keys.count(key);
                     }),
      a->create_pods.end());
}

}  // namespace desired_internal
}  // namespace kubetrain
