// kubetrain-operator: reconciles TrainingJobs (kubetrain.io/v1). Flags are
// parsed here, once (operator/operator_options.h); everything below gets its
// configuration passed in.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/metrics.h"
#include "operator/controller.h"
#include "operator/expectations.h"
#include "operator/health_server.h"
#include "operator/job_cache.h"
#include "operator/kubeconfig.h"
#include "operator/leader_election.h"
#include "operator/operator_options.h"
#include "operator/progress.h"
#include "operator/reconciler.h"
#include "operator/rest_kube_client.h"
#include "operator/throttled_kube_client.h"

namespace {
std::atomic<bool> g_stop{false};  // set by SIGTERM/SIGINT
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  using namespace kubetrain;  // NOLINT: main only wires objects together
  InitProcess(ProcessProfile::kDefault);
  // Reconcile workers and their create fan-out are many short-lived threads:
  // without a cap glibc gives each its own malloc arena, doubling the RSS.
  mallopt(M_ARENA_MAX, 2);
  OperatorOptions o;
  FlagParser parser("kubetrain-operator [--kubeconfig FILE | --in-cluster]");
  o.Register(&parser);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  o.Finish();
  if (absl::Status s = o.Validate(); !s.ok()) return Log("error: ", s.message()), 2;
  auto kube_config = LoadClientConfig(o.in_cluster, o.kubeconfig);
  if (!kube_config.ok()) return Log("error: ", kube_config.status().message()), 2;
  auto client = RestKubeClient::New(*kube_config, RestKubeClient::Options());
  if (!client.ok()) return Log("error: ", client.status().message()), 2;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics = std::unique_ptr<MetricsServer>();
  if (!o.metrics_address.empty()) metrics = MetricsServer::Start(o.metrics_address, registry);
  if (!metrics.ok()) return Log("error: ", metrics.status().message()), 2;
  RealClock clock;
  // Every request, watches and leader election included, takes a token;
  // Events from a bucket of their own, a tenth of the size.
  TokenBucket bucket(&clock, o.kube_api_qps, o.kube_api_burst);
  TokenBucket events_bucket(&clock, o.kube_api_qps / 10, std::max(1, o.kube_api_burst / 10));
  ThrottledKubeClient kube(client->get(), &bucket, *registry, &events_bucket);
  Expectations expectations(&clock, o.expectations_timeout);
  JobCache cache(&kube, o.controller.namespace_, o.controller.watch_timeout_seconds, &expectations);
  Reconciler reconciler(
      &kube, &cache, &expectations, o.config, &clock,
      [port = o.config.metrics_port](const std::string& ip) {
        return ScrapeMetrics(ip, port, absl::Seconds(1));
      },
      o.reconciler);
  Controller controller(&cache, &reconciler, &expectations, &clock, o.controller, *registry);
  std::atomic<bool> leading{!o.leader_elect};
  absl::StatusOr<std::unique_ptr<HealthServer>> health = std::unique_ptr<HealthServer>();
  if (!o.health_address.empty()) {
    health = HealthServer::Start(o.health_address,
                                 [&] { return leading.load() && controller.synced(); });
  }
  if (!health.ok()) return Log("error: ", health.status().message()), 2;
  Log("kubetrain-operator: server ", kube_config->server, ", namespace ",
      o.controller.namespace_.empty() ? "(all)" : o.controller.namespace_, ", runtime image ",
      o.config.runtime_image, ", metrics ", *metrics ? absl::StrCat((*metrics)->port()) : "(off)");

  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  LeaderElector elector(
      &kube, &clock,
      {o.leader_election_namespace, "kubetrain-operator", absl::StrCat(host, "_", getpid())});
  if (o.leader_elect) {
    if (!elector.Acquire(&g_stop).ok()) return 0;
    leading = true;
    elector.StartRenewing(&g_stop, [](const absl::Status& s) {
      Log("operator: ", s.message(), "; exiting");  // another replica may already be acting
      std::_Exit(1);
    });
  }
  controller.Run(&g_stop);
  Log("kubetrain-operator: stopped");
  g_stop = true;  // the renewer ends too
  return 0;
}
