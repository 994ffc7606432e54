#include "ps/finite.h"

#include <cfloat>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace kubetrain {
namespace {

TEST(AllFiniteTest, FiniteValuesOfEveryKindPass) {
  std::vector<float> v = {0.0f,    -0.0f,    1.0f,    -1.0f,
                          FLT_MAX, -FLT_MAX, FLT_MIN, std::numeric_limits<float>::denorm_min(),
                          3e38f,   -3e38f};
  EXPECT_TRUE(AllFinite(v.data(), static_cast<int64_t>(v.size())));
  EXPECT_TRUE(AllFinite(v.data(), 0));
}

// Every position of buffers longer and shorter than a SIMD packet, so both a
// vectorised body and the scalar tail see each bad value.
TEST(AllFiniteTest, OneNonFiniteValueAnywhereFails) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int n : {1, 3, 7, 16, 17, 33, 1000}) {
    std::vector<float> v(n, FLT_MAX);
    for (int i = 0; i < n; ++i) {
      for (float b : bad) {
        v[i] = b;
        EXPECT_FALSE(AllFinite(v.data(), n)) << "n=" << n << " i=" << i << " value " << b;
        v[i] = FLT_MAX;
      }
    }
    EXPECT_TRUE(AllFinite(v.data(), n));
  }
}

}  // namespace
}  // namespace kubetrain
