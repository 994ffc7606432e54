#include "core/tabular.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/libsvm.h"

namespace kubetrain {
namespace {

constexpr size_t kMaxQuoted = 40;  // characters of a bad value quoted in errors

uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

int64_t ColumnWidth(const ColumnSpec& c) {
  switch (c.type) {
    case ColumnType::kNumeric:
      return 1;
    case ColumnType::kCategorical:
      if (c.as_ids) return 0;  // an id slot after the dense features
      return c.hash_buckets > 0 ? c.hash_buckets : static_cast<int64_t>(c.vocabulary.size());
    case ColumnType::kLabel:
    case ColumnType::kIgnore:
      break;
  }
  return 0;
}

// Splits one record into fields (see the header for quoting); false with
// *error set on an unterminated quote or text after a closing quote.
bool SplitRecord(absl::string_view line, char delimiter, std::vector<std::string>* fields,
                 std::string* error) {
  fields->clear();
  std::string cur;
  bool quoted = false, in_quotes = false, after_quotes = false;
  auto finish = [&] {
    if (quoted) {
      fields->push_back(cur);
    } else {
      fields->emplace_back(absl::StripAsciiWhitespace(cur));
    }
    cur.clear();
    quoted = in_quotes = after_quotes = false;
  };
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_quotes) {
      if (c != '"') {
        cur += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else {
        in_quotes = false;
        after_quotes = true;
      }
    } else if (c == delimiter) {
      finish();
    } else if (after_quotes) {
      if (c != ' ' && c != '\t') {
        *error = absl::StrCat("field ", fields->size() + 1, ": text after a closing quote");
        return false;
      }
    } else if (c == '"' && absl::StripAsciiWhitespace(cur).empty()) {
      cur.clear();
      quoted = in_quotes = true;
    } else {
      cur += c;
    }
  }
  if (in_quotes) {
    *error = absl::StrCat("field ", fields->size() + 1, ": unterminated quote");
    return false;
  }
  finish();
  return true;
}

// One parsed record before encoding: per column a number (numeric, a
// regression label; NaN = missing), or an index (categorical: -1 = none;
// class labels).
struct Parsed {
  std::vector<double> numbers;
  std::vector<int32_t> indices;
};

class Reader {
 public:
  Reader(const TabularSpec& spec) : spec_(spec) {
    for (const ColumnSpec& c : spec.columns) {
      if (c.type == ColumnType::kLabel) {
        label_classes_ = !c.classes.empty() ? static_cast<int>(c.classes.size()) : c.num_classes;
      }
    }
  }

