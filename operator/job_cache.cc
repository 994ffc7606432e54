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
    : expectations_(expectations) {
  auto owned = [&](const char* api_path, const char* plural, std::function<void(json*)> trim) {
    InformerOptions o;
    o.collection = {api_path, plural, ns, "", ""};
    o.label_selector = kJobNameLabel;  // exists: only objects of some job
    o.transform = [trim](json* obj) {
      TrimMetadata(obj);
      trim(obj);
    };
    o.job_of = OwningJob;
    o.watch_timeout_seconds = watch_timeout_seconds;
    return std::make_unique<Informer>(client, o, [this, plural](WatchEventType t, const json& obj) {
      OnOwnedChange(plural, t, obj);
    });
  };
  pods_ = owned("/api/v1", "pods", [](json* p) {
    p->erase("spec");
    if (p->contains("status")) (*p)["status"].erase("conditions");
  });
  services_ = owned("/api/v1", "services", [](json* s) {
    s->erase("spec");
    s->erase("status");
  });
  config_maps_ = owned("/api/v1", "configmaps", [](json* c) {
    c->erase("data");
    c->erase("binaryData");
  });
  secrets_ = owned("/api/v1", "secrets", TrimSecret);
  network_policies_ =
      owned(kNetworkPolicyApiPath, "networkpolicies", [](json* n) { n->erase("spec"); });
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

JobCache::~JobCache() { Join(); }

void JobCache::OnOwnedChange(const char* plural, WatchEventType type, const json& object) {
  const std::string job = OwningJob(object);
  if (job.empty()) return;
  const bool exists = type != WatchEventType::kDeleted &&
                      !object.value("metadata", json::object()).contains("deletionTimestamp");
  expectations_->Observed(
      job, std::string(plural) + "/" + object.value("/metadata/name"_json_pointer, std::string()),
      exists);
  if (on_job_) on_job_(job);
}

void JobCache::Start(const std::atomic<bool>* stop) {
  for (Informer* i : all_) threads_.emplace_back([i, stop] { i->Run(stop); });
}

void JobCache::Join() {
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void JobCache::Detach() {
  for (auto& t : threads_) {
    if (t.joinable()) t.detach();
  }
  threads_.clear();
}

bool JobCache::synced() const {
  for (const Informer* i : all_) {
    if (!i->synced()) return false;
  }
  return true;
}

}  // namespace kubetrain
