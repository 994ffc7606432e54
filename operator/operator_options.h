// Everything kubetrain-operator is told on its command line, with the
// defaults, and the flags that set it (registered on a core/flags.h parser).
#ifndef KUBETRAIN_OPERATOR_OPERATOR_OPTIONS_H_
#define KUBETRAIN_OPERATOR_OPERATOR_OPTIONS_H_

#include <string>

#include "absl/status/status.h"

#include "core/flags.h"
#include "operator/controller.h"
#include "operator/desired.h"
#include "operator/reconciler.h"

namespace kubetrain {

struct OperatorOptions {
  std::string kubeconfig;  // default: $KUBECONFIG
  bool in_cluster = false;
  std::string metrics_address = "0.0.0.0:8080";  // "" = off
  std::string health_address = "0.0.0.0:8081";   // "" = off
  bool leader_elect = false;
  std::string leader_election_namespace = "kubetrain-system";
  OperatorConfig config;         // what Desired() builds pods with
  ControllerOptions controller;  // namespace, workers, watch timeout
  ReconcilerOptions reconciler;  // per-job creation fan-out
  // Client-side rate limit of every request to the API server (a token
  // bucket, as client-go's QPS/Burst). 0 qps = no limit.
  double kube_api_qps = 100;
  int kube_api_burst = 200;
  // How long a job waits for the cache to show its own creates/deletes.
  absl::Duration expectations_timeout = absl::Seconds(30);

  // Registers every flag on `parser`, writing into this object; Finish()
  // after parsing copies the integer flags into place.
  void Register(FlagParser* parser);
  void Finish();
  // InvalidArgument naming the flag for values that cannot work.
  absl::Status Validate() const;

 private:
  int64_t port_ = 2222, bulk_port_ = 2223, workers_ = 8, watch_timeout_seconds_ = 60,
          kube_api_burst_ = 200, create_parallelism_ = 16, expectations_timeout_seconds_ = 30,
          pod_group_retry_seconds_ = 30;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_OPERATOR_OPTIONS_H_