  // Parses one file's records into rows_; errors name path:line.
  absl::Status ReadFile(const std::string& path) {
    auto text = ReadDataFile(path);
    if (!text.ok()) return text.status();
    absl::string_view rest(*text);
    int64_t line_number = 0;
    bool header_pending = spec_.header;
    std::vector<std::string> fields;
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      absl::string_view line = rest.substr(0, end);
      rest = end == absl::string_view::npos ? absl::string_view() : rest.substr(end + 1);
      ++line_number;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      if (!spec_.comment_prefix.empty() && absl::StartsWith(line, spec_.comment_prefix)) continue;
      if (header_pending) {
        header_pending = false;
        continue;
      }
      const std::string where = absl::StrCat(path, ":", line_number, ": ");
      std::string error;
      absl::Status st;
      if (!SplitRecord(line, spec_.delimiter, &fields, &error)) {
        st = absl::InvalidArgumentError(where + error);
      } else if (fields.size() != spec_.columns.size()) {
        st = absl::InvalidArgumentError(absl::StrCat(where, "expected ", spec_.columns.size(),
                                                     " fields (one per column), got ",
                                                     fields.size()));
      } else {
        st = ParseFields(fields, where);
      }
      if (!st.ok()) {
        if (!spec_.skip_bad_records) return st;
        ++skipped_;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Dataset> Finish(const std::string& what, const Dataset* norm) {
    Dataset d;
    d.size = static_cast<int64_t>(numbers_.size() / std::max<size_t>(1, spec_.columns.size()));
    if (d.size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": no records",
                       skipped_ > 0 ? absl::StrCat(" (", skipped_, " bad ones skipped)") : ""));
    }
    const size_t ncols = spec_.columns.size();
    d.rows = 1;
    d.cols = static_cast<int>(FeatureDim(spec_));
    d.skipped_records = skipped_;
    if (norm != nullptr) {
      d.norm_mean = norm->norm_mean;
      d.norm_std = norm->norm_std;
    } else {
      d.norm_mean.assign(ncols, 0.0f);
      d.norm_std.assign(ncols, 1.0f);
      for (size_t c = 0; c < ncols; ++c) {
        if (spec_.columns[c].type != ColumnType::kNumeric) continue;
        double sum = 0, sum_sq = 0;
        int64_t n = 0;
        for (int64_t r = 0; r < d.size; ++r) {
          const double v = numbers_[r * ncols + c];
          if (std::isnan(v)) continue;
          sum += v;
          sum_sq += v * v;
          ++n;
        }
        if (n == 0) continue;
        const double mean = sum / n;
        const double var = std::max(0.0, sum_sq / n - mean * mean);
        d.norm_mean[c] = static_cast<float>(mean);
        d.norm_std[c] = var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f;
      }
    }
    if (d.norm_mean.size() != ncols || d.norm_std.size() != ncols) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": normalisation has ", d.norm_mean.size(), " columns, the schema has ", ncols));
    }
    const bool regression = label_classes_ == 0;
    d.images.assign(static_cast<size_t>(d.size) * d.cols, 0.0f);
    d.labels.assign(d.size, 0);
    if (regression) d.targets.assign(d.size, 0.0f);
    int64_t dense_dim = 0;
    for (const ColumnSpec& col : spec_.columns) dense_dim += ColumnWidth(col);
    for (int64_t r = 0; r < d.size; ++r) {
      float* x = d.images.data() + r * d.cols;
      int64_t offset = 0;
      int64_t slot = dense_dim;
      for (size_t c = 0; c < ncols; ++c) {
        const ColumnSpec& col = spec_.columns[c];
        const double v = numbers_[r * ncols + c];
        const int32_t index = indices_[r * ncols + c];
        switch (col.type) {
          case ColumnType::kNumeric: {
            float value = std::isnan(v) ? (col.missing == "zero" ? 0.0f : d.norm_mean[c])
                                        : static_cast<float>(v);
            if (col.normalize) value = (value - d.norm_mean[c]) / d.norm_std[c];
            x[offset] = value;
            break;
          }
          case ColumnType::kCategorical:
            if (col.as_ids) {
              x[slot++] = static_cast<float>(index);  // exact: ids < 2^24
            } else if (index >= 0) {
              x[offset + index] = 1.0f;
            }
            break;
          case ColumnType::kLabel:
            if (regression) {
              d.targets[r] = static_cast<float>(v);
            } else {
              d.labels[r] = index;
            }
            break;
          case ColumnType::kIgnore:
            break;
        }
        offset += ColumnWidth(col);
      }
    }
    return d;
  }

 private:
  absl::Status Bad(const std::string& where, const ColumnSpec& col, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, "column '", col.name, "': ", what));
  }

  bool IsMissing(const std::string& v) const {
    return std::find(spec_.missing_values.begin(), spec_.missing_values.end(), v) !=
           spec_.missing_values.end();
  }

  absl::Status ParseFields(const std::vector<std::string>& fields, const std::string& where) {
    const size_t ncols = spec_.columns.size();
    std::vector<double> numbers(ncols, std::numeric_limits<double>::quiet_NaN());
    std::vector<int32_t> indices(ncols, -1);
    for (size_t c = 0; c < ncols; ++c) {
      const ColumnSpec& col = spec_.columns[c];
      const std::string& v = fields[c];
      const bool missing = IsMissing(v);
      switch (col.type) {
        case ColumnType::kIgnore:
          break;
        case ColumnType::kNumeric: {
          if (missing) {
            if (col.missing == "error") return Bad(where, col, "missing value");
            break;
          }
          double number;
          if (!absl::SimpleAtod(v, &number) || !std::isfinite(number)) {
            return Bad(where, col, absl::StrCat("expected a number, got ", QuoteDataValue(v)));
          }
          numbers[c] = number;
          break;
        }
        case ColumnType::kCategorical:
          if (missing) {
            if (col.missing == "error") return Bad(where, col, "missing value");
            break;
          }
          if (col.hash_buckets > 0) {
            indices[c] = static_cast<int32_t>(Fnv1a64(v) % static_cast<uint64_t>(col.hash_buckets));
          } else {
            auto it = std::find(col.vocabulary.begin(), col.vocabulary.end(), v);
            if (it != col.vocabulary.end())
              indices[c] = static_cast<int32_t>(it - col.vocabulary.begin());
          }
          break;
        case ColumnType::kLabel: {
          if (missing) return Bad(where, col, "missing label");
          if (!col.classes.empty()) {
            auto it = std::find_if(col.classes.begin(), col.classes.end(),
                                   [&](const auto& kv) { return kv.first == v; });
            if (it == col.classes.end()) {
              return Bad(where, col,
                         absl::StrCat("label ", QuoteDataValue(v), " is not one of the classes"));
            }
            indices[c] = it->second;
          } else if (col.num_classes > 0) {
            int32_t label;
            if (!absl::SimpleAtoi(v, &label) || label < 0 || label >= col.num_classes) {
              return Bad(where, col,
                         absl::StrCat("expected a class index in [0, ", col.num_classes, "), got ",
                                      QuoteDataValue(v)));
            }
            indices[c] = label;
          } else {
            double target;
            if (!absl::SimpleAtod(v, &target) || !std::isfinite(target)) {
              return Bad(where, col, absl::StrCat("expected a number, got ", QuoteDataValue(v)));
            }
            numbers[c] = target;
          }
          break;
        }
      }
    }
    numbers_.insert(numbers_.end(), numbers.begin(), numbers.end());
    indices_.insert(indices_.end(), indices.begin(), indices.end());
    return absl::OkStatus();
  }

  const TabularSpec& spec_;
  int label_classes_ = -1;
  std::vector<double> numbers_;  // records x columns
  std::vector<int32_t> indices_;
  int64_t skipped_ = 0;
};

}  // namespace

