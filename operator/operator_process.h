// The operator as one object: what kubetrain-operator's main() starts from
// its flags (operator/operator_options.h). It owns the API client (throttled:
// every request takes a token), the informer cache, the reconciler and the
// controller, the /metrics and /healthz servers, and the leader election.
#ifndef KUBETRAIN_OPERATOR_OPERATOR_PROCESS_H_
#define KUBETRAIN_OPERATOR_OPERATOR_PROCESS_H_

#include <atomic>
#include <memory>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "operator/controller.h"
#include "operator/expectations.h"
#include "operator/health_server.h"
#include "operator/job_cache.h"
#include "operator/kubeconfig.h"
#include "operator/operator_options.h"
#include "operator/rate_limiter.h"
#include "operator/reconciler.h"
#include "operator/rest_kube_client.h"
#include "operator/throttled_kube_client.h"

namespace kubetrain {

class OperatorProcess {
 public:
  // Connects (kubeconfig or in-cluster) and starts the servers; errors are
  // configuration errors (exit code 2). `options` must be Finish()ed and
  // valid.
  static absl::StatusOr<std::unique_ptr<OperatorProcess>> Start(const OperatorOptions& options);

  // With leader election, waits to lead (returns OK without reconciling if
  // `stop` is set first) and keeps renewing: a lost lease ends the process
  // (exit code 1: another replica may already be acting). Then reconciles
  // until `stop`.
  absl::Status Run(std::atomic<bool>* stop);

 private:
  OperatorProcess(const OperatorOptions& options, KubeConfig kube_config,
                  std::unique_ptr<RestKubeClient> client);

  const OperatorOptions options_;
  const KubeConfig kube_config_;
  RealClock clock_;
  const std::unique_ptr<RestKubeClient> client_;
  const std::shared_ptr<prometheus::Registry> registry_;
  // Every request, watches and leader election included, takes a token;
  // Events from a bucket of their own, a tenth of the size.
  TokenBucket bucket_;
  TokenBucket events_bucket_;
  ThrottledKubeClient kube_;
  Expectations expectations_;
  JobCache cache_;
  Reconciler reconciler_;
  Controller controller_;
  std::atomic<bool> leading_;
  std::unique_ptr<MetricsServer> metrics_;  // null: no --metrics_address
  std::unique_ptr<HealthServer> health_;    // null: no --health_address
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_OPERATOR_PROCESS_H_
