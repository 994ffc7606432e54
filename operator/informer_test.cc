#include "operator/informer.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"
#include "operator/fake_kube_client.h"

namespace kubetrain {
namespace {

using nlohmann::json;

json Pod(const std::string& name, const std::string& job) {
  json p = {{"metadata", {{"name", name}, {"namespace", "ns"}}}, {"spec", {{"big", "x"}}}};
  if (!job.empty()) p["metadata"]["labels"] = {{"job", job}};
  return p;
}

bool WaitFor(const std::function<bool()>& pred) {
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return pred();
}

class InformerTest : public ::testing::Test {
 protected:
  void Start() {
    InformerOptions o;
    o.collection = pods_;
    o.label_selector = "job";
    o.transform = [](json* p) { p->erase("spec"); };
    o.job_of = [](const json& p) {
      return "ns/" + p["metadata"]["labels"].value("job", std::string());
    };
    o.watch_timeout_seconds = 1;
    informer_ = std::make_unique<Informer>(&kube_, o, [&](WatchEventType t, const json& obj) {
      absl::MutexLock l(&mu_);
      seen_.push_back(std::string(WatchEventTypeName(t)) + " " +
                      obj["metadata"]["name"].get<std::string>());
    });
    thread_ = std::thread([&] { informer_->Run(&stop_); });
    ASSERT_TRUE(WaitFor([&] { return informer_->synced(); }));
  }
  void TearDown() override {
    stop_ = true;
    kube_.Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> Seen() {
    absl::MutexLock l(&mu_);
    return seen_;
  }

  const ResourceRef pods_{"/api/v1", "pods", "", "", ""};
  const ResourceRef ns_pods_{"/api/v1", "pods", "ns", "", ""};
  FakeKubeClient kube_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<Informer> informer_;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

TEST_F(InformerTest, ListsThenWatchesOnlySelectedObjectsIndexedByJob) {
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("a", "j1")).ok());
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("stranger", "")).ok());
  Start();
  EXPECT_EQ(informer_->size(), 1u);
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("b", "j1")).ok());
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("c", "j2")).ok());
  ASSERT_TRUE(WaitFor([&] { return informer_->size() == 3; }));
  EXPECT_EQ(informer_->ByJob("ns/j1").size(), 2u);
  EXPECT_EQ(informer_->ByJob("ns/j2").size(), 1u);
  EXPECT_FALSE(informer_->Get("ns", "a")->contains("spec"));  // transformed
  ASSERT_TRUE(kube_.Delete({"/api/v1", "pods", "ns", "c", ""}, "").ok());
  ASSERT_TRUE(WaitFor([&] { return informer_->ByJob("ns/j2").empty(); }));
  EXPECT_EQ(informer_->JobKeys(), std::vector<std::string>{"ns/j1"});
  EXPECT_EQ(Seen(), (std::vector<std::string>{"ADDED a", "ADDED b", "ADDED c", "DELETED c"}));
  // One list; every later change came from the watch, across watch timeouts.
  absl::SleepFor(absl::Milliseconds(1200));
  EXPECT_EQ(kube_.calls("list"), 1);
  EXPECT_GE(kube_.calls("watch"), 2);
}

TEST_F(InformerTest, StoredObjectsReadBackExactlyAsTheyCame) {
  json p = Pod("a", "j1");
  p["status"] = json::parse(R"({"phase": "Running", "podIP": "10.0.0.1", "restartCount": 3,
      "exitCode": -1, "ratio": 0.25, "ready": true, "message": "x\u00e9\n\"y\"",
      "containerStatuses": [{"name": "kubetrain", "state": {"terminated": null}}]})");
  ASSERT_TRUE(kube_.Create(ns_pods_, p).ok());
  Start();
  auto stored = kube_.Get({"/api/v1", "pods", "ns", "a", ""});
  ASSERT_TRUE(stored.ok());
  stored->erase("spec");  // the transform
  EXPECT_EQ(*informer_->Get("ns", "a"), *stored);
  EXPECT_EQ(informer_->ByJob("ns/j1"), std::vector<json>{*stored});
  EXPECT_EQ((*informer_->Get("ns", "a"))["status"]["exitCode"].get<int>(), -1);
}

