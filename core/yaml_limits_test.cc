#include "core/yaml_limits.h"
#include "core/yaml_limits_testing.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

#define EXPECT_CONTAINS(s, part)                        \
  do {                                                  \
    const std::string kt_s(s);                          \
    EXPECT_TRUE(absl::StrContains(kt_s, part)) << kt_s; \
  } while (0)

TEST(YamlLimitsTest, AliasBombIsRefusedAtTheAliasThatCrossesTheLimit) {
  const absl::Status status = CheckAliasExpansion(AliasBomb(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // a4 stands for 21111 nodes; the aliases before a5 repeat 23450, so the
  // fourth *a4 of line 6 ("a5: &a5 [*a4, *a4, *a4, *a4, ...", column 25)
  // crosses 100000.
  EXPECT_EQ(std::string(status.message()),
            "invalid YAML at line 6, column 25: alias *a4 would expand the document past 100000 "
            "nodes (aliases of aliases multiply: an alias bomb)");
}

TEST(YamlLimitsTest, TheLimitCountsEveryNodeAnAliasRepeats) {
  // *t repeats the mapping, its key and its value: 3 nodes each.
  const std::string text = "a: &t {k: v}\nb: *t\nc: *t\n";
  EXPECT_TRUE(CheckAliasExpansion(text, 6).ok());
  const absl::Status status = CheckAliasExpansion(text, 5);
  EXPECT_EQ(std::string(status.message()),
            "invalid YAML at line 3, column 4: alias *t would expand the document past 5 nodes "
            "(aliases of aliases multiply: an alias bomb)");
}

TEST(YamlLimitsTest, AnAliasInsideItsOwnNodeIsRefused) {
  // yaml-cpp builds a tree that contains itself; any walk recurses forever.
  for (const std::string& text :
       {std::string("a: &r [*r]\n"), std::string("a: &r {b: {c: *r}}\n")}) {
    const absl::Status status = CheckAliasExpansion(text);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_CONTAINS(status.message(), "alias *r is inside the node it names");
    EXPECT_CONTAINS(status.message(), "invalid YAML at line 1, column ");
  }
}

TEST(YamlLimitsTest, OrdinaryAnchorsAndAliasesPass) {
  // A pod template shared by three replica types, as real jobs write it.
  const std::string text =
      "spec:\n"
      "  replicaSpecs:\n"
      "    Chief: {template: &t {spec: {containers: [{name: c, image: i, command: [a, b]}]}}}\n"
      "    PS: {template: *t}\n"
      "    Worker: {template: *t}\n"
      "scalar: &s x\n"
      "again: *s\n";
  EXPECT_TRUE(CheckAliasExpansion(text).ok());
  EXPECT_TRUE(CheckAliasExpansion("").ok());
  EXPECT_TRUE(CheckAliasExpansion("plain: {no: aliases}\n").ok());
}

TEST(YamlLimitsTest, AnchorIdsAreCountedPerDocument) {
  // Each document is counted on its own; an anchor of one document is not
  // another's (yaml-cpp numbers anchors from 1 in each).
  const std::string doc = "a: &t [1, 2, 3]\nb: *t\n";
  EXPECT_TRUE(CheckAliasExpansion(absl::StrCat(doc, "---\n", doc), 4).ok());
  EXPECT_FALSE(CheckAliasExpansion(absl::StrCat(doc, "---\n", doc, "c: *t\n"), 4).ok());
}

TEST(YamlLimitsTest, SyntaxErrorsNameTheirPosition) {
  EXPECT_EQ(CheckAliasExpansion("a: *missing\n").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(CheckAliasExpansion("a: *missing\n").message(),
                  "invalid YAML at line 1, column ");
  EXPECT_CONTAINS(CheckAliasExpansion("a: b\n c: d\n").message(),
                  "invalid YAML at line 2, column ");
}

}  // namespace
}  // namespace kubetrain
