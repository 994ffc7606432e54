// The operator's control loop: the informer cache (operator/job_cache.h)
// turns every change to a TrainingJob or to an object it owns into the
// owning job's key on a rate-limited work queue; `workers` threads run the
// Reconciler on those keys (one key is never reconciled by two workers at
// once; different jobs run in parallel, so one slow job does not stall the
// others). Workers start once every informer has listed, so nothing is
// decided from a half-filled cache. Deadlines and TTLs come back as timed
// re-queues; a periodic resync re-queues every cached job (no request).
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
#include "operator/expectations.h"
#include "operator/job_cache.h"
#include "operator/reconciler.h"
#include "operator/work_queue.h"

namespace kubetrain {

struct ControllerOptions {
  std::string namespace_;  // "" = all namespaces
  int workers = 4;
  int watch_timeout_seconds = 60;
  absl::Duration resync = absl::Seconds(60);
};

class Controller {
 public:
  // `cache`, `reconciler`, `expectations` and `clock` must outlive the
  // controller; metrics are registered in `registry`. Sets the cache's
  // on_job handler.
  Controller(JobCache* cache, Reconciler* reconciler, Expectations* expectations,
             const Clock* clock, ControllerOptions options, prometheus::Registry& registry);

  // Starts the cache, then the workers; runs until *stop becomes true. Blocks.
  void Run(const std::atomic<bool>* stop);
  // True once every informer has listed (for /readyz).
  bool synced() const { return cache_->synced(); }

 private:
  void Work(const std::atomic<bool>* stop);
  void RecordState(const std::string& key, const std::string& state);
  void UpdateGauges();

  // Constant after construction.
  JobCache* const cache_;
  Reconciler* const reconciler_;
  Expectations* const expectations_;
  const Clock* const clock_;
  const ControllerOptions options_;

  WorkQueue queue_;
  prometheus::Family<prometheus::Counter>& reconciles_;
  prometheus::Histogram& reconcile_seconds_;
  prometheus::Family<prometheus::Gauge>& jobs_by_state_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& busy_workers_;
  prometheus::Family<prometheus::Counter>& watch_restarts_;
  prometheus::Family<prometheus::Counter>& relists_;
  prometheus::Family<prometheus::Gauge>& cache_objects_;
  prometheus::Gauge& expectations_pending_;
  std::atomic<int> busy_{0};

  absl::Mutex mu_;
  std::map<std::string, std::string> states_ ABSL_GUARDED_BY(mu_);  // job key -> state
  std::map<std::string, int64_t> counted_ ABSL_GUARDED_BY(mu_);     // metric deltas reported
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_CONTROLLER_H_
