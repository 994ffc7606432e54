// The YAML-field helpers the section parsers of core/job_spec share.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/job_spec.h"
#include "core/job_spec_fields.h"

namespace kubetrain {
namespace spec_internal {
namespace {

// Levenshtein distance, for "did you mean" hints on typos.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      size_t cost = absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 1]) ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + cost});
      diag = up;
    }
  }
  return row[b.size()];
}

// A quoted scalar ("2") or an explicit !!str is a string, as in Kubernetes:
// numbers and booleans must be written plain.
bool IsString(const YAML::Node& node) {
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

bool IsDecimalInteger(absl::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

}  // namespace

absl::Status FieldError(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Join(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 60;
  if (s.size() > kMax) return absl::StrCat("\"", absl::CEscape(s.substr(0, kMax)), "...\"");
  return absl::StrCat("\"", absl::CEscape(s), "\"");
}

// What a node is, for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    default:
      return "null";
  }
}

absl::Status TypeError(absl::string_view path, absl::string_view expected, const YAML::Node& got) {
  return FieldError(path, absl::StrCat("expected ", expected, ", got ", Describe(got)));
}

std::string Suggestion(absl::string_view got, const std::vector<std::string>& known) {
  const std::string* best = nullptr;
  // Only near misses: short words are all a couple of edits apart.
  size_t best_distance = std::min<size_t>(2, std::max<size_t>(1, got.size() / 4)) + 1;
  for (const std::string& k : known) {
    size_t d = EditDistance(got, k);
    if (d < best_distance) {
      best_distance = d;
      best = &k;
    }
  }
  return best == nullptr ? "" : absl::StrCat("; did you mean \"", *best, "\"?");
}

absl::Status Fields::Read(const YAML::Node& node, const std::string& path,
                          const std::vector<std::string>& known, Fields* out) {
  out->path_ = path;
  out->values_.clear();
  if (!node.IsMap()) return TypeError(path, "a mapping", node);
  std::set<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {
      return FieldError(path, absl::StrCat("keys must be strings, got ", Describe(it->first)));
    }
    const std::string& key = it->first.Scalar();
    if (!seen.insert(key).second) return FieldError(Join(path, key), "duplicate key");
    if (!known.empty() && std::find(known.begin(), known.end(), key) == known.end()) {
      return FieldError(Join(path, key),
                        absl::StrCat("unknown field (known: ", absl::StrJoin(known, ", "), ")",
                                     Suggestion(key, known)));
    }
    if (!it->second.IsNull()) out->values_.emplace(key, it->second);
  }
  return absl::OkStatus();
}

absl::Status ToInt64(const YAML::Node& node, const std::string& path, int64_t* out) {
  if (!node.IsScalar() || IsString(node)) return TypeError(path, "an integer", node);
  const std::string& text = node.Scalar();
  if (!IsDecimalInteger(text)) return TypeError(path, "an integer", node);
  if (!absl::SimpleAtoi(text, out))
    return FieldError(path, absl::StrCat("out of range, got ", text));
  return absl::OkStatus();
}

absl::Status ToInt32(const YAML::Node& node, const std::string& path, int* out) {
  int64_t v;
  KT_RETURN_IF_ERROR(ToInt64(node, path, &v));
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return FieldError(path, absl::StrCat("out of range, got ", v));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ToUint64(const YAML::Node& node, const std::string& path, uint64_t* out) {
  if (!node.IsScalar() || IsString(node)) return TypeError(path, "a non-negative integer", node);
  const std::string& text = node.Scalar();
  if (!IsDecimalInteger(text)) return TypeError(path, "a non-negative integer", node);
  if (text[0] == '-') return FieldError(path, absl::StrCat("must be >= 0, got ", text));
  if (!absl::SimpleAtoi(text, out))
    return FieldError(path, absl::StrCat("out of range, got ", text));
  return absl::OkStatus();
}

absl::Status ToDouble(const YAML::Node& node, const std::string& path, double* out) {
  if (!node.IsScalar() || IsString(node)) return TypeError(path, "a number", node);
  std::string text = node.Scalar();
  // YAML's spellings of infinity and NaN; validation decides whether they are
  // allowed.
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == ".inf" || lower == "+.inf") {
    *out = std::numeric_limits<double>::infinity();
    return absl::OkStatus();
  }
  if (lower == "-.inf") {
    *out = -std::numeric_limits<double>::infinity();
    return absl::OkStatus();
  }
  if (lower == ".nan") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return absl::OkStatus();
  }
  // Only plain decimal notation: no "inf", "nan", hex or "1_000".
  bool ok =
      std::any_of(text.begin(), text.end(), absl::ascii_isdigit) &&
      std::all_of(text.begin(), text.end(), [](char c) {
        return absl::ascii_isdigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
      });
  if (!ok || !absl::SimpleAtod(text, out)) return TypeError(path, "a number", node);
  return absl::OkStatus();
}

