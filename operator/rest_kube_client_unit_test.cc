// Unit tests of RestKubeClient without a cluster: the pure helpers, and the
// HTTP/watch machinery against a local plain-HTTP cpprestsdk listener on
// 127.0.0.1 that streams hand-written watch bodies in awkward chunks.
#include "operator/rest_kube_client.h"

// cpprestsdk's U() macro clashes with GoogleTest's template parameters.
#define _TURN_OFF_PLATFORM_STRING
#include <arpa/inet.h>
#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

// gtest only (gmock is not among the system deps).
#define EXPECT_CONTAINS(haystack, needle)          \
  EXPECT_TRUE(absl::StrContains(haystack, needle)) \
      << "expected to contain \"" << (needle) << "\":\n  " << (haystack)

namespace kubetrain {
namespace {

using web::http::http_request;
using web::http::http_response;
using web::http::methods;

// ---------------------------------------------------------------------------
// Pure helpers.

TEST(ResourceRefTest, Paths) {
  EXPECT_EQ((ResourceRef{"/api/v1", "configmaps", "default", "cfg", ""}.Path()),
            "/api/v1/namespaces/default/configmaps/cfg");
  EXPECT_EQ((ResourceRef{"/apis/kubetrain.io/v1", "trainingjobs", "ns", "job", "status"}.Path()),
            "/apis/kubetrain.io/v1/namespaces/ns/trainingjobs/job/status");
  EXPECT_EQ((ResourceRef{"/api/v1", "nodes", "", "", ""}.Path()), "/api/v1/nodes");
  EXPECT_EQ((ResourceRef{"/api/v1", "pods", "", "", ""}.DebugString()), "pods");
  EXPECT_EQ((ResourceRef{"/api/v1", "pods", "ns", "p", "status"}.DebugString()),
            "pods ns/p/status");
  EXPECT_EQ((ResourceRef{"/api/v1", "pods", "ns", "a b/c", ""}.Path()),
            "/api/v1/namespaces/ns/pods/a%20b%2Fc");
}

TEST(StatusFromHttpTest, MapsCodesAndKeepsTheServerMessage) {
  auto body = [](int code, const std::string& reason, const std::string& msg) {
    return nlohmann::json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
                          {"message", msg},   {"reason", reason},   {"code", code}}
        .dump();
  };
  struct Case {
    int code;
    std::string reason;
    absl::StatusCode want;
  };
  for (const Case& c :
       std::vector<Case>{{400, "BadRequest", absl::StatusCode::kInvalidArgument},
                         {401, "Unauthorized", absl::StatusCode::kUnauthenticated},
                         {403, "Forbidden", absl::StatusCode::kPermissionDenied},
                         {404, "NotFound", absl::StatusCode::kNotFound},
                         {409, "AlreadyExists", absl::StatusCode::kAlreadyExists},
                         {409, "Conflict", absl::StatusCode::kAborted},
                         {410, "Expired", absl::StatusCode::kOutOfRange},
                         {422, "Invalid", absl::StatusCode::kInvalidArgument},
                         {429, "TooManyRequests", absl::StatusCode::kUnavailable},
                         {500, "InternalError", absl::StatusCode::kUnavailable},
                         {503, "ServiceUnavailable", absl::StatusCode::kUnavailable}}) {
    absl::Status s = StatusFromHttp(c.code, body(c.code, c.reason, "the server says no"), "PUT /x");
    EXPECT_EQ(s.code(), c.want) << c.code << " " << c.reason << ": " << s;
    EXPECT_CONTAINS(s.message(), "PUT /x: the server says no");
    EXPECT_CONTAINS(s.message(), "HTTP " + std::to_string(c.code));
  }
  EXPECT_TRUE(StatusFromHttp(201, "", "x").ok());
  // Not a Status (e.g. a proxy's HTML page): the body becomes the message.
  absl::Status s = StatusFromHttp(502, "<html>bad gateway</html>\n", "GET /y");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_CONTAINS(s.message(), "GET /y: <html>bad gateway</html> (HTTP 502)");
}

TEST(ParseWatchEventLineTest, Types) {
  auto ev = ParseWatchEventLine(
      R"({"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a"}}})");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->type, WatchEventType::kAdded);
  EXPECT_EQ(ev->object["metadata"]["name"], "a");

