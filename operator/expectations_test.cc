#include "operator/expectations.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

TEST(ExpectationsTest, MetWhenEveryCreateAndDeleteIsObserved) {
  FakeClock clock;
  Expectations e(&clock, absl::Seconds(30));
  EXPECT_TRUE(e.Satisfied("ns/job"));
  e.ExpectCreate("ns/job", "pods/a");
  e.ExpectCreate("ns/job", "services/a");
  e.ExpectDelete("ns/job", "pods/old");
  EXPECT_FALSE(e.Satisfied("ns/job"));
  EXPECT_TRUE(e.Satisfied("ns/other"));
  EXPECT_EQ(e.pending(), 3u);
  e.Observed("ns/job", "pods/a", true);
  e.Observed("ns/job", "pods/old", true);  // still there: not yet deleted
  EXPECT_FALSE(e.Satisfied("ns/job"));
  e.Forget("ns/job", "services/a");  // its create failed
  e.Observed("ns/job", "pods/old", false);
  EXPECT_TRUE(e.Satisfied("ns/job"));
  EXPECT_EQ(e.pending(), 0u);
}

TEST(ExpectationsTest, TimeOutRatherThanStallAJob) {
  FakeClock clock;
  Expectations e(&clock, absl::Seconds(30));
  e.ExpectCreate("ns/job", "pods/a");
  clock.Advance(absl::Seconds(29));
  EXPECT_FALSE(e.Satisfied("ns/job"));
  clock.Advance(absl::Seconds(2));
  EXPECT_TRUE(e.Satisfied("ns/job"));
  EXPECT_EQ(e.pending(), 0u);
  e.ExpectCreate("ns/job", "pods/b");
  e.Clear("ns/job");
  EXPECT_TRUE(e.Satisfied("ns/job"));
}

}  // namespace
}  // namespace kubetrain
