// RestKubeClient: KubeClient over HTTPS (cpprestsdk, ASIO backend, HTTP/1.1).
//
//   absl::StatusOr<KubeConfig> cfg = LoadKubeConfigFile(path);   // in main()
//   absl::StatusOr<std::unique_ptr<RestKubeClient>> client =
//       RestKubeClient::New(*cfg, RestKubeClient::Options());
//   absl::StatusOr<nlohmann::json> cm =
//       (*client)->Get({"/api/v1", "configmaps", "default", "my-cm", ""});
//
// Thread safety: a RestKubeClient is safe for concurrent use from any number
// of threads without external synchronization (the underlying http_client is
// thread-safe and all per-call state is local; the bearer token cache is
// mutex-guarded). A Watch blocks its calling thread only.
//
// TLS: with a CA in the kubeconfig, only that CA is trusted (as client-go
// does), not the system's trust store; New() then also sets SSL_CERT_FILE to
// /dev/null for the process, so that no connection loads the system bundle
// only to drop it.
//
// Deadlines: every non-watch call (including all pages of a List) is bounded
// by Options::request_timeout as an absolute deadline; when it expires the
// request is cancelled and DeadlineExceeded is returned. A Watch uses its own
// connection whose idle timeout and deadline are timeout_seconds +
// Options::watch_grace, so a quiet watch is never cut by the client before the
// server ends it (cpprestsdk's timeout is an idle timer reset per chunk).
#ifndef KUBETRAIN_OPERATOR_REST_KUBE_CLIENT_H_
#define KUBETRAIN_OPERATOR_REST_KUBE_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube_client.h"
#include "operator/kubeconfig.h"

struct x509_store_st;  // OpenSSL's X509_STORE

namespace web::http::client {
class http_client;
class http_client_config;
}  // namespace web::http::client

namespace kubetrain {

class RestKubeClient : public KubeClient {
 public:
  struct Options {
    // Absolute deadline of each non-watch call.
    absl::Duration request_timeout = absl::Seconds(30);
    // Added to a watch's timeout_seconds for the client-side idle timeout and
    // deadline.
    absl::Duration watch_grace = absl::Seconds(30);
    // Page size of List (the API server's `limit`).
    int list_page_size = 500;
    // How often a token_file (rotated service-account token) is re-read.
    absl::Duration token_refresh = absl::Minutes(1);
    // Sent as User-Agent.
    std::string user_agent = "kubetrain-operator";
  };

  // Validates `config` (server URL, PEM blobs) and builds the client. Does not
  // contact the server.
  static absl::StatusOr<std::unique_ptr<RestKubeClient>> New(const KubeConfig& config,
                                                             const Options& options);

  ~RestKubeClient() override;
  RestKubeClient(const RestKubeClient&) = delete;
  RestKubeClient& operator=(const RestKubeClient&) = delete;

  absl::StatusOr<nlohmann::json> Get(const ResourceRef& ref) override;
  absl::StatusOr<nlohmann::json> List(const ResourceRef& ref,
                                      const std::string& label_selector) override;
  absl::StatusOr<nlohmann::json> Create(const ResourceRef& ref,
                                        const nlohmann::json& object) override;
  absl::StatusOr<nlohmann::json> Replace(const ResourceRef& ref,
                                         const nlohmann::json& object) override;
  absl::StatusOr<nlohmann::json> MergePatch(const ResourceRef& ref,
                                            const nlohmann::json& patch) override;
  absl::Status Delete(const ResourceRef& ref, const std::string& propagation_policy) override;
  absl::Status Watch(const ResourceRef& ref, const std::string& label_selector,
                     const std::string& resource_version,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     int timeout_seconds) override;

 private:
  struct Response;
  RestKubeClient(KubeConfig config, Options options);

  std::unique_ptr<web::http::client::http_client_config> MakeHttpConfig(
      absl::Duration timeout) const;
  std::string BearerToken();
  // One non-watch request with the JSON result (or mapped error).
  absl::StatusOr<nlohmann::json> Do(const std::string& method, const std::string& path_and_query,
                                    const nlohmann::json* body, const std::string& content_type,
                                    absl::Time deadline);
  absl::StatusOr<nlohmann::json> ListOnce(const ResourceRef& ref, const std::string& label_selector,
                                          int limit, absl::Time deadline);

  const KubeConfig config_;
  const Options options_;
  // The kubeconfig's CA as a trust store, shared by every connection (null:
  // no CA given, the system's trust store is used). Set once by New().
  std::shared_ptr<x509_store_st> trust_;
  std::unique_ptr<web::http::client::http_client> client_;

  absl::Mutex token_mu_;
  std::string token_ ABSL_GUARDED_BY(token_mu_);
  absl::Time token_read_at_ ABSL_GUARDED_BY(token_mu_);
};

// ---------------------------------------------------------------------------
// Pure helpers, exposed for unit tests and for fakes that want identical
// error mapping.

// Maps an HTTP status and response body (ideally a meta/v1 Status) to an
// absl::Status as documented in kube_client.h. `what` (e.g. "PUT configmaps
// default/x") prefixes the message; the API server's Status.message follows.
// 409 uses Status.reason: "AlreadyExists" -> AlreadyExists, otherwise Aborted.
// Returns OK for 2xx.
absl::Status StatusFromHttp(int http_status, absl::string_view body, absl::string_view what);

// Same, for a parsed meta/v1 Status object (an ERROR watch event's object).
absl::Status StatusFromKubeStatus(const nlohmann::json& status, absl::string_view what);

// Parses one watch-stream line ({"type": ..., "object": {...}}). Surrounding
// whitespace (and a trailing \r) is ignored. InvalidArgument for malformed
// JSON, a missing object or an unknown type.
absl::StatusOr<WatchEvent> ParseWatchEventLine(absl::string_view line);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_REST_KUBE_CLIENT_H_
