// JobCache: the operator's view of the cluster, kept by informers
// (operator/informer.h), one list+watch per kind it owns: TrainingJobs, and
// the pods, Services, ConfigMaps, Secrets and NetworkPolicies labelled
// kubetrain.io/job-name (only its own objects are listed, watched and
// stored); for gang scheduling also the PodGroups of each PodGroup API in
// use, once a PodGroup of it was created (so its CRD is installed; an
// operator whose jobs ask for no gang scheduler sends no PodGroup request).
// Reconciles read it and never list. Every change to an owned object,
// deletes included, calls `on_job` with the owning job's key
// ("namespace/job") and reports the object to the Expectations, so a deleted
// Service or PodGroup is noticed within the watch latency.
//
// What is stored is trimmed: no managedFields or last-applied annotation,
// no pod spec (a reconcile reads labels, owner and status), no Service or
// NetworkPolicy spec, no ConfigMap data, of a Secret only the names of its
// keys and its job.key (tokens of tasks added later are derived from it), no
// PodGroup status (the scheduler's, changing often).
//
// Thread-safe; set_on_job() must be called before Start().
#ifndef KUBETRAIN_OPERATOR_JOB_CACHE_H_
#define KUBETRAIN_OPERATOR_JOB_CACHE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "operator/expectations.h"
#include "operator/informer.h"
#include "operator/kube_client.h"

namespace kubetrain {

inline constexpr char kNetworkPolicyApiPath[] = "/apis/networking.k8s.io/v1";

// The TrainingJob collection (or one job, or its status subresource).
ResourceRef TrainingJobs(const std::string& ns, const std::string& name = "",
                         const std::string& subresource = "");

class JobCache {
 public:
  // `client` and `expectations` must outlive the cache. `ns` "" = all namespaces.
  JobCache(KubeClient* client, const std::string& ns, int watch_timeout_seconds,
           Expectations* expectations);
  ~JobCache();

  void set_on_job(std::function<void(const std::string& job_key)> on_job) {
    on_job_ = std::move(on_job);
  }
  // Starts one thread per informer; they run until *stop is true.
  void Start(const std::atomic<bool>* stop);
  // Waits for the informer threads (they end within a watch timeout of *stop).
  void Join();
  // Leaves them to end with the process.
  void Detach();
  bool synced() const;

  std::optional<nlohmann::json> Job(const std::string& ns, const std::string& name) const {
    return jobs_->Get(ns, name);
  }
  std::vector<nlohmann::json> Pods(const std::string& job_key) const {
    return pods_->ByJob(job_key);
  }
  std::vector<nlohmann::json> Services(const std::string& job_key) const {
    return services_->ByJob(job_key);
  }
  std::vector<nlohmann::json> ConfigMaps(const std::string& job_key) const {
    return config_maps_->ByJob(job_key);
  }
  std::vector<nlohmann::json> Secrets(const std::string& job_key) const {
    return secrets_->ByJob(job_key);
  }
  std::vector<nlohmann::json> NetworkPolicies(const std::string& job_key) const {
    return network_policies_->ByJob(job_key);
  }
  // Starts watching the PodGroups of `api_version` ("scheduling.x-k8s.io/v1alpha1")
  // labelled kubetrain.io/job-name, once; their changes then re-queue their
  // jobs. Call it once that API is known to be served.
  void WatchPodGroups(const std::string& api_version);
  // Whether the PodGroups of `api_version` are watched and listed (only then
  // does PodGroup() tell whether one exists).
  bool PodGroupsSynced(const std::string& api_version) const;
  std::optional<nlohmann::json> PodGroup(const std::string& api_version, const std::string& ns,
                                         const std::string& name) const;
  // Keys of every TrainingJob in the cache (for the periodic resync).
  std::vector<std::string> JobKeys() const { return jobs_->JobKeys(); }
  // Stores the answer of our own write to a TrainingJob (see Informer::Update).
  void UpdateJob(const nlohmann::json& job) { jobs_->Update(job); }
  // Stores the answer of our own create of an owned object of `plural`
  // (pods, services, configmaps, secrets, networkpolicies; see
  // Informer::Update): as its watch event would, it meets its expectation
  // and re-queues its job, so the next pass (e.g. the pods once the job's
  // Secret exists) does not wait a watch round trip for what the create's
  // answer already shows. Other kinds are left to their watch.
  void Created(const std::string& plural, const nlohmann::json& object);

  // Every informer (for metrics); PodGroup informers join as they start.
  std::vector<Informer*> informers() const;

 private:
  std::unique_ptr<Informer> OwnedInformer(const ResourceRef& collection, const std::string& plural,
                                          const std::string& resource,
                                          std::function<void(nlohmann::json*)> trim);
  void OnOwnedChange(const std::string& plural, WatchEventType type, const nlohmann::json& object);

  // Constant after construction.
  KubeClient* const client_;
  const std::string namespace_;
  const int watch_timeout_seconds_;
  Expectations* const expectations_;
  std::function<void(const std::string&)> on_job_;
  std::unique_ptr<Informer> jobs_, pods_, services_, config_maps_, secrets_, network_policies_;

  mutable absl::Mutex mu_;
  const std::atomic<bool>* stop_ ABSL_GUARDED_BY(mu_) = nullptr;  // set by Start()
  // API version -> its PodGroups.
  std::map<std::string, std::unique_ptr<Informer>> pod_groups_ ABSL_GUARDED_BY(mu_);
  std::vector<Informer*> all_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_JOB_CACHE_H_
