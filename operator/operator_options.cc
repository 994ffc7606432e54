#include "operator/operator_options.h"

#include <cstdlib>

namespace kubetrain {

void OperatorOptions::Register(FlagParser* parser) {
  if (const char* kc = std::getenv("KUBECONFIG")) kubeconfig = kc;
  port_ = config.port;
  workers_ = controller.workers;
  watch_timeout_seconds_ = controller.watch_timeout_seconds;
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
  parser->String("metrics_address", &metrics_address, "host:port for /metrics; empty = off");
  parser->String("health_address", &health_address,
                 "host:port for /healthz and /readyz; empty = off");
  parser->Bool("leader_elect", &leader_elect,
               "take a Lease before reconciling (for several replicas)");
  parser->String("leader_election_namespace", &leader_election_namespace, "namespace of the Lease");
  parser->Int("workers", &workers_, "concurrent reconciles");
  parser->Int("watch_timeout_seconds", &watch_timeout_seconds_,
              "server-side timeout of each watch");
}

void OperatorOptions::Finish() {
  config.port = static_cast<int>(port_);
  controller.workers = static_cast<int>(workers_);
  controller.watch_timeout_seconds = static_cast<int>(watch_timeout_seconds_);
}

}  // namespace kubetrain
