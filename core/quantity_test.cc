#include "core/quantity.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

int64_t Milli(const char* text) {
  auto q = ParseQuantityMilli(text);
  EXPECT_TRUE(q.ok()) << text << ": " << q.status();
  return q.value_or(-1);
}

TEST(QuantityTest, ParsesTheForms) {
  EXPECT_EQ(Milli("2"), 2000);
  EXPECT_EQ(Milli("500m"), 500);
  EXPECT_EQ(Milli("1.5"), 1500);
  EXPECT_EQ(Milli("0.25"), 250);
  EXPECT_EQ(Milli("+3"), 3000);
  EXPECT_EQ(Milli("1Ki"), 1024 * 1000);
  EXPECT_EQ(Milli("1Gi"), (int64_t{1} << 30) * 1000);
  EXPECT_EQ(Milli("1.5Gi"), (int64_t{3} << 29) * 1000);
  EXPECT_EQ(Milli("128974848"), int64_t{128974848} * 1000);
  EXPECT_EQ(Milli("129e6"), int64_t{129000000} * 1000);
  EXPECT_EQ(Milli("1E3"), 1000000);
  EXPECT_EQ(Milli("2k"), 2000000);
  EXPECT_EQ(Milli("100M"), int64_t{100000000} * 1000);
  EXPECT_EQ(Milli("1e-3"), 1);
  EXPECT_EQ(Milli("1u"), 1);  // rounded up to a milli-unit
  EXPECT_EQ(Milli("0"), 0);
}

TEST(QuantityTest, RefusesWhatIsNotAQuantity) {
  for (const char* bad : {"", "abc", "1x", "1 Gi", "Gi", ".", "1.2.3", "1gi", "1e", "1..", "e3"}) {
    auto q = ParseQuantityMilli(bad);
    ASSERT_FALSE(q.ok()) << bad;
    EXPECT_NE(q.status().message().find("is not a quantity"), std::string::npos) << q.status();
  }
  EXPECT_NE(ParseQuantityMilli("-1").status().message().find("negative"), std::string::npos);
  EXPECT_NE(ParseQuantityMilli("99E").status().message().find("too large"), std::string::npos);
}

TEST(QuantityTest, FormatsWhatTheApiServerAccepts) {
  EXPECT_EQ(FormatQuantityMilli(4000), "4");
  EXPECT_EQ(FormatQuantityMilli(1500), "1500m");
  EXPECT_EQ(FormatQuantityMilli(0), "0");
  EXPECT_EQ(FormatQuantityMilli(Milli("1Gi") * 3), "3221225472");
}

}  // namespace
}  // namespace kubetrain
