#include "operator/rest_kube_client.h"

#define _TURN_OFF_PLATFORM_STRING  // no U() macro
#include <cpprest/containerstream.h>
#include <cpprest/http_client.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kubetrain {
namespace {

namespace http = web::http;
using web::http::client::http_client;
using web::http::client::http_client_config;

// Percent-encodes a query parameter value (everything but RFC 3986 unreserved).
std::string QueryEscape(absl::string_view in) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : in) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Builds "path?k=v&k=v", skipping empty values.
std::string WithQuery(const std::string& path,
                      std::initializer_list<std::pair<const char*, std::string>> q) {
  std::string out = path;
  char sep = '?';
  for (const auto& [k, v] : q) {
    if (v.empty()) continue;
    out += sep;
    out += k;
    out += '=';
    out += QueryEscape(v);
    sep = '&';
  }
  return out;
}

const char* HttpReasonPhrase(int code) {
  switch (code) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 413:
      return "Request Entity Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "";
  }
}

absl::Status MapCode(int code, absl::string_view reason, const std::string& message) {
  std::string msg = message;
  if (code != 0) {
    absl::StrAppend(&msg, " (HTTP ", code);
    if (*HttpReasonPhrase(code)) absl::StrAppend(&msg, " ", HttpReasonPhrase(code));
    if (!reason.empty()) absl::StrAppend(&msg, ", reason ", reason);
    msg += ")";
  }
  switch (code) {
    case 400:
    case 406:
    case 413:
    case 415:
    case 422:
      return absl::InvalidArgumentError(msg);
    case 401:
      return absl::UnauthenticatedError(msg);
    case 403:
      return absl::PermissionDeniedError(msg);
    case 404:
      return absl::NotFoundError(msg);
    case 405:
      return absl::UnimplementedError(msg);
    case 409:
      return reason == "AlreadyExists" ? absl::AlreadyExistsError(msg) : absl::AbortedError(msg);
    case 410:
      return absl::OutOfRangeError("expired: " + msg);
    case 429:
      return absl::UnavailableError(msg);
    default:
      if (code >= 500 && code <= 599) return absl::UnavailableError(msg);
      return absl::UnknownError(msg);
  }
}

std::string Truncate(absl::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  return absl::StrCat(s.substr(0, n), "...");
}

// Waits for `task` until `deadline`; on expiry cancels the request through
// `cts` and returns DeadlineExceeded. The continuation owns everything it
// touches, so returning early is safe.
template <typename T>
absl::StatusOr<T> Await(pplx::task<T> task, absl::Time deadline,
                        pplx::cancellation_token_source cts, const std::string& what) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<T>>>();
  std::future<absl::StatusOr<T>> future = promise->get_future();
  task.then([promise, what](pplx::task<T> t) {
    try {
      promise->set_value(t.get());
    } catch (const pplx::task_canceled&) {
      promise->set_value(absl::CancelledError(what + ": cancelled"));
    } catch (const std::exception& e) {
      promise->set_value(absl::UnavailableError(absl::StrCat(what, ": ", e.what())));
    } catch (...) {
      promise->set_value(absl::UnavailableError(what + ": unknown error"));
    }
  });
  if (future.wait_until(absl::ToChronoTime(deadline)) == std::future_status::timeout) {
    cts.cancel();
    return absl::DeadlineExceededError(what + ": no answer before the client deadline");
  }
  return future.get();
}

// Checks PEM blobs the way the TLS callback will use them, so that a bad
// kubeconfig fails in New() and not on every request.
absl::Status ConfigureSsl(boost::asio::ssl::context& ctx, const KubeConfig& cfg) {
  boost::system::error_code ec;
  if (!cfg.ca_pem.empty()) {
    ctx.add_certificate_authority(boost::asio::buffer(cfg.ca_pem), ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat(cfg.source, ": certificate authority: ", ec.message()));
  }
  if (!cfg.client_cert_pem.empty()) {
    ctx.use_certificate_chain(boost::asio::buffer(cfg.client_cert_pem), ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat(cfg.source, ": client certificate: ", ec.message()));
    ctx.use_private_key(boost::asio::buffer(cfg.client_key_pem), boost::asio::ssl::context::pem,
                        ec);
    if (ec)
      return absl::InvalidArgumentError(absl::StrCat(cfg.source, ": client key: ", ec.message()));
  }
  return absl::OkStatus();
}

