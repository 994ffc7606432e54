#include "operator/operator_process.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "operator/leader_election.h"
#include "operator/progress.h"

namespace kubetrain {

absl::StatusOr<std::unique_ptr<OperatorProcess>> OperatorProcess::Start(const OperatorOptions& o) {
  absl::StatusOr<KubeConfig> kube_config = LoadClientConfig(o.in_cluster, o.kubeconfig);
  if (!kube_config.ok()) return kube_config.status();
  auto client = RestKubeClient::New(*kube_config, RestKubeClient::Options());
  if (!client.ok()) return client.status();
  std::unique_ptr<OperatorProcess> p(
      new OperatorProcess(o, *std::move(kube_config), *std::move(client)));
  if (!o.metrics_address.empty()) {
    auto metrics = MetricsServer::Start(o.metrics_address, p->registry_);
    if (!metrics.ok()) return metrics.status();
    p->metrics_ = *std::move(metrics);
  }
  if (!o.health_address.empty()) {
    OperatorProcess* self = p.get();
    auto health = HealthServer::Start(
        o.health_address, [self] { return self->leading_.load() && self->controller_.synced(); });
    if (!health.ok()) return health.status();
    p->health_ = *std::move(health);
  }
  Log("kubetrain-operator: server ", p->kube_config_.server, ", namespace ",
      o.controller.namespace_.empty() ? "(all)" : o.controller.namespace_, ", runtime image ",
      o.config.runtime_image, ", metrics ",
      p->metrics_ ? absl::StrCat(p->metrics_->port()) : "(off)");
  return p;
}

OperatorProcess::OperatorProcess(const OperatorOptions& o, KubeConfig kube_config,
                                 std::unique_ptr<RestKubeClient> client)
    : options_(o),
      kube_config_(std::move(kube_config)),
      client_(std::move(client)),
      registry_(std::make_shared<prometheus::Registry>()),
      bucket_(&clock_, o.kube_api_qps, o.kube_api_burst),
      events_bucket_(&clock_, o.kube_api_qps / 10, std::max(1, o.kube_api_burst / 10)),
      kube_(client_.get(), &bucket_, *registry_, &events_bucket_),
      expectations_(&clock_, o.expectations_timeout),
      cache_(&kube_, o.controller.namespace_, o.controller.watch_timeout_seconds, &expectations_),
      reconciler_(
          &kube_, &cache_, &expectations_, o.config, &clock_,
          [port = o.config.metrics_port](const std::string& ip) {
            return ScrapeMetrics(ip, port, absl::Seconds(1));
          },
          o.reconciler),
      controller_(&cache_, &reconciler_, &expectations_, &clock_, o.controller, *registry_),
      leading_(!o.leader_elect) {}

absl::Status OperatorProcess::Run(std::atomic<bool>* stop) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  LeaderElector elector(&kube_, &clock_,
                        {options_.leader_election_namespace, "kubetrain-operator",
                         absl::StrCat(host, "_", getpid())});
  if (options_.leader_elect) {
    if (!elector.Acquire(stop).ok()) return absl::OkStatus();
    leading_ = true;
    elector.StartRenewing(stop, [](const absl::Status& s) {
      Log("operator: ", s.message(), "; exiting");  // another replica may already be acting
      std::_Exit(1);
    });
  }
  controller_.Run(stop);
  Log("kubetrain-operator: stopped");
  stop->store(true);  // the renewer ends too
  return absl::OkStatus();
}

}  // namespace kubetrain
