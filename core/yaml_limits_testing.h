// Test-only: hostile YAML for the alias-expansion limit (core/yaml_limits.h).
#ifndef KUBETRAIN_CORE_YAML_LIMITS_TESTING_H_
#define KUBETRAIN_CORE_YAML_LIMITS_TESTING_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace kubetrain {

// Ten anchors, each a list of ten aliases of the previous one: 10^9 "lol"s
// from under 1 KB, each line indented by `indent`. The fourth *a4 on the a5
// line (7 lines down from a0, column indent + 25) crosses the 100000 nodes
// aliases may repeat.
inline std::string AliasBomb(int indent) {
  const std::string pad(indent, ' ');
  std::string out = absl::StrCat(pad, "a0: &a0 [\"lol\"]\n");
  for (int i = 1; i < 10; ++i) {
    absl::StrAppend(&out, pad, "a", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j) absl::StrAppend(&out, j > 0 ? ", " : "", "*a", i - 1);
    absl::StrAppend(&out, "]\n");
  }
  return out;
}

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_YAML_LIMITS_TESTING_H_