// The certificates of `ca_pem` in a trust store of their own (nullptr for
// no CA: the system's trust store is used).
absl::StatusOr<std::shared_ptr<X509_STORE>> TrustStoreOf(const std::string& ca_pem,
                                                         const std::string& source) {
  if (ca_pem.empty()) return std::shared_ptr<X509_STORE>();
  std::shared_ptr<X509_STORE> store(X509_STORE_new(), X509_STORE_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())), BIO_free);
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    const bool ok = X509_STORE_add_cert(store.get(), cert) == 1;
    X509_free(cert);
    if (!ok) break;
    ++added;
  }
  ERR_clear_error();  // the end of the PEM data reads as an error
  if (added == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": certificate authority: no PEM certificate in it"));
  }
  return store;
}

}  // namespace

// ---------------------------------------------------------------------------
// Pure helpers.

absl::Status StatusFromKubeStatus(const nlohmann::json& status, absl::string_view what) {
  int code = 0;
  std::string message, reason;
  if (status.is_object()) {
    if (status.contains("code") && status["code"].is_number_integer())
      code = status["code"].get<int>();
    if (status.contains("message") && status["message"].is_string())
      message = status["message"].get<std::string>();
    if (status.contains("reason") && status["reason"].is_string())
      reason = status["reason"].get<std::string>();
  }
  if (message.empty()) message = Truncate(status.dump(), 512);
  if (code == 0) return absl::UnknownError(absl::StrCat(what, ": ", message));
  return MapCode(code, reason, absl::StrCat(what, ": ", message));
}

absl::Status StatusFromHttp(int http_status, absl::string_view body, absl::string_view what) {
  if (http_status >= 200 && http_status <= 299) return absl::OkStatus();
  std::string message, reason;
  nlohmann::json j =
      nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.value("kind", "") == "Status") {
    if (j.contains("message") && j["message"].is_string())
      message = j["message"].get<std::string>();
    if (j.contains("reason") && j["reason"].is_string()) reason = j["reason"].get<std::string>();
  } else {
    message = Truncate(absl::StripAsciiWhitespace(body), 512);
  }
  if (message.empty()) message = "(no message)";
  return MapCode(http_status, reason, absl::StrCat(what, ": ", message));
}

absl::StatusOr<WatchEvent> ParseWatchEventLine(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  nlohmann::json j =
      nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("watch: malformed event line: ", Truncate(line, 200)));
  }
  if (!j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("watch: event without type: ", Truncate(line, 200)));
  }
  if (!j.contains("object") || !j["object"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("watch: event without object: ", Truncate(line, 200)));
  }
  const std::string type = j["type"].get<std::string>();
  WatchEvent ev;
  if (type == "ADDED") {
    ev.type = WatchEventType::kAdded;
  } else if (type == "MODIFIED") {
    ev.type = WatchEventType::kModified;
  } else if (type == "DELETED") {
    ev.type = WatchEventType::kDeleted;
  } else if (type == "BOOKMARK") {
    ev.type = WatchEventType::kBookmark;
  } else if (type == "ERROR") {
    ev.type = WatchEventType::kError;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("watch: unknown event type \"", type, "\""));
  }
  ev.object = std::move(j["object"]);
  return ev;
}

// ---------------------------------------------------------------------------
// RestKubeClient.

