#include "operator/operator_options.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kubetrain {

void OperatorOptions::Register(FlagParser* parser) {
  if (const char* kc = std::getenv("KUBECONFIG")) kubeconfig = kc;
  port_ = config.port;
  bulk_port_ = config.bulk_port;
  workers_ = controller.workers;
  watch_timeout_seconds_ = controller.watch_timeout_seconds;
  kube_api_burst_ = kube_api_burst;
  create_parallelism_ = reconciler.create_parallelism;
  expectations_timeout_seconds_ = absl::ToInt64Seconds(expectations_timeout);
  pod_group_retry_seconds_ = absl::ToInt64Seconds(config.pod_group_retry);
  parser->String("kubeconfig", &kubeconfig, "kubeconfig file (default: $KUBECONFIG)");
  parser->Bool("in_cluster", &in_cluster, "use the pod's service account (token + CA)");
  parser->String("namespace", &controller.namespace_, "watch only this namespace (default: all)");
  parser->String("runtime_image", &config.runtime_image,
                 "image for PS/worker pods whose template has no container");
  parser->String("image_pull_policy", &config.image_pull_policy,
                 "imagePullPolicy of the runtime containers");
  parser->String("cluster_domain", &config.cluster_domain,
                 "cluster DNS domain appended to TF_CONFIG hosts (default: none)");
  parser->Int("port", &port_, "the training port of every task (Services and TF_CONFIG)");
  parser->Int("bulk_port", &bulk_port_,
              "PS pods also serve pushes and pulls on this port: the bulk data plane, faster "
              "than gRPC, with the same tokens and TLS (-1: gRPC only)");
  parser->String("metrics_address", &metrics_address, "host:port for /metrics; empty = off");
  parser->String("health_address", &health_address,
                 "host:port for /healthz and /readyz; empty = off");
  parser->Bool("leader_elect", &leader_elect,
               "take a Lease before reconciling (for several replicas)");
  parser->String("leader_election_namespace", &leader_election_namespace, "namespace of the Lease");
  parser->Int("workers", &workers_,
              "reconcile workers: different jobs are reconciled in parallel, one job never twice "
              "at once");
  parser->Double("kube_api_qps", &kube_api_qps,
                 "client-side limit of requests per second to the API server (0 = none)");
  parser->Int("kube_api_burst", &kube_api_burst_,
              "requests that may go at once above --kube-api-qps");
  parser->Int(
      "create_parallelism", &create_parallelism_,
      "creates/deletes in flight at once for one job (after a failed pod create, pods go in "
      "slow start: one per replica type, then the rest)");
  parser->Int("expectations_timeout_seconds", &expectations_timeout_seconds_,
              "how long a job waits for the cache to show its own creates and deletes");
  parser->Int("watch_timeout_seconds", &watch_timeout_seconds_,
              "server-side timeout of each watch");
  parser->Bool("job_tls", &config.job_tls,
               "give new jobs a CA and certificate in their Secret: TLS between their tasks "
               "(--job-tls=false: tokens only, sent in clear text)");
  parser->Int("pod_group_retry_seconds", &pod_group_retry_seconds_,
              "gang scheduling: how often to try again to create a PodGroup that could not be "
              "(its CRD not installed, refused); the job's pods wait meanwhile");
}

void OperatorOptions::Finish() {
  config.port = static_cast<int>(port_);
  config.bulk_port = static_cast<int>(bulk_port_);
  controller.workers = static_cast<int>(workers_);
  controller.watch_timeout_seconds = static_cast<int>(watch_timeout_seconds_);
  kube_api_burst = static_cast<int>(kube_api_burst_);
  reconciler.create_parallelism = static_cast<int>(create_parallelism_);
  expectations_timeout = absl::Seconds(expectations_timeout_seconds_);
  config.pod_group_retry = absl::Seconds(pod_group_retry_seconds_);
}

absl::Status OperatorOptions::Validate() const {
  auto bad = [](const char* flag, auto value, const char* want) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", want));
  };
  if (workers_ < 1 || workers_ > 1000) return bad("workers", workers_, "must be 1..1000");
  if (!(kube_api_qps >= 0)) return bad("kube-api-qps", kube_api_qps, "must be >= 0");
  if (kube_api_burst_ < 1) return bad("kube-api-burst", kube_api_burst_, "must be >= 1");
  if (create_parallelism_ < 1 || create_parallelism_ > 1000)
    return bad("create-parallelism", create_parallelism_, "must be 1..1000");
  if (expectations_timeout_seconds_ < 1)
    return bad("expectations-timeout-seconds", expectations_timeout_seconds_, "must be >= 1");
  if (pod_group_retry_seconds_ < 1)
    return bad("pod-group-retry-seconds", pod_group_retry_seconds_, "must be >= 1");
  if (port_ < 1 || port_ > 65535) return bad("port", port_, "must be 1..65535");
  if (bulk_port_ != -1 && (bulk_port_ < 1 || bulk_port_ > 65535))
    return bad("bulk-port", bulk_port_, "must be -1 (gRPC only) or 1..65535");
  if (bulk_port_ == port_ || bulk_port_ == config.metrics_port)
    return bad("bulk-port", bulk_port_, "must differ from --port and the metrics port");
  if (watch_timeout_seconds_ < 1)
    return bad("watch-timeout-seconds", watch_timeout_seconds_, "must be >= 1");
  return absl::OkStatus();
}

}  // namespace kubetrain
