// Integration test of RestKubeClient against a REAL kube-apiserver.
//
// Needs a running control plane (tests/cluster/up.sh) and its kubeconfig in
// KUBETRAIN_TEST_KUBECONFIG; tests/operator/run_client_test.sh does it all.
// Optional: KUBETRAIN_TEST_CLIENT_CERT / KUBETRAIN_TEST_CLIENT_KEY (PEM files
// of a system:masters client certificate) to test mutual-TLS auth, and
// KUBETRAIN_TEST_ETCD_URL to compact etcd if a 410 needs forcing.
//
// Objects are ConfigMaps (and one Pod) in namespace "default", named with a
// per-run suffix and labelled run=<suffix>; namespaces are not used because
// without kube-controller-manager a deleted namespace stays Terminating.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "operator/kubeconfig.h"
#include "operator/rest_kube_client.h"

#define EXPECT_CONTAINS(haystack, needle)          \
  EXPECT_TRUE(absl::StrContains(haystack, needle)) \
      << "expected to contain \"" << (needle) << "\":\n  " << (haystack)

namespace kubetrain {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RunId() {
  static const std::string id = [] {
    std::random_device rd;
    return absl::StrCat(absl::Hex(rd() % 0xffffff));
  }();
  return id;
}

class RealApiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = Env("KUBETRAIN_TEST_KUBECONFIG");
    if (path.empty()) {
      setup_error_ =
          "KUBETRAIN_TEST_KUBECONFIG is not set: this test needs a real kube-apiserver. "
          "Run tests/operator/run_client_test.sh (it starts one with tests/cluster/up.sh), or "
          "`bazel test //operator:rest_kube_client_test "
          "--test_env=KUBETRAIN_TEST_KUBECONFIG=/path/to/kubeconfig`.";
      return;
    }
    auto cfg = LoadKubeConfigFile(path);
    if (!cfg.ok()) {
      setup_error_ = cfg.status().ToString();
      return;
    }
    config_ = new KubeConfig(*cfg);
  }

  void SetUp() override {
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    auto c = RestKubeClient::New(*config_, RestKubeClient::Options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  ResourceRef ConfigMap(const std::string& name) const {
    return {"/api/v1", "configmaps", "default",
            name.empty() ? "" : absl::StrCat(name, "-", RunId()), ""};
  }
  static ResourceRef ConfigMaps() { return {"/api/v1", "configmaps", "default", "", ""}; }

  nlohmann::json NewConfigMap(const ResourceRef& ref, const nlohmann::json& labels,
                              const std::string& value) {
    nlohmann::json l = labels;
    l["run"] = RunId();
    return {{"apiVersion", "v1"},
            {"kind", "ConfigMap"},
            {"metadata", {{"name", ref.name}, {"labels", l}}},
            {"data", {{"k", value}}}};
  }

  static std::string Names(const nlohmann::json& list) {
    std::vector<std::string> names;
    for (const auto& it : list["items"]) names.push_back(it["metadata"]["name"].get<std::string>());
    std::sort(names.begin(), names.end());
    std::string out;
    for (const auto& n : names) absl::StrAppend(&out, out.empty() ? "" : ",", n);
    return out;
  }

  static inline std::string setup_error_;
  static inline KubeConfig* config_ = nullptr;
  std::unique_ptr<RestKubeClient> client_;
};

TEST_F(RealApiServerTest, CreateGetListWithLabelSelector) {
  ResourceRef a = ConfigMap("sel-a"), b = ConfigMap("sel-b");
  ASSERT_TRUE(client_->Create(a, NewConfigMap(a, {{"role", "ps"}, {"suite", "sel"}}, "1")).ok());
  auto created = client_->Create(b, NewConfigMap(b, {{"role", "worker"}, {"suite", "sel"}}, "2"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["metadata"]["name"], b.name);
  EXPECT_FALSE((*created)["metadata"].value("uid", "").empty());

  auto got = client_->Get(a);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["data"]["k"], "1");
  EXPECT_EQ((*got)["metadata"]["labels"]["role"], "ps");

  const std::string run = "run=" + RunId() + ",suite=sel";
  auto all = client_->List(ConfigMaps(), run);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(Names(*all), a.name + "," + b.name);
  EXPECT_FALSE((*all)["metadata"].value("resourceVersion", "").empty());
  EXPECT_EQ((*all)["kind"], "ConfigMapList");

  auto ps = client_->List(ConfigMaps(), run + ",role in (ps,chief)");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(Names(*ps), a.name);
  auto none = client_->List(ConfigMaps(), run + ",role=evaluator");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE((*none)["items"].is_array());
  EXPECT_EQ((*none)["items"].size(), 0u);

  // Paging with a real continue token.
  RestKubeClient::Options o;
  o.list_page_size = 1;
  auto pager = RestKubeClient::New(*config_, o);
  ASSERT_TRUE(pager.ok());
  auto paged = (*pager)->List(ConfigMaps(), run);
  ASSERT_TRUE(paged.ok()) << paged.status();
  EXPECT_EQ(Names(*paged), a.name + "," + b.name);
  EXPECT_FALSE((*paged)["metadata"].contains("continue"));

  EXPECT_TRUE(client_->Delete(a, kPropagationBackground).ok());
  EXPECT_TRUE(client_->Delete(b, kPropagationBackground).ok());
}

TEST_F(RealApiServerTest, MergePatchReplaceConflictAlreadyExistsDelete) {
  ResourceRef r = ConfigMap("rw");
  auto v1 = client_->Create(r, NewConfigMap(r, {{"suite", "rw"}}, "v1"));
  ASSERT_TRUE(v1.ok()) << v1.status();

  // Create twice -> AlreadyExists.
  auto again = client_->Create(r, NewConfigMap(r, {{"suite", "rw"}}, "v1"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_CONTAINS(again.status().message(), "already exists");

  // Merge patch: set a key, add a label, delete a key with null.
  auto v2 = client_->MergePatch(
      r, {{"data", {{"k", "v2"}, {"extra", "x"}}}, {"metadata", {{"labels", {{"new", "yes"}}}}}});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ((*v2)["data"]["k"], "v2");
  EXPECT_EQ((*v2)["metadata"]["labels"]["new"], "yes");
  EXPECT_EQ((*v2)["metadata"]["labels"]["suite"], "rw");
  auto v3 = client_->MergePatch(r, {{"data", {{"extra", nullptr}}}});
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_FALSE((*v3)["data"].contains("extra"));
  EXPECT_NE((*v3)["metadata"]["resourceVersion"], (*v1)["metadata"]["resourceVersion"]);

  // Replace with the stale v1 resourceVersion -> Aborted (409 Conflict).
  nlohmann::json stale = *v1;
  stale["data"]["k"] = "lost update";
  auto conflict = client_->Replace(r, stale);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAborted) << conflict.status();
  EXPECT_CONTAINS(conflict.status().message(), "the object has been modified");

  // Replace with the current resourceVersion works.
  nlohmann::json fresh = *v3;
  fresh["data"]["k"] = "v4";
  auto v4 = client_->Replace(r, fresh);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ((*v4)["data"]["k"], "v4");

  // Validation errors carry the server's message.
  ResourceRef bad = ConfigMaps();
  auto invalid = client_->Create(
      bad, {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "Bad_Name"}}}});
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument) << invalid.status();
  EXPECT_CONTAINS(invalid.status().message(), "Bad_Name");

  // Delete -> NotFound afterwards.
  ASSERT_TRUE(client_->Delete(r, kPropagationBackground).ok());
  auto gone = client_->Get(r);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_CONTAINS(gone.status().message(), "not found");
  EXPECT_EQ(client_->Delete(r, kPropagationBackground).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->MergePatch(r, {{"data", {{"k", "x"}}}}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RealApiServerTest, PodStatusSubresourceMergePatch) {
  ResourceRef pod{"/api/v1", "pods", "default", "status-" + RunId(), ""};
  nlohmann::json spec = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", pod.name}, {"labels", {{"run", RunId()}}}}},
      {"spec", {{"containers", {{{"name", "c"}, {"image", "kubetrain:test"}}}}}}};
  auto created = client_->Create(pod, spec);
  ASSERT_TRUE(created.ok()) << created.status();
  ResourceRef status = pod;
  status.subresource = "status";
  auto patched =
      client_->MergePatch(status, {{"status", {{"phase", "Running"}, {"podIP", "10.1.2.3"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  auto got = client_->Get(pod);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["status"]["phase"], "Running");
  EXPECT_EQ((*got)["status"]["podIP"], "10.1.2.3");
  EXPECT_TRUE(client_->Delete(pod, kPropagationBackground).ok());
}

TEST_F(RealApiServerTest, WatchFromListSeesAddedModifiedDeleted) {
  const std::string selector = "run=" + RunId() + ",suite=watch";
  auto list = client_->List(ConfigMaps(), selector);
  ASSERT_TRUE(list.ok()) << list.status();
  const std::string rv = (*list)["metadata"]["resourceVersion"];

  ResourceRef w = ConfigMap("watched");
  ResourceRef other = ConfigMap("unwatched");  // filtered out by the selector
  std::atomic<bool> writer_ok{true};
  std::thread writer([&] {
    // A client of its own: concurrent use from another thread.
    auto c = RestKubeClient::New(*config_, RestKubeClient::Options());
    if (!c.ok()) return writer_ok.store(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    writer_ok =
        writer_ok && (*c)->Create(other, NewConfigMap(other, {{"suite", "other"}}, "0")).ok();
    writer_ok = writer_ok && (*c)->Create(w, NewConfigMap(w, {{"suite", "watch"}}, "1")).ok();
    writer_ok = writer_ok && (*c)->MergePatch(w, {{"data", {{"k", "2"}}}}).ok();
    writer_ok =
        writer_ok && client_->Delete(w, kPropagationBackground).ok();  // the shared client, too
    writer_ok = writer_ok && (*c)->Delete(other, kPropagationBackground).ok();
  });

  std::vector<std::string> seen;
  absl::Status s = client_->Watch(
      ConfigMaps(), selector, rv,
      [&](const WatchEvent& e) {
        if (e.type == WatchEventType::kBookmark) return true;
        seen.push_back(absl::StrCat(WatchEventTypeName(e.type), ":",
                                    e.object["metadata"]["name"].get<std::string>(), ":",
                                    e.object["data"].value("k", "")));
        return e.type != WatchEventType::kDeleted;
      },
      20);
  writer.join();
  EXPECT_TRUE(writer_ok);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED:" + w.name + ":1", "MODIFIED:" + w.name + ":2",
                                            "DELETED:" + w.name + ":2"}));
}

TEST_F(RealApiServerTest, WatchEndsCleanlyAtTimeoutSeconds) {
  auto list = client_->List(ConfigMaps(), "run=" + RunId() + ",suite=quiet");
  ASSERT_TRUE(list.ok()) << list.status();
  absl::Time start = absl::Now();
  int events = 0;
  absl::Status s = client_->Watch(
      ConfigMaps(), "run=" + RunId() + ",suite=quiet", (*list)["metadata"]["resourceVersion"],
      [&](const WatchEvent& e) { return e.type == WatchEventType::kBookmark || ++events; }, 2);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(events, 0);
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// Compacts etcd at its current revision through its v3 JSON gateway
// (KUBETRAIN_TEST_ETCD_URL; 127.0.0.1 only).
void CompactEtcd() {
  const std::string url = Env("KUBETRAIN_TEST_ETCD_URL");
  ASSERT_TRUE(absl::StartsWith(url, "http://127.0.0.1:")) << "unexpected etcd URL " << url;
  try {
    web::http::client::http_client etcd(url);
    auto range = etcd.request(web::http::methods::POST, "/v3/kv/range",
                              std::string(R"({"key":"AA=="})"), "application/json")
                     .get()
                     .extract_utf8string(true)
                     .get();
    auto j = nlohmann::json::parse(range, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << range;
    const std::string rev = j["header"].value("revision", "");
    ASSERT_FALSE(rev.empty()) << range;
    auto resp = etcd.request(web::http::methods::POST, "/v3/kv/compaction",
                             nlohmann::json{{"revision", rev}, {"physical", true}}.dump(),
                             "application/json")
                    .get();
    ASSERT_EQ(resp.status_code(), 200) << resp.extract_utf8string(true).get();
  } catch (const std::exception& e) {
    FAIL() << "etcd compaction via " << url << " failed: " << e.what();
  }
}

// Forcing a 410 on a real server: a fresh watch cache holds the whole history
// (resourceVersion "1" is still served from it), so the script starts
// kube-apiserver with --watch-cache-sizes=podtemplates#0 (PodTemplate watches
// go straight to etcd) and this test compacts etcd. The server then answers
// 200 with an ERROR event {code: 410, reason: Expired}.
TEST_F(RealApiServerTest, WatchWithAncientResourceVersionIsExpired) {
  if (Env("KUBETRAIN_TEST_ETCD_URL").empty()) {
    GTEST_SKIP()
        << "KUBETRAIN_TEST_ETCD_URL not set (needed to compact etcd); run_client_test.sh sets it";
  }
  ResourceRef templates{"/api/v1", "podtemplates", "default", "", ""};
  ResourceRef t = templates;
  t.name = "old-" + RunId();
  nlohmann::json obj = {
      {"apiVersion", "v1"},
      {"kind", "PodTemplate"},
      {"metadata", {{"name", t.name}, {"labels", {{"run", RunId()}}}}},
      {"template", {{"spec", {{"containers", {{{"name", "c"}, {"image", "kubetrain:test"}}}}}}}}};
  ASSERT_TRUE(client_->Create(t, obj).ok());
  ASSERT_TRUE(client_->MergePatch(t, {{"metadata", {{"labels", {{"x", "y"}}}}}}).ok());
  ASSERT_TRUE(client_->Delete(t, kPropagationBackground).ok());
  CompactEtcd();
  if (HasFatalFailure()) return;

  int delivered = 0;
  absl::Status s = client_->Watch(
      templates, "", "1", [&](const WatchEvent&) { return ++delivered, true; }, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_CONTAINS(s.message(), "too old");
  EXPECT_EQ(delivered, 0);

  // The documented recovery: relist and watch from the list's resourceVersion.
  auto list = client_->List(templates, "run=" + RunId());
  ASSERT_TRUE(list.ok()) << list.status();
  s = client_->Watch(
      templates, "run=" + RunId(), (*list)["metadata"]["resourceVersion"],
      [](const WatchEvent&) { return true; }, 1);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(RealApiServerTest, BadTokenIsUnauthenticated) {
  KubeConfig bad = *config_;
  bad.bearer_token = "not-the-token";
  bad.client_cert_pem.clear();
  bad.client_key_pem.clear();
  auto c = RestKubeClient::New(bad, RestKubeClient::Options());
  ASSERT_TRUE(c.ok());
  auto got = (*c)->List(ConfigMaps(), "");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnauthenticated) << got.status();
  absl::Status w = (*c)->Watch(
      ConfigMaps(), "", "", [](const WatchEvent&) { return true; }, 2);
  EXPECT_EQ(w.code(), absl::StatusCode::kUnauthenticated) << w;
}

TEST_F(RealApiServerTest, WrongCaFailsTlsVerification) {
  KubeConfig bad = *config_;
  bad.ca_pem.clear();  // system roots do not know the test CA
  auto c = RestKubeClient::New(bad, RestKubeClient::Options());
  ASSERT_TRUE(c.ok());
  auto got = (*c)->List(ConfigMaps(), "");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
}

TEST_F(RealApiServerTest, ClientCertificateAuth) {
  const std::string cert = Env("KUBETRAIN_TEST_CLIENT_CERT"),
                    key = Env("KUBETRAIN_TEST_CLIENT_KEY");
  if (cert.empty() || key.empty()) GTEST_SKIP() << "KUBETRAIN_TEST_CLIENT_CERT/KEY not set";
  KubeConfig mtls = *config_;
  mtls.bearer_token.clear();
  mtls.client_cert_pem = ReadFile(cert);
  mtls.client_key_pem = ReadFile(key);
  auto c = RestKubeClient::New(mtls, RestKubeClient::Options());
  ASSERT_TRUE(c.ok()) << c.status();
  auto got = (*c)->List(ConfigMaps(), "run=" + RunId());
  EXPECT_TRUE(got.ok()) << got.status();
}

TEST_F(RealApiServerTest, ConcurrentCallsOnOneClient) {
  ResourceRef r = ConfigMap("conc");
  ASSERT_TRUE(client_->Create(r, NewConfigMap(r, {{"suite", "conc"}}, "0")).ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        if (!client_->Get(r).ok()) ++failures;
        if (!client_->MergePatch(r, {{"data", {{"t" + std::to_string(t), std::to_string(i)}}}})
                 .ok())
          ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
  auto got = client_->Get(r);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["data"].size(), 9u);  // k + t0..t7
  EXPECT_TRUE(client_->Delete(r, kPropagationBackground).ok());
}

}  // namespace
}  // namespace kubetrain