absl::StatusOr<std::unique_ptr<RestKubeClient>> RestKubeClient::New(const KubeConfig& config,
                                                                    const Options& options) {
  const std::string src = config.source.empty() ? "kube config" : config.source;
  if (!absl::StartsWith(config.server, "https://") && !absl::StartsWith(config.server, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": server \"", config.server, "\" must be an http:// or https:// URL"));
  }
  if (!web::uri::validate(config.server)) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": server \"", config.server, "\" is not a valid URL"));
  }
  if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": client certificate and key must be given together"));
  }
  if (options.list_page_size < 0) return absl::InvalidArgumentError("list_page_size must be >= 0");
  {
    boost::asio::ssl::context probe(boost::asio::ssl::context::sslv23);
    KubeConfig c = config;
    c.source = src;
    if (absl::Status s = ConfigureSsl(probe, c); !s.ok()) return s;
  }
  auto trust = TrustStoreOf(config.ca_pem, src);
  if (!trust.ok()) return trust.status();
  if (*trust) {
    // Every connection's context then trusts only the kubeconfig's CA: spare
    // cpprestsdk the system bundle it would parse for each one (about 140
    // certificates, 1 MiB of short-lived allocations per connection, dozens
    // at once when many requests start together), which the trust store
    // replaces anyway. The operator makes no other TLS connection.
    setenv("SSL_CERT_FILE", "/dev/null", /*overwrite=*/1);
  }
  std::unique_ptr<RestKubeClient> client(new RestKubeClient(config, options));
  client->trust_ = *std::move(trust);
  try {
    client->client_ = std::make_unique<http_client>(
        config.server, *client->MakeHttpConfig(options.request_timeout + absl::Seconds(1)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": cannot create HTTP client: ", e.what()));
  }
  return client;
}

RestKubeClient::RestKubeClient(KubeConfig config, Options options)
    : config_(std::move(config)), options_(std::move(options)) {
  absl::MutexLock l(&token_mu_);
  token_ = config_.bearer_token;
  token_read_at_ = absl::Now();
}

RestKubeClient::~RestKubeClient() = default;

std::unique_ptr<http_client_config> RestKubeClient::MakeHttpConfig(absl::Duration timeout) const {
  auto cfg = std::make_unique<http_client_config>();
  // cpprestsdk's timeout is an idle timer (reset per received chunk).
  cfg->set_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  cfg->set_validate_certificates(!config_.insecure_skip_tls_verify);
  KubeConfig tls;  // only what the callback needs, copied into it
  tls.client_cert_pem = config_.client_cert_pem;
  tls.client_key_pem = config_.client_key_pem;
  tls.source = config_.source;
  cfg->set_ssl_context_callback([tls, trust = trust_](boost::asio::ssl::context& ctx) {
    // cpprestsdk gives every connection a context of its own with the system
    // trust store loaded (about 0.7 MiB each, and the operator keeps dozens
    // of connections): with the kubeconfig's CA, that CA alone is trusted
    // (as client-go does), from one store shared by every connection.
    if (trust) SSL_CTX_set1_cert_store(ctx.native_handle(), trust.get());
    // Validated in New(); errors cannot happen here short of memory exhaustion.
    (void)ConfigureSsl(ctx, tls);
  });
  return cfg;
}

std::string RestKubeClient::BearerToken() {
  absl::MutexLock l(&token_mu_);
  if (!config_.token_file.empty() && absl::Now() - token_read_at_ >= options_.token_refresh) {
    token_read_at_ = absl::Now();
    std::ifstream in(config_.token_file, std::ios::binary);
    std::ostringstream ss;
    if (in && (ss << in.rdbuf())) {
      std::string t(absl::StripAsciiWhitespace(ss.str()));
      if (!t.empty()) token_ = t;  // keep the old token if the file is mid-rotation
    }
  }
  return token_;
}

