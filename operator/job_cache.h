// JobCache: the operator's view of the cluster, kept by six informers
// (operator/informer.h), one list+watch per kind it owns: TrainingJobs, and
// the pods, Services, ConfigMaps, Secrets and NetworkPolicies labelled
// kubetrain.io/job-name (only its own objects are listed, watched and stored). Reconciles read it
// and never list. Every change to an owned object, deletes included, calls `on_job` with the owning
// job's key ("namespace/job") and reports the object to the Expectations, so a deleted Service is
// noticed within the watch latency.
//
// What is stored is trimmed: no managedFields or last-applied annotation,
// no pod spec (a reconcile reads labels, owner and status), no Service or
// NetworkPolicy spec, no ConfigMap data, and of a Secret only the names of
// its keys and its job.key (tokens of tasks added later are derived from it).
//
// Thread-safe; set_on_job() must be called before Start().
#ifndef KUBETRAIN_OPERATOR_JOB_CACHE_H_
#define KUBETRAIN_OPERATOR_JOB_CACHE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
  // Keys of every TrainingJob in the cache (for the periodic resync).
  std::vector<std::string> JobKeys() const { return jobs_->JobKeys(); }
  // Stores the answer of our own write to a TrainingJob (see Informer::Update).
  void UpdateJob(const nlohmann::json& job) { jobs_->Update(job); }

  const std::vector<Informer*>& informers() const { return all_; }

 private:
  void OnOwnedChange(const char* plural, WatchEventType type, const nlohmann::json& object);

  Expectations* const expectations_;
  std::function<void(const std::string&)> on_job_;
  std::unique_ptr<Informer> jobs_, pods_, services_, config_maps_, secrets_, network_policies_;
  std::vector<Informer*> all_;
  std::vector<std::thread> threads_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_JOB_CACHE_H_