TEST_F(InformerTest, RelistsOn410AndReportsWhatVanishedMeanwhile) {
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("a", "j1")).ok());
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("b", "j1")).ok());
  Start();
  // The watch is held back while b goes and d comes; then history expires.
  kube_.FailCalls("watch", "pods", absl::UnavailableError("held"));
  absl::SleepFor(absl::Milliseconds(1100));  // the current watch ends
  kube_.FailCalls("watch", "pods", absl::OutOfRangeError("too old resource version"));
  ASSERT_TRUE(kube_.Delete({"/api/v1", "pods", "ns", "b", ""}, "").ok());
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("d", "j1")).ok());
  kube_.FailCalls("watch", "pods", absl::OkStatus());
  ASSERT_TRUE(WaitFor([&] { return !informer_->Get("ns", "b") && informer_->Get("ns", "d"); }));
  EXPECT_GE(informer_->relists(), 1);
  auto seen = Seen();
  EXPECT_NE(std::find(seen.begin(), seen.end(), "DELETED b"), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), "ADDED d"), seen.end());
}

TEST_F(InformerTest, CompactedHistoryRelists) {
  Start();
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("a", "j1")).ok());
  ASSERT_TRUE(WaitFor([&] { return informer_->size() == 1; }));
  kube_.FailCalls("watch", "pods", absl::UnavailableError("held"));
  absl::SleepFor(absl::Milliseconds(1100));
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("b", "j1")).ok());
  kube_.Compact();  // the informer's resourceVersion is now too old: a real 410
  kube_.FailCalls("watch", "pods", absl::OkStatus());
  ASSERT_TRUE(WaitFor([&] { return informer_->size() == 2; }));
}

TEST_F(InformerTest, OwnWritesAreStoredButNeverRegress) {
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("a", "j1")).ok());
  Start();
  json newer = *informer_->Get("ns", "a");
  newer["metadata"]["resourceVersion"] = "999999";
  newer["status"] = {{"phase", "Running"}};
  informer_->Update(newer);
  EXPECT_EQ((*informer_->Get("ns", "a"))["status"]["phase"], "Running");
  json older = newer;
  older["metadata"]["resourceVersion"] = "5";
  older["status"] = {{"phase", "Pending"}};
  informer_->Update(older);
  EXPECT_EQ((*informer_->Get("ns", "a"))["status"]["phase"], "Running");
}

// A create's answer stored at once (no watch round trip), unless the watch
// has already delivered it or something later: an object created and
// deleted before its answer is stored must not come back.
TEST_F(InformerTest, OwnCreatesAreStoredUnlessTheWatchIsAlreadyPastThem) {
  Start();
  kube_.HoldWatches("pods", true);
  auto created = kube_.Create(ns_pods_, Pod("b", "j1"));
  ASSERT_TRUE(created.ok());
  EXPECT_TRUE(informer_->Update(*created));
  EXPECT_TRUE(informer_->Get("ns", "b").has_value());
  EXPECT_EQ(informer_->ByJob("ns/j1").size(), 1u);
  kube_.HoldWatches("pods", false);
  // The watch's ADDED for it changes nothing; its deletion removes it.
  ASSERT_TRUE(kube_.Delete({"/api/v1", "pods", "ns", "b", ""}, "").ok());
  ASSERT_TRUE(WaitFor([&] { return !informer_->Get("ns", "b").has_value(); }));
  // Created and deleted before the answer is stored: the answer is stale.
  auto c = kube_.Create(ns_pods_, Pod("c", "j1"));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(kube_.Delete({"/api/v1", "pods", "ns", "c", ""}, "").ok());
  ASSERT_TRUE(kube_.Create(ns_pods_, Pod("d", "j1")).ok());
  ASSERT_TRUE(WaitFor([&] { return informer_->Get("ns", "d").has_value(); }));
  EXPECT_FALSE(informer_->Update(*c));
  EXPECT_FALSE(informer_->Get("ns", "c").has_value());
}

}  // namespace
}  // namespace kubetrain
