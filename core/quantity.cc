#include "core/quantity.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

// Suffix -> (base, exponent): the value is number * base^exponent.
bool SuffixScale(std::string_view s, int* base, int* exponent) {
  static constexpr std::pair<std::string_view, std::pair<int, int>> kSuffixes[] = {
      {"Ki", {2, 10}}, {"Mi", {2, 20}}, {"Gi", {2, 30}}, {"Ti", {2, 40}},
      {"Pi", {2, 50}}, {"Ei", {2, 60}}, {"n", {10, -9}}, {"u", {10, -6}},
      {"m", {10, -3}}, {"", {10, 0}},   {"k", {10, 3}},  {"M", {10, 6}},
      {"G", {10, 9}},  {"T", {10, 12}}, {"P", {10, 15}}, {"E", {10, 18}},
  };
  for (const auto& [suffix, scale] : kSuffixes) {
    if (s == suffix) {
      *base = scale.first;
      *exponent = scale.second;
      return true;
    }
  }
  // A decimal exponent: "e3", "E-2".
  if (s.size() >= 2 && (s[0] == 'e' || s[0] == 'E')) {
    std::string_view digits = s.substr(1);
    if (digits[0] == '+' || digits[0] == '-') digits.remove_prefix(1);
    if (digits.empty() || digits.size() > 3) return false;
    for (char c : digits) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    }
    *base = 10;
    *exponent = std::atoi(std::string(s.substr(1)).c_str());
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<int64_t> ParseQuantityMilli(std::string_view text) {
  const std::string quoted = absl::StrCat("\"", std::string(text), "\"");
  std::string_view s = text;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (!s.empty() && s[0] == '-') {
    return absl::InvalidArgumentError(absl::StrCat(quoted, " is negative"));
  }
  size_t i = 0;
  bool digits = false, point = false;
  while (i < s.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '.' && !point))) {
    digits = digits || s[i] != '.';
    point = point || s[i] == '.';
    ++i;
  }
  int base = 10, exponent = 0;
  if (!digits || !SuffixScale(s.substr(i), &base, &exponent)) {
    return absl::InvalidArgumentError(absl::StrCat(
        quoted,
        " is not a quantity (a number with an optional suffix: m, k, M, G, T, P, E, "
        "Ki, Mi, Gi, Ti, Pi, Ei or an exponent such as e3; e.g. \"500m\", \"2\", \"4Gi\")"));
  }
  // long double holds 64 bits of mantissa: exact for every value that fits.
  long double value = std::strtold(std::string(s.substr(0, i)).c_str(), nullptr);
  value *= std::pow(static_cast<long double>(base), exponent) * 1000.0L;
  if (!(value <= 9.2e18L)) {
    return absl::InvalidArgumentError(absl::StrCat(quoted, " is too large"));
  }
  return static_cast<int64_t>(std::ceil(value - 1e-6L));
}

std::string FormatQuantityMilli(int64_t milli) {
  if (milli % 1000 == 0) return absl::StrCat(milli / 1000);
  return absl::StrCat(milli, "m");
}

}  // namespace kubetrain
