#include "operator/work_queue.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

TEST(WorkQueueTest, DedupesAndNeverHandsOneKeyToTwoWorkers) {
  FakeClock clock;
  WorkQueue q(&clock);
  q.Add("ns/a");
  q.Add("ns/a");
  q.Add("ns/b");
  EXPECT_EQ(q.Depth(), 2u);
  auto k1 = q.Get();
  ASSERT_TRUE(k1.has_value());
  q.Add(*k1);  // re-added while processing: deferred until Done
  auto k2 = q.Get();
  ASSERT_TRUE(k2.has_value());
  EXPECT_NE(*k1, *k2);
  q.Done(*k2);
  q.Done(*k1);
  auto k3 = q.Get();
  ASSERT_TRUE(k3.has_value());
  EXPECT_EQ(*k3, *k1);
}

TEST(WorkQueueTest, AddAfterAndBackoffWaitForTheClock) {
  FakeClock clock;
  WorkQueue q(&clock);
  q.AddAfter("ns/a", absl::Seconds(10));
  q.AddRateLimited("ns/b");  // 100 ms
  clock.Advance(absl::Milliseconds(150));
  EXPECT_EQ(*q.Get(), "ns/b");
  q.Done("ns/b");
  q.AddRateLimited("ns/b");  // 200 ms now
  clock.Advance(absl::Milliseconds(150));
  clock.Advance(absl::Milliseconds(100));
  EXPECT_EQ(*q.Get(), "ns/b");
  q.Done("ns/b");
  q.Forget("ns/b");
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(*q.Get(), "ns/a");
  q.Done("ns/a");
  q.Shutdown();
  EXPECT_FALSE(q.Get().has_value());
}

}  // namespace
}  // namespace kubetrain