  ev = ParseWatchEventLine(
      "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"12\"}}}\r\n");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->type, WatchEventType::kBookmark);
  EXPECT_EQ(ev->object["metadata"]["resourceVersion"], "12");

  for (const char* t : {"MODIFIED", "DELETED", "ERROR"}) {
    ev = ParseWatchEventLine(std::string("{\"type\":\"") + t + "\",\"object\":{}}");
    ASSERT_TRUE(ev.ok()) << ev.status();
    EXPECT_STREQ(WatchEventTypeName(ev->type), t);
  }
  EXPECT_EQ(ParseWatchEventLine("{\"type\":\"ADDED\",\"obj").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWatchEventLine("{\"type\":\"ADDED\"}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWatchEventLine("{\"object\":{}}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWatchEventLine("{\"type\":\"RENAMED\",\"object\":{}}").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StatusFromKubeStatusTest, ExpiredErrorEventIsOutOfRange) {
  auto ev = ParseWatchEventLine(
      R"j({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)j"
      R"j("message":"too old resource version: 1 (2345)","reason":"Expired","code":410}})j");
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ(ev->type, WatchEventType::kError);
  absl::Status s = StatusFromKubeStatus(ev->object, "WATCH configmaps");
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_CONTAINS(s.message(), "too old resource version: 1 (2345)");

  s = StatusFromKubeStatus(
      nlohmann::json{{"kind", "Status"}, {"code", 500}, {"message", "etcd down"}}, "W");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromKubeStatus(nlohmann::json::object(), "W").code(), absl::StatusCode::kUnknown);
}

// ---------------------------------------------------------------------------
// Against a local listener.

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A tiny fake API server: each test installs a handler.
class FakeServer {
 public:
  using Handler = std::function<void(http_request)>;

  FakeServer() : url_("http://127.0.0.1:" + std::to_string(FreePort())), listener_(url_) {
    for (const auto& m :
         {methods::GET, methods::POST, methods::PUT, methods::PATCH, methods::DEL}) {
      listener_.support(m, [this](http_request req) {
        {
          std::lock_guard<std::mutex> l(mu_);
          uris_.push_back(req.relative_uri().to_string());
          auths_.push_back(req.headers().has("Authorization") ? req.headers()["Authorization"]
                                                              : "");
          content_types_.push_back(req.headers().content_type());
        }
        handler_(req);
      });
    }
    listener_.open().wait();
  }
  ~FakeServer() {
    {
      // Under the lock: a handler's Spawn may still be inside emplace_back
      // (its thread already running and feeding the client) when the test
      // ends; reading threads_ then raced with it and could miss that thread,
      // whose destruction while joinable called std::terminate.
      std::lock_guard<std::mutex> l(mu_);
      for (auto& t : threads_) t.join();
    }
    listener_.close().wait();
  }

  const std::string& url() const { return url_; }
  void set_handler(Handler h) { handler_ = std::move(h); }
  // Runs `f` on a thread joined by the destructor (for streaming bodies).
  void Spawn(std::function<void()> f) {
    std::lock_guard<std::mutex> l(mu_);
    threads_.emplace_back(std::move(f));
  }
  std::string last_uri() {
    std::lock_guard<std::mutex> l(mu_);
    return uris_.empty() ? "" : uris_.back();
  }
  std::string last_auth() {
    std::lock_guard<std::mutex> l(mu_);
    return auths_.empty() ? "" : auths_.back();
  }
  std::string last_content_type() {
    std::lock_guard<std::mutex> l(mu_);
    return content_types_.empty() ? "" : content_types_.back();
  }

 private:
  std::string url_;
  web::http::experimental::listener::http_listener listener_;
  Handler handler_;
  std::mutex mu_;
  std::vector<std::thread> threads_;                       // guarded by mu_
  std::vector<std::string> uris_, auths_, content_types_;  // guarded by mu_
};

// Replies 200 with a chunked body made of `pieces`, written with pauses, then
// keeps the stream open for `hold` before ending it.
void StreamPieces(FakeServer* server, http_request req, std::vector<std::string> pieces,
                  std::chrono::milliseconds hold = std::chrono::milliseconds(0)) {
  concurrency::streams::producer_consumer_buffer<uint8_t> buf;
  http_response resp(web::http::status_codes::OK);
  resp.set_body(concurrency::streams::istream(buf), "application/json");
  req.reply(resp);
  server->Spawn([buf, pieces, hold]() mutable {
    for (const std::string& p : pieces) {
      buf.putn_nocopy(reinterpret_cast<const uint8_t*>(p.data()), p.size()).wait();
      buf.sync().wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    std::this_thread::sleep_for(hold);
    buf.close(std::ios_base::out).wait();
  });
}

std::unique_ptr<RestKubeClient> NewClient(const std::string& url, RestKubeClient::Options o = {}) {
  KubeConfig cfg;
  cfg.server = url;
  cfg.bearer_token = "tok";
  cfg.source = "test";
  auto c = RestKubeClient::New(cfg, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

const ResourceRef kConfigMaps{"/api/v1", "configmaps", "default", "", ""};

std::string Event(const std::string& type, const std::string& name, const std::string& rv) {
  return nlohmann::json{
      {"type", type},
      {"object", {{"kind", "ConfigMap"}, {"metadata", {{"name", name}, {"resourceVersion", rv}}}}}}
      .dump();
}

TEST(RestKubeClientLocalTest, WatchSplitsEventsAcrossChunkBoundaries) {
  FakeServer server;
  const std::string a = Event("ADDED", "a", "11"), m = Event("MODIFIED", "a", "12"),
                    d = Event("DELETED", "a", "14");
  const std::string b =
      R"({"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"13"}}})";
  server.set_handler([&](http_request req) {
    StreamPieces(&server, req,
                 {a.substr(0, 10), a.substr(10) + "\n" + m.substr(0, 5), m.substr(5) + "\n",
                  b + "\n" + d + "\n"});
  });
  auto client = NewClient(server.url());
  ASSERT_NE(client, nullptr);
  std::vector<std::string> seen;
  absl::Status s = client->Watch(
      kConfigMaps, "app=x,role in (a,b)", "10",
      [&](const WatchEvent& e) {
        seen.push_back(std::string(WatchEventTypeName(e.type)) + ":" +
                       e.object["metadata"].value("resourceVersion", ""));
        return true;
      },
      5);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen,
            (std::vector<std::string>{"ADDED:11", "MODIFIED:12", "BOOKMARK:13", "DELETED:14"}));
  EXPECT_EQ(
      server.last_uri(),
      "/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true&timeoutSeconds=5"
      "&resourceVersion=10&labelSelector=app%3Dx%2Crole%20in%20%28a%2Cb%29");
  EXPECT_EQ(server.last_auth(), "Bearer tok");
}