absl::StatusOr<nlohmann::json> RestKubeClient::Do(const std::string& method,
                                                  const std::string& path_and_query,
                                                  const nlohmann::json* body,
                                                  const std::string& content_type,
                                                  absl::Time deadline) {
  const std::string what = absl::StrCat(method, " ", path_and_query);
  http::http_request req(method);
  req.set_request_uri(path_and_query);
  req.headers().add("Accept", "application/json");
  req.headers().add("User-Agent", options_.user_agent);
  const std::string token = BearerToken();
  if (!token.empty()) req.headers().add("Authorization", "Bearer " + token);
  if (body != nullptr) req.set_body(body->dump(), content_type);

  pplx::cancellation_token_source cts;
  pplx::task<http::http_response> sent;
  try {
    sent = client_->request(req, cts.get_token());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  }
  absl::StatusOr<http::http_response> resp = Await(sent, deadline, cts, what);
  if (!resp.ok()) return resp.status();
  absl::StatusOr<std::string> text =
      Await(resp->extract_utf8string(/*ignore_content_type=*/true), deadline, cts, what);
  if (!text.ok()) return text.status();
  const int code = resp->status_code();
  if (code < 200 || code > 299) return StatusFromHttp(code, *text, what);
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InternalError(
        absl::StrCat(what, ": response is not JSON: ", Truncate(*text, 200)));
  }
  return j;
}

absl::StatusOr<nlohmann::json> RestKubeClient::Get(const ResourceRef& ref) {
  if (ref.name.empty())
    return absl::InvalidArgumentError("Get " + ref.DebugString() + ": name is empty");
  return Do("GET", ref.Path(), nullptr, "", absl::Now() + options_.request_timeout);
}

absl::StatusOr<nlohmann::json> RestKubeClient::ListOnce(const ResourceRef& ref,
                                                        const std::string& label_selector,
                                                        int limit, absl::Time deadline) {
  nlohmann::json result;
  std::string cont;
  bool first = true;
  do {
    auto page = Do("GET",
                   WithQuery(ref.Path(), {{"labelSelector", label_selector},
                                          {"limit", limit > 0 ? std::to_string(limit) : ""},
                                          {"continue", cont}}),
                   nullptr, "", deadline);
    if (!page.ok()) return page.status();
    nlohmann::json& p = *page;
    if (!p.contains("items") || p["items"].is_null()) p["items"] = nlohmann::json::array();
    if (!p["items"].is_array())
      return absl::InternalError("List " + ref.DebugString() + ": items is not an array");
    cont.clear();
    if (p.contains("metadata") && p["metadata"].is_object()) {
      cont = p["metadata"].value("continue", "");
    }
    if (first) {
      result = std::move(p);
      first = false;
    } else {
      auto& items = result["items"];
      for (auto& it : p["items"]) items.push_back(std::move(it));
    }
  } while (!cont.empty());
  if (result.contains("metadata") && result["metadata"].is_object()) {
    result["metadata"].erase("continue");
    result["metadata"].erase("remainingItemCount");
  }
  return result;
}

absl::StatusOr<nlohmann::json> RestKubeClient::List(const ResourceRef& ref,
                                                    const std::string& label_selector) {
  if (!ref.name.empty())
    return absl::InvalidArgumentError("List " + ref.DebugString() + ": name must be empty");
  const absl::Time deadline = absl::Now() + options_.request_timeout;
  auto r = ListOnce(ref, label_selector, options_.list_page_size, deadline);
  if (r.status().code() == absl::StatusCode::kOutOfRange && options_.list_page_size > 0) {
    // The continue token expired between pages: one consistent unpaged list.
    r = ListOnce(ref, label_selector, 0, deadline);
  }
  return r;
}

absl::StatusOr<nlohmann::json> RestKubeClient::Create(const ResourceRef& ref,
                                                      const nlohmann::json& object) {
  ResourceRef collection = ref;
  collection.name.clear();
  collection.subresource.clear();
  return Do("POST", collection.Path(), &object, "application/json",
            absl::Now() + options_.request_timeout);
}

absl::StatusOr<nlohmann::json> RestKubeClient::Replace(const ResourceRef& ref,
                                                       const nlohmann::json& object) {
  if (ref.name.empty())
    return absl::InvalidArgumentError("Replace " + ref.DebugString() + ": name is empty");
  return Do("PUT", ref.Path(), &object, "application/json", absl::Now() + options_.request_timeout);
}

absl::StatusOr<nlohmann::json> RestKubeClient::MergePatch(const ResourceRef& ref,
                                                          const nlohmann::json& patch) {
  if (ref.name.empty())
    return absl::InvalidArgumentError("MergePatch " + ref.DebugString() + ": name is empty");
  return Do("PATCH", ref.Path(), &patch, "application/merge-patch+json",
            absl::Now() + options_.request_timeout);
}

