// The operator's control loop: list+watch TrainingJobs and the pods they own
// (resuming from the last resourceVersion, relisting on 410, reconnecting
// with backoff), feeding job keys to a rate-limited work queue served by
// worker threads that run the Reconciler. Deadlines and TTLs come back as
// timed re-queues, so they fire on time, not on the next event.
#ifndef KUBETRAIN_OPERATOR_CONTROLLER_H_
#define KUBETRAIN_OPERATOR_CONTROLLER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/synchronization/mutex.h"
#include "operator/kube_client.h"
#include "operator/reconciler.h"
#include "operator/work_queue.h"

namespace kubetrain {

struct ControllerOptions {
  std::string namespace_;  // "" = all namespaces
  int workers = 2;
  int watch_timeout_seconds = 60;
  absl::Duration resync = absl::Seconds(60);
};

class Controller {
 public:
  // `client`, `reconciler` and `clock` must outlive the controller; metrics
  // are registered in `registry`.
  Controller(KubeClient* client, Reconciler* reconciler, const Clock* clock,
             ControllerOptions options, prometheus::Registry& registry);

  // Runs until *stop becomes true. Blocks.
  void Run(const std::atomic<bool>* stop);
  // True once both initial lists have been queued (for /readyz).
  bool synced() const { return jobs_synced_.load() && pods_synced_.load(); }

 private:
  void WatchLoop(const ResourceRef& ref, const std::string& selector, bool pods,
                 std::atomic<bool>* synced, const std::atomic<bool>* stop);
  void Enqueue(const nlohmann::json& object, bool is_pod);
  void Work(const std::atomic<bool>* stop);
  void RecordState(const std::string& key, const std::string& state);

  KubeClient* const client_;
  Reconciler* const reconciler_;
  const Clock* const clock_;
  const ControllerOptions options_;
  WorkQueue queue_;
  std::atomic<bool> jobs_synced_{false}, pods_synced_{false};

  prometheus::Family<prometheus::Counter>& reconciles_;
  prometheus::Histogram& reconcile_seconds_;
  prometheus::Family<prometheus::Gauge>& jobs_by_state_;
  prometheus::Gauge& queue_depth_;
  prometheus::Family<prometheus::Counter>& watch_restarts_;

  absl::Mutex mu_;
  std::map<std::string, std::string> states_ ABSL_GUARDED_BY(mu_);  // job key -> state
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_CONTROLLER_H_
