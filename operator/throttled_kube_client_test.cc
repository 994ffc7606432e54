#include "operator/throttled_kube_client.h"

#include <gtest/gtest.h>

#include <prometheus/text_serializer.h>

#include "operator/fake_kube_client.h"

namespace kubetrain {
namespace {

TEST(TokenBucketTest, BurstThenQps) {
  FakeClock clock;
  TokenBucket b(&clock, 10, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.Reserve(), absl::ZeroDuration());
  EXPECT_EQ(b.Reserve(), absl::Milliseconds(100));
  EXPECT_EQ(b.Reserve(), absl::Milliseconds(200));  // queued behind the previous one
  clock.Advance(absl::Seconds(10));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.Reserve(), absl::ZeroDuration());  // at most burst saved
  EXPECT_GT(b.Reserve(), absl::ZeroDuration());
  TokenBucket unlimited(&clock, 0, 1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(unlimited.Reserve(), absl::ZeroDuration());
}

TEST(ThrottledKubeClientTest, EveryRequestTakesATokenAndIsCounted) {
  FakeKubeClient kube;
  FakeClock clock;
  TokenBucket bucket(&clock, 5, 2);
  prometheus::Registry registry;
  ThrottledKubeClient c(&kube, &bucket, registry);
  const ResourceRef cms{"/api/v1", "configmaps", "ns", "", ""};
  const absl::Time t0 = clock.Now();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(c.Create(cms, {{"metadata", {{"name", "c" + std::to_string(i)}}}}).ok());
  }
  EXPECT_TRUE(absl::IsNotFound(c.Get({"/api/v1", "configmaps", "ns", "nope", ""}).status()));
  ASSERT_TRUE(c.List(cms, "").ok());
  ASSERT_TRUE(c.Watch(
                   cms, "", "", [](const WatchEvent&) { return false; }, 1)
                  .ok());
  // 9 requests, 2 of them from the burst: 7 more at 5/s = 1.4 s of (fake) waiting.
  EXPECT_EQ(clock.Now() - t0, absl::Milliseconds(1400));
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find("kubetrain_operator_api_requests_total{code=\"OK\",resource=\"configmaps\","
                      "verb=\"create\"} 6"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("code=\"NOT_FOUND\",resource=\"configmaps\",verb=\"get\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("verb=\"watch\"} 1"), std::string::npos);
  EXPECT_NE(text.find("kubetrain_operator_api_throttled_requests_total 7"), std::string::npos);
  EXPECT_NE(text.find("kubetrain_operator_api_throttle_seconds_total 1.4"), std::string::npos);
}

}  // namespace
}  // namespace kubetrain
