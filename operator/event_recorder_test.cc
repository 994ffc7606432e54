#include "operator/event_recorder.h"

#include <gtest/gtest.h>

#include <memory>

#include "absl/synchronization/notification.h"

#include "operator/fake_kube_client.h"

namespace kubetrain {
namespace {

TEST(EventRecorderTest, RepeatsBecomeACountPatchedAtMostOncePerInterval) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  EventRecorder r(&kube, &clock, absl::Seconds(30));
  const EventTarget job{"ns", "mnist", "uid-1"};
  for (int i = 0; i < 50; ++i) {
    r.Record(job, "Warning", "FailedCreate", "no image");
    clock.Advance(absl::Seconds(1));
  }
  r.Record(job, "Normal", "TrainingJobCreated", "created");
  r.Flush();
  EXPECT_EQ(kube.Count("/api/v1/namespaces/ns/events"), 2u);
  EXPECT_EQ(kube.calls("create", "events"), 2);
  EXPECT_EQ(kube.calls("patch", "events"), 1);  // at t=30 s; later repeats are carried
  auto list = kube.List({"/api/v1", "events", "ns", "", ""}, "");
  int warning_count = 0;
  for (const auto& e : (*list)["items"]) {
    if (e["reason"] == "FailedCreate") warning_count = e["count"];
  }
  EXPECT_EQ(warning_count, 31);
  clock.Advance(absl::Seconds(30));
  r.Record(job, "Warning", "FailedCreate", "no image");
  r.Flush();
  list = kube.List({"/api/v1", "events", "ns", "", ""}, "");
  for (const auto& e : (*list)["items"]) {
    if (e["reason"] == "FailedCreate") warning_count = e["count"];
  }
  EXPECT_EQ(warning_count, 51);
  // A forgotten job starts afresh.
  r.Forget("ns/mnist");
  r.Record(job, "Normal", "TrainingJobCreated", "created");
  r.Flush();
  EXPECT_EQ(kube.calls("create", "events"), 3);
}

TEST(EventRecorderTest, AnExpiredEventIsWrittenAgain) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  EventRecorder r(&kube, &clock, absl::Seconds(30));
  const EventTarget job{"ns", "mnist", "uid-1"};
  r.Record(job, "Warning", "FailedCreate", "no image");
  r.Flush();
  auto list = kube.List({"/api/v1", "events", "ns", "", ""}, "");
  const std::string name = (*list)["items"][0]["metadata"]["name"];
  ASSERT_TRUE(kube.Delete({"/api/v1", "events", "ns", name, ""}, "").ok());
  clock.Advance(absl::Minutes(1));
  r.Record(job, "Warning", "FailedCreate", "no image");
  r.Flush();
  EXPECT_EQ(kube.Count("/api/v1/namespaces/ns/events"), 1u);
}

// Forwards to a FakeKubeClient; every create takes a second of the fake
// clock (as the Events' rate limit would), the first one only once released.
class SlowEventsClient final : public KubeClient {
 public:
  SlowEventsClient(FakeKubeClient* kube, FakeClock* clock) : kube_(kube), clock_(clock) {}
  absl::Notification first_create_entered, release_first_create;

  absl::StatusOr<nlohmann::json> Get(const ResourceRef& r) override { return kube_->Get(r); }
  absl::StatusOr<nlohmann::json> List(const ResourceRef& r, const std::string& s) override {
    return kube_->List(r, s);
  }
  absl::StatusOr<nlohmann::json> Create(const ResourceRef& r, const nlohmann::json& o) override {
    if (!first_create_entered.HasBeenNotified()) {
      first_create_entered.Notify();
      release_first_create.WaitForNotification();
    }
    clock_->Advance(absl::Seconds(1));
    return kube_->Create(r, o);
  }
  absl::StatusOr<nlohmann::json> Replace(const ResourceRef& r, const nlohmann::json& o) override {
    return kube_->Replace(r, o);
  }
  absl::StatusOr<nlohmann::json> MergePatch(const ResourceRef& r,
                                            const nlohmann::json& p) override {
    return kube_->MergePatch(r, p);
  }
  absl::Status Delete(const ResourceRef& r, const std::string& p) override {
    return kube_->Delete(r, p);
  }
  absl::Status Watch(const ResourceRef& r, const std::string& s, const std::string& rv,
                     const std::function<bool(const WatchEvent&)>& f, int t) override {
    return kube_->Watch(r, s, rv, f, t);
  }

 private:
  FakeKubeClient* const kube_;
  FakeClock* const clock_;
};

TEST(EventRecorderTest, AStoppedRecorderSendsForItsGraceThenDropsTheRest) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  SlowEventsClient slow(&kube, &clock);
  auto r = std::make_unique<EventRecorder>(&slow, &clock, absl::Seconds(30), 10000,
                                           /*shutdown_grace=*/absl::Seconds(5));
  const EventTarget job{"ns", "mnist", "uid-1"};
  for (int i = 0; i < 100; ++i) r->Record(job, "Normal", "Created", "pod " + std::to_string(i));
  slow.first_create_entered.WaitForNotification();
  r->Stop();
  r->Record(job, "Normal", "Created", "after the stop");  // not taken
  slow.release_first_create.Notify();
  r.reset();
  // The one in flight, then one a second until the grace of 5 s is over.
  EXPECT_EQ(kube.calls("create", "events"), 5);
}

}  // namespace
}  // namespace kubetrain