std::string QuoteDataValue(absl::string_view v) {
  if (v.size() > kMaxQuoted) return absl::StrCat("\"", v.substr(0, kMaxQuoted), "...\"");
  return absl::StrCat("\"", v, "\"");
}

int64_t FeatureDim(const TabularSpec& spec) {
  if (spec.libsvm) return spec.num_features;
  int64_t dim = 0;
  for (const ColumnSpec& c : spec.columns) dim += ColumnWidth(c) + (c.as_ids ? 1 : 0);
  return dim;
}

int LabelClasses(const TabularSpec& spec) {
  if (spec.libsvm) {
    switch (spec.libsvm_labels) {
      case LibsvmLabels::kBinary:
        return 2;
      case LibsvmLabels::kClasses:
        return spec.libsvm_classes;
      case LibsvmLabels::kRegression:
        return 0;
    }
  }
  for (const ColumnSpec& c : spec.columns) {
    if (c.type != ColumnType::kLabel) continue;
    if (!c.classes.empty()) {
      int n = 0;
      for (const auto& kv : c.classes) n = std::max(n, kv.second + 1);
      return n;
    }
    return c.num_classes;
  }
  return -1;
}

absl::StatusOr<std::vector<std::string>> ExpandFiles(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    glob_t g;
    const int rc = glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
      globfree(&g);
      return absl::NotFoundError(absl::StrCat(pattern, ": no such file"));
    }
    if (rc != 0) {
      globfree(&g);
      return absl::InvalidArgumentError(absl::StrCat(pattern, ": cannot expand the pattern"));
    }
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    globfree(&g);
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  return files;
}

absl::StatusOr<Dataset> LoadCsv(const TabularSpec& spec, const std::vector<std::string>& patterns,
                                const Dataset* norm) {
  auto files = ExpandFiles(patterns);
  if (!files.ok()) return files.status();
  Reader reader(spec);
  for (const std::string& path : *files) {
    if (absl::Status st = reader.ReadFile(path); !st.ok()) return st;
  }
  return reader.Finish(files->size() == 1
                           ? (*files)[0]
                           : absl::StrCat((*files)[0], " and ", files->size() - 1, " more"),
                       norm);
}

absl::StatusOr<Dataset> LoadTabular(const TabularSpec& spec,
                                    const std::vector<std::string>& patterns, const Dataset* norm) {
  if (spec.libsvm) return LoadLibsvm(spec, patterns);
  return LoadCsv(spec, patterns, norm);
}

}  // namespace kubetrain