TEST(RestKubeClientLocalTest, WatchErrorEvent410IsOutOfRange) {
  FakeServer server;
  server.set_handler([&](http_request req) {
    StreamPieces(
        &server, req,
        {Event("ADDED", "a", "5") + "\n",
         R"j({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)j"
         R"j("message":"too old resource version: 1 (200)","reason":"Expired","code":410}})j"
         "\n"},
        std::chrono::milliseconds(200));
  });
  auto client = NewClient(server.url());
  int events = 0;
  absl::Status s = client->Watch(
      kConfigMaps, "", "1", [&](const WatchEvent&) { return ++events, true; }, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_CONTAINS(s.message(), "too old resource version");
  EXPECT_EQ(events, 1);  // the ERROR event itself is not delivered
}

TEST(RestKubeClientLocalTest, WatchHttp410IsOutOfRange) {
  FakeServer server;
  server.set_handler([](http_request req) {
    req.reply(
        410,
        nlohmann::json{{"kind", "Status"}, {"code", 410}, {"reason", "Gone"}, {"message", "gone"}}
            .dump(),
        "application/json");
  });
  auto client = NewClient(server.url());
  absl::Status s = client->Watch(
      kConfigMaps, "", "1", [](const WatchEvent&) { return true; }, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
}

TEST(RestKubeClientLocalTest, WatchStopsWhenCallbackReturnsFalse) {
  FakeServer server;
  server.set_handler([&](http_request req) {
    // Two events, then a stream that stays open for 3 s.
    StreamPieces(&server, req, {Event("ADDED", "a", "1") + "\n" + Event("ADDED", "b", "2") + "\n"},
                 std::chrono::milliseconds(3000));
  });
  auto client = NewClient(server.url());
  int events = 0;
  absl::Time start = absl::Now();
  absl::Status s = client->Watch(
      kConfigMaps, "", "", [&](const WatchEvent&) { return ++events < 1; }, 10);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(events, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(RestKubeClientLocalTest, ListPagesAndMergesItems) {
  FakeServer server;
  server.set_handler([](http_request req) {
    auto q = web::uri::split_query(req.request_uri().query());
    EXPECT_EQ(q["limit"], "2");
    nlohmann::json page = {
        {"kind", "ConfigMapList"}, {"apiVersion", "v1"}, {"metadata", {{"resourceVersion", "77"}}}};
    if (q.count("continue") == 0) {
      page["items"] = {{{"metadata", {{"name", "a"}}}}, {{"metadata", {{"name", "b"}}}}};
      page["metadata"]["continue"] = "tok1";
      page["metadata"]["remainingItemCount"] = 1;
    } else {
      EXPECT_EQ(q["continue"], "tok1");
      page["items"] = {{{"metadata", {{"name", "c"}}}}};
    }
    req.reply(200, page.dump(), "application/json");
  });
  RestKubeClient::Options o;
  o.list_page_size = 2;
  auto client = NewClient(server.url(), o);
  auto list = client->List(kConfigMaps, "");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ((*list)["items"].size(), 3u);
  EXPECT_EQ((*list)["items"][2]["metadata"]["name"], "c");
  EXPECT_EQ((*list)["metadata"]["resourceVersion"], "77");
  EXPECT_FALSE((*list)["metadata"].contains("continue"));
  EXPECT_FALSE((*list)["metadata"].contains("remainingItemCount"));
}

TEST(RestKubeClientLocalTest, WritesUseTheRightMethodsAndContentTypes) {
  FakeServer server;
  std::string method;
  server.set_handler([&](http_request req) {
    method = req.method();
    if (req.method() == methods::POST) {
      req.reply(
          409,
          R"({"kind":"Status","code":409,"reason":"AlreadyExists","message":"configmaps \"a\" already exists"})",
          "application/json");
    } else if (req.method() == methods::PUT) {
      req.reply(
          409,
          R"({"kind":"Status","code":409,"reason":"Conflict","message":"the object has been modified"})",
          "application/json");
    } else {
      req.reply(200, R"({"kind":"ConfigMap","metadata":{"name":"a"}})", "application/json");
    }
  });
  auto client = NewClient(server.url());
  ResourceRef a = kConfigMaps;
  a.name = "a";
  auto created = client->Create(a, {{"metadata", {{"name", "a"}}}});
  EXPECT_EQ(created.status().code(), absl::StatusCode::kAlreadyExists) << created.status();
  EXPECT_CONTAINS(created.status().message(), "configmaps \"a\" already exists");
  EXPECT_EQ(server.last_uri(), "/api/v1/namespaces/default/configmaps");
  EXPECT_EQ(server.last_content_type(), "application/json");

  auto replaced = client->Replace(a, {{"metadata", {{"name", "a"}, {"resourceVersion", "1"}}}});
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kAborted) << replaced.status();

  ResourceRef status = a;
  status.subresource = "status";
  auto patched = client->MergePatch(status, {{"status", {{"phase", "Running"}}}});
  EXPECT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(method, "PATCH");
  EXPECT_EQ(server.last_uri(), "/api/v1/namespaces/default/configmaps/a/status");
  EXPECT_EQ(server.last_content_type(), "application/merge-patch+json");

  EXPECT_TRUE(client->Delete(a, kPropagationBackground).ok());
  EXPECT_EQ(method, "DELETE");
  EXPECT_EQ(server.last_uri(),
            "/api/v1/namespaces/default/configmaps/a?propagationPolicy=Background");
}

TEST(RestKubeClientLocalTest, PerCallDeadline) {
  FakeServer server;
  server.set_handler([&](http_request req) {
    server.Spawn([req]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      req.reply(200, "{}", "application/json");
    });
  });
  RestKubeClient::Options o;
  o.request_timeout = absl::Milliseconds(300);
  auto client = NewClient(server.url(), o);
  absl::Time start = absl::Now();
  auto got = client->Get({"/api/v1", "configmaps", "default", "slow", ""});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(RestKubeClientLocalTest, ConnectionRefusedIsUnavailable) {
  auto client = NewClient("http://127.0.0.1:" + std::to_string(FreePort()));
  auto got = client->Get({"/api/v1", "configmaps", "default", "x", ""});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
}

TEST(RestKubeClientLocalTest, NewRejectsBadConfig) {
  KubeConfig cfg;
  cfg.server = "127.0.0.1:6443";
  EXPECT_EQ(RestKubeClient::New(cfg, {}).status().code(), absl::StatusCode::kInvalidArgument);
  cfg.server = "https://127.0.0.1:6443";
  cfg.ca_pem = "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n";
  auto c = RestKubeClient::New(cfg, {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_CONTAINS(c.status().message(), "certificate authority");
}

}  // namespace
}  // namespace kubetrain
