// kubetrain-operator: reconciles TrainingJobs (kubetrain.io/v1). Flags are
// parsed here, once; everything below gets its configuration passed in.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <cpprest/http_listener.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/metrics.h"
#include "operator/controller.h"
#include "operator/kubeconfig.h"
#include "operator/leader_election.h"
#include "operator/progress.h"
#include "operator/reconciler.h"
#include "operator/rest_kube_client.h"

namespace {

std::atomic<bool> g_stop{false};  // set by SIGTERM/SIGINT

void OnSignal(int) { g_stop.store(true); }

struct OperatorFlags {
  std::string kubeconfig;
  bool in_cluster = false;
  std::string namespace_;
  std::string runtime_image = "kubetrain-runtime:latest";
  std::string image_pull_policy = "IfNotPresent";
  std::string cluster_domain;
  int64_t port = 2222;
  std::string metrics_address = "0.0.0.0:8080";
  std::string health_address = "0.0.0.0:8081";
  bool leader_elect = false;
  std::string leader_election_namespace = "kubetrain-system";
  int64_t workers = 2;
  int64_t watch_timeout_seconds = 60;
};

}  // namespace

int main(int argc, char** argv) {
  OperatorFlags flags;
  if (const char* kc = std::getenv("KUBECONFIG")) flags.kubeconfig = kc;
  kubetrain::FlagParser parser("kubetrain-operator [--kubeconfig FILE | --in-cluster]");
  parser.String("kubeconfig", &flags.kubeconfig, "kubeconfig file (default: $KUBECONFIG)");
  parser.Bool("in_cluster", &flags.in_cluster, "use the pod's service account (token + CA)");
  parser.String("namespace", &flags.namespace_, "watch only this namespace (default: all)");
  parser.String("runtime_image", &flags.runtime_image, "image for PS/worker pods whose template has no container");
  parser.String("image_pull_policy", &flags.image_pull_policy, "imagePullPolicy of the runtime containers");
  parser.String("cluster_domain", &flags.cluster_domain, "cluster DNS domain appended to TF_CONFIG hosts (default: none)");
  parser.Int("port", &flags.port, "the training port of every task (Services and TF_CONFIG)");
  parser.String("metrics_address", &flags.metrics_address, "host:port for /metrics; empty = off");
  parser.String("health_address", &flags.health_address, "host:port for /healthz and /readyz; empty = off");
  parser.Bool("leader_elect", &flags.leader_elect, "take a Lease before reconciling (for several replicas)");
  parser.String("leader_election_namespace", &flags.leader_election_namespace, "namespace of the Lease");
  parser.Int("workers", &flags.workers, "concurrent reconciles");
  parser.Int("watch_timeout_seconds", &flags.watch_timeout_seconds, "server-side timeout of each watch");
  auto st = parser.Parse(argc, argv, 1, nullptr);
  if (!st.ok() || parser.help_requested()) {
    std::fprintf(stderr, "%s%s", st.ok() ? "" : ("error: " + std::string(st.message()) + "\n\n").c_str(),
                 parser.Usage().c_str());
    return st.ok() ? 0 : 2;
  }
  absl::StatusOr<kubetrain::KubeConfig> config;
  if (flags.in_cluster) {
    kubetrain::InClusterOptions ic;
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    ic.host = host ? host : "";
    ic.port = port ? port : "443";
    config = kubetrain::LoadInClusterConfig(ic);
  } else if (!flags.kubeconfig.empty()) {
    config = kubetrain::LoadKubeConfigFile(flags.kubeconfig);
  } else {
    std::fprintf(stderr, "error: give --kubeconfig (or set KUBECONFIG) or --in-cluster\n");
    return 2;
  }
  if (!config.ok()) {
    kubetrain::Log("error: ", config.status().message());
    return 2;
  }
  auto client = kubetrain::RestKubeClient::New(*config, kubetrain::RestKubeClient::Options());
  if (!client.ok()) {
    kubetrain::Log("error: ", client.status().message());
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<kubetrain::MetricsServer> metrics;
  if (!flags.metrics_address.empty()) {
    auto m = kubetrain::MetricsServer::Start(flags.metrics_address, registry);
    if (!m.ok()) {
      kubetrain::Log("error: ", m.status().message());
      return 2;
    }
    metrics = std::move(*m);
  }

  kubetrain::RealClock clock;
  kubetrain::OperatorConfig operator_config;
  operator_config.runtime_image = flags.runtime_image;
  operator_config.image_pull_policy = flags.image_pull_policy;
  operator_config.cluster_domain = flags.cluster_domain;
  operator_config.port = static_cast<int>(flags.port);
  const int metrics_port = operator_config.metrics_port;
  kubetrain::Reconciler reconciler(client->get(), operator_config, &clock, [metrics_port](const std::string& ip) {
    return kubetrain::ScrapeProgress(ip, metrics_port, absl::Seconds(1));
  });
  kubetrain::ControllerOptions options;
  options.namespace_ = flags.namespace_;
  options.workers = static_cast<int>(flags.workers);
  options.watch_timeout_seconds = static_cast<int>(flags.watch_timeout_seconds);
  kubetrain::Controller controller(client->get(), &reconciler, &clock, options, *registry);

  // /healthz: the process serves; /readyz: it leads (if electing) and its caches are listed.
  std::atomic<bool> leading{!flags.leader_elect};
  std::unique_ptr<web::http::experimental::listener::http_listener> health;
  if (!flags.health_address.empty()) {
    std::string url = "http://" + flags.health_address;
    health = std::make_unique<web::http::experimental::listener::http_listener>(utility::conversions::to_string_t(url));
    health->support(web::http::methods::GET, [&](web::http::http_request req) {
      const std::string path = req.relative_uri().path();
      if (path == "/healthz") {
        req.reply(web::http::status_codes::OK, "ok");
      } else if (path == "/readyz") {
        bool ready = leading.load() && controller.synced();
        req.reply(ready ? web::http::status_codes::OK : web::http::status_codes::ServiceUnavailable,
                  ready ? "ok" : "not ready");
      } else {
        req.reply(web::http::status_codes::NotFound, "not found");
      }
    });
    try {
      health->open().wait();
    } catch (const std::exception& e) {
      kubetrain::Log("error: cannot serve health checks on ", flags.health_address, ": ", e.what());
      return 2;
    }
  }
  kubetrain::Log("kubetrain-operator: server ", config->server, ", namespace ",
                 flags.namespace_.empty() ? std::string("(all)") : flags.namespace_, ", runtime image ",
                 flags.runtime_image, ", metrics ", metrics ? absl::StrCat(metrics->port()) : std::string("(off)"));

  std::unique_ptr<kubetrain::LeaderElector> elector;  // lives as long as the renewing thread
  if (flags.leader_elect) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    kubetrain::LeaseOptions lease;
    lease.namespace_ = flags.leader_election_namespace;
    lease.identity = absl::StrCat(host, "_", getpid());
    elector = std::make_unique<kubetrain::LeaderElector>(client->get(), &clock, lease);
    if (!elector->Acquire(&g_stop).ok()) return 0;
    leading.store(true);
    std::thread renew([&elector] {
      absl::Status s = elector->KeepRenewing(&g_stop);
      if (!s.ok()) {
        // Another replica may already be acting: stop at once, as controller-runtime does.
        kubetrain::Log("operator: ", s.message(), "; exiting");
        std::_Exit(1);
      }
    });
    renew.detach();
  }
  controller.Run(&g_stop);
  kubetrain::Log("kubetrain-operator: stopped");
  if (health) health->close().wait();
  return 0;
}
