#include "operator/job_cache.h"

#include "core/job_credentials.h"
#include "operator/labels.h"

namespace kubetrain {
namespace {

using nlohmann::json;

void TrimMetadata(json* o) {
  if (!o->contains("metadata")) return;
  json& md = (*o)["metadata"];
  md.erase("managedFields");
  if (md.contains("annotations") && md["annotations"].is_object()) {
    md["annotations"].erase("kubectl.kubernetes.io/last-applied-configuration");
    if (md["annotations"].empty()) md.erase("annotations");
  }
}

std::string NamespaceOf(const json& o) {
  return o.value("/metadata/namespace"_json_pointer, std::string());
}

// The owning job of a labelled object: "namespace/<kubetrain.io/job-name>".
std::string OwningJob(const json& o) {
  const json labels = o.value("/metadata/labels"_json_pointer, json::object());
  const std::string job = labels.is_object() ? labels.value(kJobNameLabel, "") : "";
  return job.empty() ? "" : NamespaceOf(o) + "/" + job;
}

// A Secret keeps the names of its keys and the job key (new tasks' tokens
// are derived from it); every other value (tokens, the TLS key) is dropped.
void TrimSecret(json* s) {
  s->erase("stringData");
  json& data = (*s)["data"];
  if (!data.is_object()) data = json::object();
  for (auto& [key, value] : data.items()) {
    if (key != kJobKeyFile) value = "";
  }
}

}  // namespace

ResourceRef TrainingJobs(const std::string& ns, const std::string& name,
                         const std::string& subresource) {
  return {"/apis/kubetrain.io/v1", "trainingjobs", ns, name, subresource};
}

JobCache::JobCache(KubeClient* client, const std::string& ns, int watch_timeout_seconds,
                   Expectations* expectations)
    : client_(client),
      namespace_(ns),
      watch_timeout_seconds_(watch_timeout_seconds),
      expectations_(expectations) {
  auto core = [&](const char* plural) { return ResourceRef{"/api/v1", plural, ns, "", ""}; };
  pods_ = OwnedInformer(core("pods"), "pods", "", [](json* p) {
    p->erase("spec");
    if (p->contains("status")) (*p)["status"].erase("conditions");
  });
  services_ = OwnedInformer(core("services"), "services", "", [](json* s) {
    s->erase("spec");
    s->erase("status");
  });
  config_maps_ = OwnedInformer(core("configmaps"), "configmaps", "", [](json* c) {
    c->erase("data");
    c->erase("binaryData");
  });
  secrets_ = OwnedInformer(core("secrets"), "secrets", "", TrimSecret);
  network_policies_ = OwnedInformer({kNetworkPolicyApiPath, "networkpolicies", ns, "", ""},
                                    "networkpolicies", "", [](json* n) { n->erase("spec"); });
  InformerOptions o;
  o.collection = TrainingJobs(ns);
  o.transform = TrimMetadata;
  o.job_of = [](const json& j) { return Informer::KeyOf(j); };
  o.watch_timeout_seconds = watch_timeout_seconds;
  jobs_ = std::make_unique<Informer>(client, o, [this](WatchEventType, const json& obj) {
    if (on_job_) on_job_(Informer::KeyOf(obj));
  });
  all_ = {jobs_.get(),        pods_.get(),    services_.get(),
          config_maps_.get(), secrets_.get(), network_policies_.get()};
}

std::unique_ptr<Informer> JobCache::OwnedInformer(const ResourceRef& collection,
                                                  const std::string& plural,
                                                  const std::string& resource,
                                                  std::function<void(json*)> trim) {
  InformerOptions o;
  o.collection = collection;
  o.resource = resource;
  o.label_selector = kJobNameLabel;  // exists: only objects of some job
  o.transform = [trim](json* obj) {
    TrimMetadata(obj);
    trim(obj);
  };
  o.job_of = OwningJob;
  o.watch_timeout_seconds = watch_timeout_seconds_;
  return std::make_unique<Informer>(client_, o, [this, plural](WatchEventType t, const json& obj) {
    OnOwnedChange(plural, t, obj);
  });
}

JobCache::~JobCache() { Join(); }

void JobCache::OnOwnedChange(const std::string& plural, WatchEventType type, const json& object) {
  const std::string job = OwningJob(object);
  if (job.empty()) return;
  const bool exists = type != WatchEventType::kDeleted &&
                      !object.value("metadata", json::object()).contains("deletionTimestamp");
  expectations_->Observed(
      job, plural + "/" + object.value("/metadata/name"_json_pointer, std::string()), exists);
  if (on_job_) on_job_(job);
}

void JobCache::Created(const std::string& plural, const json& object) {
  if (OwningJob(object).empty()) return;  // not labelled: never listed or watched
  Informer* informer = plural == "pods"              ? pods_.get()
                       : plural == "services"        ? services_.get()
                       : plural == "configmaps"      ? config_maps_.get()
                       : plural == "secrets"         ? secrets_.get()
                       : plural == "networkpolicies" ? network_policies_.get()
                                                     : nullptr;
  if (informer != nullptr) informer->Update(object);
}

void JobCache::WatchPodGroups(const std::string& api_version) {
  absl::MutexLock l(&mu_);
  if (pod_groups_.count(api_version)) return;
  // "podgroups.scheduling.x-k8s.io" in metrics and logs: one per API group.
  const std::string group = api_version.substr(0, api_version.find('/'));
  auto informer =
      OwnedInformer({"/apis/" + api_version, "podgroups", namespace_, "", ""}, "podgroups",
                    "podgroups." + group, [](json* pg) { pg->erase("status"); });
  Informer* i = informer.get();
  pod_groups_[api_version] = std::move(informer);
  all_.push_back(i);
  if (stop_ != nullptr) {
    const std::atomic<bool>* stop = stop_;
    threads_.emplace_back([i, stop] { i->Run(stop); });
  }
}

bool JobCache::PodGroupsSynced(const std::string& api_version) const {
  absl::MutexLock l(&mu_);
  auto it = pod_groups_.find(api_version);
  return it != pod_groups_.end() && it->second->synced();
}

std::optional<json> JobCache::PodGroup(const std::string& api_version, const std::string& ns,
                                       const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = pod_groups_.find(api_version);
  if (it == pod_groups_.end()) return std::nullopt;
  return it->second->Get(ns, name);
}

std::vector<Informer*> JobCache::informers() const {
  absl::MutexLock l(&mu_);
  return all_;
}

void JobCache::Start(const std::atomic<bool>* stop) {
  absl::MutexLock l(&mu_);
  stop_ = stop;
  for (Informer* i : all_) threads_.emplace_back([i, stop] { i->Run(stop); });
}

void JobCache::Join() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
}

void JobCache::Detach() {
  absl::MutexLock l(&mu_);
  for (auto& t : threads_) {
    if (t.joinable()) t.detach();
  }
  threads_.clear();
}

bool JobCache::synced() const {
  // PodGroup informers are not waited for: a PodGroup API may stop being
  // served (its CRD uninstalled) without stopping the operator.
  for (const Informer* i : {jobs_.get(), pods_.get(), services_.get(), config_maps_.get(),
                            secrets_.get(), network_policies_.get()}) {
    if (!i->synced()) return false;
  }
  return true;
}

}  // namespace kubetrain
