#include "tests/bench/aes_gcm_speed.h"

#include "gtest/gtest.h"

namespace kubetrain {
namespace bench {
namespace {

TEST(AesGcmSpeedTest, SealsAndOpensEveryRecord) {
  auto speed = MeasureAesGcm(int64_t{1} << 20);
  ASSERT_TRUE(speed.ok()) << speed.status();
  EXPECT_GT(speed->seal_gbps, 0);
  EXPECT_GT(speed->open_gbps, 0);
  EXPECT_FALSE(MeasureAesGcm(100, 16384).ok());  // not one whole record
}

TEST(AesGcmSpeedTest, TheBoundAddsTheCryptoToTheBusyCores) {
  const AesGcmSpeed speed{4.0, 4.0};
  // Plain at 2 GB/s with both cores busy: crypto costs 2 * (1/4 + 1/4) = 1
  // core per second, so 2 cores do 3 cores' work: 2/3.
  EXPECT_DOUBLE_EQ(TlsCryptoBoundRatio(2.0, 2.0, speed, 2), 2.0 / 3.0);
  // With one core idle the crypto fits in it: no loss.
  EXPECT_DOUBLE_EQ(TlsCryptoBoundRatio(2.0, 1.0, speed, 2), 1.0);
  // On one core everything is serial.
  EXPECT_DOUBLE_EQ(TlsCryptoBoundRatio(2.0, 1.0, speed, 1), 0.5);
  EXPECT_EQ(TlsCryptoBoundRatio(0, 1.0, speed, 2), 0);
}

}  // namespace
}  // namespace bench
}  // namespace kubetrain