absl::Status ToBool(const YAML::Node& node, const std::string& path, bool* out) {
  if (node.IsScalar() && !IsString(node)) {
    const std::string& t = node.Scalar();
    if (t == "true" || t == "True" || t == "TRUE") {
      *out = true;
      return absl::OkStatus();
    }
    if (t == "false" || t == "False" || t == "FALSE") {
      *out = false;
      return absl::OkStatus();
    }
  }
  return TypeError(path, "true or false", node);
}

absl::Status ToString(const YAML::Node& node, const std::string& path, std::string* out) {
  if (!node.IsScalar()) return TypeError(path, "a string", node);
  *out = node.Scalar();
  return absl::OkStatus();
}

// Optional-field readers: leave *out (the default) untouched when absent.
absl::Status ReadInt64(const Fields& f, const std::string& key, int64_t* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToInt64(*n, f.PathOf(key), out);
}

absl::Status ReadInt64(const Fields& f, const std::string& key, std::optional<int64_t>* out) {
  const YAML::Node* n = f.Get(key);
  if (n == nullptr) return absl::OkStatus();
  int64_t v;
  KT_RETURN_IF_ERROR(ToInt64(*n, f.PathOf(key), &v));
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadInt32(const Fields& f, const std::string& key, int* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToInt32(*n, f.PathOf(key), out);
}

absl::Status ReadInt32(const Fields& f, const std::string& key, std::optional<int>* out) {
  const YAML::Node* n = f.Get(key);
  if (n == nullptr) return absl::OkStatus();
  int v;
  KT_RETURN_IF_ERROR(ToInt32(*n, f.PathOf(key), &v));
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadDouble(const Fields& f, const std::string& key, double* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToDouble(*n, f.PathOf(key), out);
}

absl::Status ReadBool(const Fields& f, const std::string& key, bool* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToBool(*n, f.PathOf(key), out);
}

absl::Status ReadString(const Fields& f, const std::string& key, std::string* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToString(*n, f.PathOf(key), out);
}

// Reads a nested mapping; `*present` tells whether it was there at all.
absl::Status ReadSection(const Fields& parent, const std::string& key,
                         const std::vector<std::string>& known, Fields* out, bool* present) {
  const YAML::Node* n = parent.Get(key);
  *present = n != nullptr;
  if (n == nullptr) return absl::OkStatus();
  return Fields::Read(*n, parent.PathOf(key), known, out);
}

std::string OneOf(const std::vector<std::string>& allowed) {
  return absl::StrCat("must be one of ", absl::StrJoin(allowed, ", "));
}

absl::Status CheckOneOf(const std::string& path, const std::string& value,
                        const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return absl::OkStatus();
  return FieldError(
      path, absl::StrCat(OneOf(allowed), ", got ", Quote(value), Suggestion(value, allowed)));
}

absl::Status ReadStringList(const Fields& f, const std::string& key,
                            std::vector<std::string>* out) {
  const YAML::Node* n = f.Get(key);
  if (n == nullptr) return absl::OkStatus();
  const std::string path = f.PathOf(key);
  if (!n->IsSequence()) return TypeError(path, "a list of strings", *n);
  out->clear();
  for (size_t i = 0; i < n->size(); ++i) {
    std::string v;
    KT_RETURN_IF_ERROR(ToString((*n)[i], absl::StrCat(path, "[", i, "]"), &v));
    out->push_back(v);
  }
  return absl::OkStatus();
}

// DNS-1035 label: [a-z]([-a-z0-9]*[a-z0-9])?
bool IsDns1035Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (!absl::ascii_islower(s.front())) return false;
  if (s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
  });
}

// DNS-1123 label (namespaces): [a-z0-9]([-a-z0-9]*[a-z0-9])?
bool IsDns1123Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
  });
}

// DNS-1123 subdomain (PriorityClass names, Volcano queues): labels joined by dots.
bool IsDns1123Subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(s, '.')) {
    if (!IsDns1123Label(std::string(label))) return false;
  }
  return true;
}

absl::Status CheckFinite(const std::string& path, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be a finite number, got ", value));
}

// Hyper-parameters are doubles in the spec but float32 where the PS uses
// them: a value float32 cannot hold (1e39 -> inf, 1e-50 -> 0) must be refused
// here, naming the field, not found by the optimizer at step 2.
absl::Status CheckFloat32(const std::string& path, double value) {
  const double magnitude = std::fabs(value);
  if (magnitude > std::numeric_limits<float>::max()) {
    return FieldError(path, absl::StrCat("must be at most ", std::numeric_limits<float>::max(),
                                         " in magnitude (it is used as a float32), got ", value));
  }
  if (value != 0 && magnitude < std::numeric_limits<float>::min()) {
    return FieldError(path,
                      absl::StrCat("must be 0 or at least ", std::numeric_limits<float>::min(),
                                   " in magnitude (it is used as a float32, where ", value,
                                   " would be 0 or denormal), got ", value));
  }
  return absl::OkStatus();
}

}  // namespace spec_internal

}  // namespace kubetrain
