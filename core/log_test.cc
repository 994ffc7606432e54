#include "core/log.h"

#include <sys/stat.h>

#include <string>

#include "absl/time/time.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1800000000);

TEST(LogLimiterTest, FirstIsLoggedThenOnePerIntervalCountingTheRest) {
  LogLimiter limiter(absl::Seconds(10));
  int64_t suppressed = -1;
  ASSERT_TRUE(limiter.Allow(kT0, &suppressed));
  EXPECT_EQ(suppressed, 0);
  // Three more within the interval: not logged, counted.
  suppressed = -1;
  EXPECT_FALSE(limiter.Allow(kT0 + absl::Seconds(1), &suppressed));
  EXPECT_FALSE(limiter.Allow(kT0 + absl::Seconds(5), &suppressed));
  EXPECT_FALSE(limiter.Allow(kT0 + absl::Seconds(9), &suppressed));
  EXPECT_EQ(suppressed, -1);  // untouched while not logging
  // The interval counts from the last logged one: at +10 s it logs and says 3.
  ASSERT_TRUE(limiter.Allow(kT0 + absl::Seconds(10), &suppressed));
  EXPECT_EQ(suppressed, 3);
  // The count starts again.
  EXPECT_FALSE(limiter.Allow(kT0 + absl::Seconds(11), &suppressed));
  ASSERT_TRUE(limiter.Allow(kT0 + absl::Seconds(25), &suppressed));
  EXPECT_EQ(suppressed, 1);
  // After a quiet spell the next one logs at once, with nothing suppressed.
  ASSERT_TRUE(limiter.Allow(kT0 + absl::Hours(1), &suppressed));
  EXPECT_EQ(suppressed, 0);
}

TEST(LogLimiterTest, AZeroIntervalLogsEveryOccurrence) {
  LogLimiter limiter(absl::ZeroDuration());
  int64_t suppressed = -1;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(limiter.Allow(kT0, &suppressed)) << i;
    EXPECT_EQ(suppressed, 0);
  }
}

TEST(ExitWithErrorTest, WritesTheReasonAsOneLineAndReturnsTheCode) {
  const std::string dir = NewTestDir("log");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/termination-log";
  WriteFile(path, "an older, longer message that must not survive\n");
  EXPECT_EQ(ExitWithError(2, "spec.training.dataset.path: /data/x.csv: no such file", path), 2);
  EXPECT_EQ(ReadFile(path), "spec.training.dataset.path: /data/x.csv: no such file\n");
  EXPECT_EQ(ExitWithError(1, "worker-0: lost\nthe PS\r\n", path), 1);
  EXPECT_EQ(ReadFile(path), "worker-0: lost the PS  \n");
  // Cut to what the kubelet keeps.
  ExitWithError(2, std::string(10000, 'x'), path);
  EXPECT_EQ(ReadFile(path), std::string(kMaxTerminationReason, 'x') + "\n");
  // No file given (a local run): nothing is written anywhere.
  EXPECT_EQ(ExitWithError(2, "nowhere", ""), 2);
  EXPECT_EQ(ListDir(dir).size(), 1u);
}

}  // namespace
}  // namespace kubetrain