absl::Status RestKubeClient::Delete(const ResourceRef& ref, const std::string& propagation_policy) {
  if (ref.name.empty())
    return absl::InvalidArgumentError("Delete " + ref.DebugString() + ": name is empty");
  return Do("DELETE", WithQuery(ref.Path(), {{"propagationPolicy", propagation_policy}}), nullptr,
            "", absl::Now() + options_.request_timeout)
      .status();
}

absl::Status RestKubeClient::Watch(const ResourceRef& ref, const std::string& label_selector,
                                   const std::string& resource_version,
                                   const std::function<bool(const WatchEvent&)>& on_event,
                                   int timeout_seconds) {
  if (timeout_seconds <= 0) return absl::InvalidArgumentError("Watch: timeout_seconds must be > 0");
  if (!ref.name.empty())
    return absl::InvalidArgumentError("Watch " + ref.DebugString() + ": name must be empty");
  const absl::Duration limit = absl::Seconds(timeout_seconds) + options_.watch_grace;
  const absl::Time deadline = absl::Now() + limit;
  const std::string path =
      WithQuery(ref.Path(), {{"watch", "1"},
                             {"allowWatchBookmarks", "true"},
                             {"timeoutSeconds", std::to_string(timeout_seconds)},
                             {"resourceVersion", resource_version},
                             {"labelSelector", label_selector}});
  const std::string what = "WATCH " + path;

  // A connection of its own, whose idle timeout outlasts the server's
  // timeoutSeconds.
  std::unique_ptr<http_client> client;
  try {
    client = std::make_unique<http_client>(config_.server, *MakeHttpConfig(limit));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  }
  http::http_request req(http::methods::GET);
  req.set_request_uri(path);
  req.headers().add("Accept", "application/json");
  req.headers().add("User-Agent", options_.user_agent);
  const std::string token = BearerToken();
  if (!token.empty()) req.headers().add("Authorization", "Bearer " + token);

  pplx::cancellation_token_source cts;
  pplx::task<http::http_response> sent;
  try {
    sent = client->request(req, cts.get_token());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  }
  // Completes when the headers are in; the body keeps streaming.
  absl::StatusOr<http::http_response> resp = Await(sent, deadline, cts, what);
  if (!resp.ok()) return resp.status();
  if (resp->status_code() != http::status_codes::OK) {
    auto text = Await(resp->extract_utf8string(true), deadline, cts, what);
    return StatusFromHttp(resp->status_code(), text.ok() ? *text : "", what);
  }

  // Never extract_json()/extract_string() here: they wait for the end of the
  // stream. Events are newline-separated JSON; chunk boundaries are not event
  // boundaries, which read_line takes care of.
  concurrency::streams::istream body = resp->body();
  while (true) {
    concurrency::streams::container_buffer<std::string> line;
    absl::StatusOr<size_t> n = Await(body.read_line(line), deadline, cts, what);
    if (!n.ok()) {
      if (n.status().code() == absl::StatusCode::kDeadlineExceeded) return n.status();
      return absl::UnavailableError(absl::StrCat("watch stream broken: ", n.status().message()));
    }
    const std::string& text = line.collection();
    if (absl::StripAsciiWhitespace(text).empty()) {
      if (body.is_eof()) return absl::OkStatus();  // the server ended the watch
      continue;
    }
    absl::StatusOr<WatchEvent> ev = ParseWatchEventLine(text);
    if (!ev.ok()) {
      cts.cancel();
      return absl::InternalError(absl::StrCat(what, ": ", ev.status().message()));
    }
    if (ev->type == WatchEventType::kError) {
      cts.cancel();
      return StatusFromKubeStatus(ev->object, what);
    }
    if (!on_event(*ev)) {
      cts.cancel();  // closes the connection instead of draining it
      return absl::OkStatus();
    }
  }
}

}  // namespace kubetrain
