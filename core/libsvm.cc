#include "core/libsvm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// The next whitespace-separated token of *rest ("" at the end).
absl::string_view NextToken(absl::string_view* rest) {
  size_t i = 0;
  while (i < rest->size() && IsSpace((*rest)[i])) ++i;
  size_t j = i;
  while (j < rest->size() && !IsSpace((*rest)[j])) ++j;
  absl::string_view token = rest->substr(i, j - i);
  rest->remove_prefix(j);
  return token;
}

absl::Status BadToken(absl::string_view token, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("token ", QuoteDataValue(token), ": ", what));
}

absl::Status ParseLabel(const TabularSpec& spec, absl::string_view token, Record* out) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("label ", QuoteDataValue(token), ": ", what));
  };
  switch (spec.libsvm_labels) {
    case LibsvmLabels::kBinary: {
      double v;
      if (!absl::SimpleAtod(token, &v) || (v != 0 && v != 1 && v != -1)) {
        return bad("expected 0/1 or -1/+1 (labels: binary)");
      }
      out->label = v == 1 ? 1 : 0;
      return absl::OkStatus();
    }
    case LibsvmLabels::kClasses: {
      int32_t v;
      if (!absl::SimpleAtoi(token, &v) || v < 0 || v >= spec.libsvm_classes) {
        return bad(absl::StrCat("expected a class id in [0, ", spec.libsvm_classes,
                                ") (labels: classes)"));
      }
      out->label = v;
      return absl::OkStatus();
    }
    case LibsvmLabels::kRegression: {
      double v;
      if (!absl::SimpleAtod(token, &v) || !std::isfinite(v)) {
        return bad("expected a number (labels: regression)");
      }
      out->target = static_cast<float>(v);
      return absl::OkStatus();
    }
  }
  return bad("unknown label kind");
}

}  // namespace

absl::StatusOr<bool> ParseLibsvmLine(const TabularSpec& spec, absl::string_view line, Record* out) {
  // Fills a fresh record, so a bad line leaves *out as it was.
  if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
    line = line.substr(0, hash);
  }
  absl::string_view rest = line;
  const absl::string_view label = NextToken(&rest);
  if (label.empty()) return false;
  Record r;
  if (absl::Status st = ParseLabel(spec, label, &r); !st.ok()) return st;
  const int64_t lo = spec.index_base, hi = spec.index_base + spec.num_features - 1;
  for (absl::string_view token = NextToken(&rest); !token.empty(); token = NextToken(&rest)) {
    const size_t colon = token.find(':');
    if (colon == absl::string_view::npos) return BadToken(token, "expected index:value");
    const absl::string_view index_text = token.substr(0, colon);
    const absl::string_view value_text = token.substr(colon + 1);
    if (index_text == "qid") continue;
    int64_t index;
    if (!absl::SimpleAtoi(index_text, &index)) {
      return BadToken(token, "expected an integer index before ':'");
    }
    if (index < lo || index > hi) {
      return BadToken(token,
                      absl::StrCat("index ", index, " outside [", lo, ", ", hi, "] (indexBase ",
                                   spec.index_base, ", numFeatures ", spec.num_features, ")"));
    }
    double value;
    if (value_text.empty() || !absl::SimpleAtod(value_text, &value) || !std::isfinite(value)) {
      return BadToken(token, "expected a number after ':'");
    }
    r.ids.push_back(static_cast<int32_t>(index - lo));
    r.values.push_back(static_cast<float>(value));
  }
  // A repeated index would make the dense vector depend on token order.
  std::vector<int32_t> sorted = r.ids;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    return absl::InvalidArgumentError(absl::StrCat("index ", *dup + lo, " appears more than once"));
  }
  if (!spec.weighted_column.empty()) {
    const size_t slots = static_cast<size_t>(spec.weighted_max_values);
    if (r.ids.size() > slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.ids.size(), " features, more than weightedColumn.maxValues (", slots, ")"));
    }
    r.lookup_ids.assign(r.ids.begin(), r.ids.end());
    r.lookup_ids.resize(slots, -1);
    r.lookup_weights = std::move(r.values);
    r.lookup_weights.resize(slots, 0.0f);
    r.ids.clear();
    r.values.clear();
  }
  *out = std::move(r);
  return true;
}

}  // namespace kubetrain
