#include "operator/event_recorder.h"

#include <gtest/gtest.h>

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
  list = kube.List({"/api/v1", "events", "ns", "", ""}, "");
  for (const auto& e : (*list)["items"]) {
    if (e["reason"] == "FailedCreate") warning_count = e["count"];
  }
  EXPECT_EQ(warning_count, 51);
  // A forgotten job starts afresh.
  r.Forget("ns/mnist");
  r.Record(job, "Normal", "TrainingJobCreated", "created");
  EXPECT_EQ(kube.calls("create", "events"), 3);
}

TEST(EventRecorderTest, AnExpiredEventIsWrittenAgain) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  EventRecorder r(&kube, &clock, absl::Seconds(30));
  const EventTarget job{"ns", "mnist", "uid-1"};
  r.Record(job, "Warning", "FailedCreate", "no image");
  auto list = kube.List({"/api/v1", "events", "ns", "", ""}, "");
  const std::string name = (*list)["items"][0]["metadata"]["name"];
  ASSERT_TRUE(kube.Delete({"/api/v1", "events", "ns", name, ""}, "").ok());
  clock.Advance(absl::Minutes(1));
  r.Record(job, "Warning", "FailedCreate", "no image");
  EXPECT_EQ(kube.Count("/api/v1/namespaces/ns/events"), 1u);
}

}  // namespace
}  // namespace kubetrain
