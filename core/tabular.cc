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
#include "absl/strings/str_split.h"
#include "core/hash.h"
#include "core/libsvm.h"

namespace kubetrain {
namespace {

constexpr size_t kMaxQuoted = 40;  // characters of a bad value quoted in errors

int64_t ColumnWidth(const ColumnSpec& c) {
  switch (c.type) {
    case ColumnType::kNumeric:
      return 1;
    case ColumnType::kCategorical:
      if (c.as_ids) return 0;  // one of the lookup ids
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
  std::vector<int64_t> indices;
  // Multi-valued columns (separator set): each value's index, in field
  // order (indices[c] is unused for them).
  std::vector<std::vector<int64_t>> multi;
};

// The lines of a list of files, in order, each file streamed (LineReader).
class TextLines {
 public:
  explicit TextLines(std::vector<std::string> files) : files_(std::move(files)) {}

  // The next line; *new_file is set on a file's first line.
  absl::StatusOr<bool> Next(absl::string_view* line, bool* new_file) {
    *new_file = false;
    while (true) {
      if (reader_ == nullptr) {
        if (next_file_ >= files_.size()) return false;
        auto r = LineReader::Open(files_[next_file_++]);
        if (!r.ok()) return r.status();
        reader_ = std::move(*r);
        *new_file = true;
      }
      auto more = reader_->Next(line);
      if (!more.ok()) return more.status();
      if (*more) return true;
      reader_.reset();
    }
  }
  std::string Where() const {
    return absl::StrCat(reader_->path(), ":", reader_->line_number(), ": ");
  }

 private:
  const std::vector<std::string> files_;
  size_t next_file_ = 0;
  std::unique_ptr<LineReader> reader_;
};

// The next line `parse` takes as a record (parse(line, new_file, out):
// false for lines that are not records). A bad one fails with
// "<file>:<line>: <what>", or under skip is passed over and counted.
template <typename Out, typename Parse>
absl::StatusOr<bool> NextGood(TextLines* lines, bool skip, int64_t* skipped, const Parse& parse,
                              Out* out) {
  absl::string_view line;
  bool new_file;
  while (true) {
    auto more = lines->Next(&line, &new_file);
    if (!more.ok()) return more.status();
    if (!*more) return false;
    auto parsed = parse(line, new_file, out);
    if (parsed.ok()) {
      if (*parsed) return true;
      continue;
    }
    if (!skip) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat(lines->Where(), parsed.status().message()));
    }
    ++*skipped;
  }
}

// Parses CSV lines into per-column values, and encodes them as features.
class CsvParser {
 public:
  explicit CsvParser(const TabularSpec& spec) : spec_(spec) {
    for (const ColumnSpec& c : spec.columns) {
      if (c.type == ColumnType::kLabel) {
        label_classes_ = !c.classes.empty() ? static_cast<int>(c.classes.size()) : c.num_classes;
      }
    }
  }

  bool regression() const { return label_classes_ == 0; }

  // False for blank, comment and header lines.
  absl::StatusOr<bool> ParseLine(absl::string_view line, bool new_file, Parsed* out) {
    if (new_file) header_pending_ = spec_.header;
    if (absl::StripAsciiWhitespace(line).empty()) return false;
    if (!spec_.comment_prefix.empty() && absl::StartsWith(line, spec_.comment_prefix)) {
      return false;
    }
    if (header_pending_) {
      header_pending_ = false;
      return false;
    }
    std::string error;
    if (!SplitRecord(line, spec_.delimiter, &fields_, &error)) {
      return absl::InvalidArgumentError(error);
    }
    if (fields_.size() != spec_.columns.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected ", spec_.columns.size(), " fields (one per column), got ", fields_.size()));
    }
    if (absl::Status st = ParseFields(fields_, out); !st.ok()) return st;
    return true;
  }

  // The record's features (normalised with mean/std, per column).
  void Encode(const Parsed& p, const std::vector<float>& mean, const std::vector<float>& std,
              Record* r) const {
    r->dense.assign(FeatureDim(spec_), 0.0f);
    r->ids.clear();
    r->values.clear();
    r->lookup_ids.clear();
    r->label = 0;
    r->target = 0;
    float* x = r->dense.data();
    int64_t offset = 0;
    for (size_t c = 0; c < spec_.columns.size(); ++c) {
      const ColumnSpec& col = spec_.columns[c];
      const double v = p.numbers[c];
      const int64_t index = p.indices[c];
      switch (col.type) {
        case ColumnType::kNumeric: {
          float value =
              std::isnan(v) ? (col.missing == "zero" ? 0.0f : mean[c]) : static_cast<float>(v);
          if (col.normalize) value = (value - mean[c]) / std[c];
          x[offset] = value;
          break;
        }
        case ColumnType::kCategorical:
          if (col.separator != 0) {
            const std::vector<int64_t>& values = p.multi[c];
            for (int k = 0; k < col.max_values; ++k) {
              const int64_t id = k < static_cast<int>(values.size()) ? values[k] : -1;
              if (col.as_ids) {
                r->lookup_ids.push_back(id);
              } else if (id >= 0) {
                x[offset + id] = 1.0f;
              }
            }
          } else if (col.as_ids) {
            r->lookup_ids.push_back(index);
          } else if (index >= 0) {
            x[offset + index] = 1.0f;
          }
          break;
        case ColumnType::kLabel:
          if (regression()) {
            r->target = static_cast<float>(v);
          } else {
            r->label = static_cast<int32_t>(index);
          }
          break;
        case ColumnType::kIgnore:
          break;
      }
      offset += ColumnWidth(col);
    }
  }

 private:
  absl::Status Bad(const ColumnSpec& col, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("column '", col.name, "': ", what));
  }

  // The id of one categorical value: its vocabulary index (-1 if not in it),
  // hash bucket or dynamic id.
  static int64_t CategoryIndex(const ColumnSpec& col, absl::string_view v) {
    if (col.dynamic) return DynamicColumnId(v);
    if (col.hash_buckets > 0) {
      return static_cast<int64_t>(Fnv1a64(v) % static_cast<uint64_t>(col.hash_buckets));
    }
    auto it = std::find(col.vocabulary.begin(), col.vocabulary.end(), v);
    return it == col.vocabulary.end() ? -1 : it - col.vocabulary.begin();
  }

  bool IsMissing(const std::string& v) const {
    return std::find(spec_.missing_values.begin(), spec_.missing_values.end(), v) !=
           spec_.missing_values.end();
  }

  absl::Status ParseFields(const std::vector<std::string>& fields, Parsed* out) {
    const size_t ncols = spec_.columns.size();
    out->numbers.assign(ncols, std::numeric_limits<double>::quiet_NaN());
    out->indices.assign(ncols, -1);
    out->multi.resize(ncols);
    for (std::vector<int64_t>& values : out->multi) values.clear();
    for (size_t c = 0; c < ncols; ++c) {
      const ColumnSpec& col = spec_.columns[c];
      const std::string& v = fields[c];
      const bool missing = IsMissing(v);
      switch (col.type) {
        case ColumnType::kIgnore:
          break;
        case ColumnType::kNumeric: {
          if (missing) {
            if (col.missing == "error") return Bad(col, "missing value");
            break;
          }
          double number;
          if (!absl::SimpleAtod(v, &number) || !std::isfinite(number)) {
            return Bad(col, absl::StrCat("expected a number, got ", QuoteDataValue(v)));
          }
          out->numbers[c] = number;
          break;
        }
        case ColumnType::kCategorical:
          if (missing) {
            if (col.missing == "error") return Bad(col, "missing value");
            break;
          }
          if (col.separator == 0) {
            out->indices[c] = CategoryIndex(col, v);
            break;
          }
          for (absl::string_view part : absl::StrSplit(v, col.separator)) {
            part = absl::StripAsciiWhitespace(part);
            if (part.empty() || IsMissing(std::string(part))) continue;
            if (static_cast<int>(out->multi[c].size()) == col.max_values) {
              return Bad(col, absl::StrCat("more than maxValues (", col.max_values, ") values in ",
                                           QuoteDataValue(v)));
            }
            const int64_t index = CategoryIndex(col, part);
            // An out-of-vocabulary value is no id, as for a single value.
            if (index >= 0) out->multi[c].push_back(index);
          }
          break;
        case ColumnType::kLabel: {
          if (missing) return Bad(col, "missing label");
          if (!col.classes.empty()) {
            auto it = std::find_if(col.classes.begin(), col.classes.end(),
                                   [&](const auto& kv) { return kv.first == v; });
            if (it == col.classes.end()) {
              return Bad(col,
                         absl::StrCat("label ", QuoteDataValue(v), " is not one of the classes"));
            }
            out->indices[c] = it->second;
          } else if (col.num_classes > 0) {
            int32_t label;
            if (!absl::SimpleAtoi(v, &label) || label < 0 || label >= col.num_classes) {
              return Bad(col, absl::StrCat("expected a class index in [0, ", col.num_classes,
                                           "), got ", QuoteDataValue(v)));
            }
            out->indices[c] = label;
          } else {
            double target;
            if (!absl::SimpleAtod(v, &target) || !std::isfinite(target)) {
              return Bad(col, absl::StrCat("expected a number, got ", QuoteDataValue(v)));
            }
            out->numbers[c] = target;
          }
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  const TabularSpec& spec_;
  int label_classes_ = -1;
  bool header_pending_ = false;
  std::vector<std::string> fields_;
};

// One pass over CSV files, encoding with fixed normalisation figures.
class CsvReader : public RecordReader {
 public:
  CsvReader(const TabularSpec& spec, std::vector<std::string> files, std::vector<float> mean,
            std::vector<float> std)
      : spec_(spec),
        lines_(std::move(files)),
        parser_(spec),
        mean_(std::move(mean)),
        std_(std::move(std)) {}

  absl::StatusOr<bool> Next(Record* r) override {
    auto more = NextGood(
        &lines_, spec_.skip_bad_records, &skipped_,
        [&](absl::string_view line, bool new_file, Parsed* p) {
          return parser_.ParseLine(line, new_file, p);
        },
        &parsed_);
    if (!more.ok() || !*more) return more;
    parser_.Encode(parsed_, mean_, std_, r);
    return true;
  }
  int64_t skipped() const override { return skipped_; }

 private:
  const TabularSpec& spec_;
  TextLines lines_;
  CsvParser parser_;
  const std::vector<float> mean_, std_;
  Parsed parsed_;
  int64_t skipped_ = 0;
};

// One pass over libsvm files.
class LibsvmReader : public RecordReader {
 public:
  LibsvmReader(const TabularSpec& spec, std::vector<std::string> files)
      : spec_(spec), lines_(std::move(files)) {}

  absl::StatusOr<bool> Next(Record* r) override {
    return NextGood(
        &lines_, spec_.skip_bad_records, &skipped_,
        [&](absl::string_view line, bool, Record* out) {
          return ParseLibsvmLine(spec_, line, out);
        },
        r);
  }
  int64_t skipped() const override { return skipped_; }

 private:
  const TabularSpec& spec_;
  TextLines lines_;
  int64_t skipped_ = 0;
};

// The spec is copied: a source outlives the TrainingJob it came from.
class TabularSource : public RecordSource {
 public:
  TabularSource(TabularSpec spec, std::vector<std::string> files, std::vector<float> mean,
                std::vector<float> std)
      : spec_(std::move(spec)),
        files_(std::move(files)),
        mean_(std::move(mean)),
        std_(std::move(std)) {}
  int64_t feature_dim() const override { return FeatureDim(spec_); }
  int64_t id_slots() const override { return IdSlots(spec_); }
  bool has_targets() const override { return LabelClasses(spec_) == 0; }
  absl::StatusOr<std::unique_ptr<RecordReader>> Open() const override {
    if (spec_.libsvm) return std::unique_ptr<RecordReader>(new LibsvmReader(spec_, files_));
    return std::unique_ptr<RecordReader>(new CsvReader(spec_, files_, mean_, std_));
  }

 private:
  const TabularSpec spec_;
  const std::vector<std::string> files_;
  const std::vector<float> mean_, std_;
};

std::string Describe(const std::vector<std::string>& files) {
  return files.size() == 1 ? files[0] : absl::StrCat(files[0], " and ", files.size() - 1, " more");
}

absl::Status NoRecords(const std::vector<std::string>& files, int64_t skipped) {
  return absl::InvalidArgumentError(
      absl::StrCat(Describe(files), ": no records",
                   skipped > 0 ? absl::StrCat(" (", skipped, " bad ones skipped)") : ""));
}

// One pass over the files: the records that load, the bad ones skipped and
// (csv) each numeric column's mean and population stddev (1 when it is 0)
// over the values present, summed in double in file order.
absl::StatusOr<TrainingSet> Scan(const TabularSpec& spec, const std::vector<std::string>& files) {
  TrainingSet set;
  TextLines lines(files);
  if (spec.libsvm) {
    Record r;
    while (true) {
      auto more = NextGood(
          &lines, spec.skip_bad_records, &set.skipped_records,
          [&](absl::string_view line, bool, Record* out) {
            return ParseLibsvmLine(spec, line, out);
          },
          &r);
      if (!more.ok()) return more.status();
      if (!*more) break;
      ++set.size;
    }
  } else {
    const size_t ncols = spec.columns.size();
    std::vector<double> sum(ncols, 0.0), sum_sq(ncols, 0.0);
    std::vector<int64_t> n(ncols, 0);
    CsvParser parser(spec);
    Parsed p;
    while (true) {
      auto more = NextGood(
          &lines, spec.skip_bad_records, &set.skipped_records,
          [&](absl::string_view line, bool new_file, Parsed* out) {
            return parser.ParseLine(line, new_file, out);
          },
          &p);
      if (!more.ok()) return more.status();
      if (!*more) break;
      ++set.size;
      for (size_t c = 0; c < ncols; ++c) {
        const double v = p.numbers[c];
        if (spec.columns[c].type != ColumnType::kNumeric || std::isnan(v)) continue;
        sum[c] += v;
        sum_sq[c] += v * v;
        ++n[c];
      }
    }
    set.norm_mean.assign(ncols, 0.0f);
    set.norm_std.assign(ncols, 1.0f);
    for (size_t c = 0; c < ncols; ++c) {
      if (n[c] == 0) continue;
      const double mean = sum[c] / n[c];
      const double var = std::max(0.0, sum_sq[c] / n[c] - mean * mean);
      set.norm_mean[c] = static_cast<float>(mean);
      set.norm_std[c] = var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f;
    }
  }
  if (set.size == 0) return NoRecords(files, set.skipped_records);
  return set;
}

// Reads every record into a Dataset (dense), with the given normalisation.
absl::StatusOr<Dataset> ReadAll(const TabularSpec& spec, const std::vector<std::string>& files,
                                const std::vector<float>& mean, const std::vector<float>& std) {
  auto d = ReadRecords(TabularSource(spec, files, mean, std));
  if (!d.ok()) return d.status();
  if (d->size == 0) return NoRecords(files, d->skipped_records);
  d->norm_mean = mean;
  d->norm_std = std;
  return d;
}

}  // namespace

std::string QuoteDataValue(absl::string_view v) {
  if (v.size() > kMaxQuoted) return absl::StrCat("\"", v.substr(0, kMaxQuoted), "...\"");
  return absl::StrCat("\"", v, "\"");
}

int64_t FeatureDim(const TabularSpec& spec) {
  if (spec.libsvm) return spec.weighted_column.empty() ? spec.num_features : 0;
  int64_t dim = 0;
  for (const ColumnSpec& c : spec.columns) dim += ColumnWidth(c);
  return dim;
}

int64_t IdSlots(const TabularSpec& spec) {
  if (spec.libsvm) return spec.weighted_column.empty() ? 0 : spec.weighted_max_values;
  int64_t slots = 0;
  for (const ColumnSpec& c : spec.columns) slots += c.as_ids ? c.max_values : 0;
  return slots;
}

int64_t DynamicColumnId(absl::string_view value) {
  return static_cast<int64_t>(SplitMix64(Fnv1a64(value)) >> 1);
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
  return LoadTabular(spec, patterns, norm);
}

absl::StatusOr<TrainingSet> OpenTabularTrainingSet(const TabularSpec& spec) {
  auto files = ExpandFiles(spec.train_files);
  if (!files.ok()) return files.status();
  auto set = Scan(spec, *files);
  if (!set.ok()) return set.status();
  set->source = std::make_shared<TabularSource>(spec, *files, set->norm_mean, set->norm_std);
  return set;
}

absl::StatusOr<int64_t> CheckTabularFile(const TabularSpec& spec, const std::string& file,
                                         int64_t limit) {
  // Any figures do: only the parse is checked.
  const size_t ncols = spec.columns.size();
  TabularSource source(spec, {file}, std::vector<float>(ncols, 0.0f),
                       std::vector<float>(ncols, 1.0f));
  auto reader = source.Open();
  if (!reader.ok()) return reader.status();
  Record r;
  int64_t n = 0;
  while (n < limit) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) break;
    ++n;
  }
  return n;
}

absl::StatusOr<Dataset> LoadTabular(const TabularSpec& spec,
                                    const std::vector<std::string>& patterns, const Dataset* norm) {
  auto files = ExpandFiles(patterns);
  if (!files.ok()) return files.status();
  if (spec.libsvm) return ReadAll(spec, *files, {}, {});
  std::vector<float> mean, std;
  if (norm != nullptr) {
    mean = norm->norm_mean;
    std = norm->norm_std;
  } else {
    auto set = Scan(spec, *files);
    if (!set.ok()) return set.status();
    mean = set->norm_mean;
    std = set->norm_std;
  }
  const size_t ncols = spec.columns.size();
  if (mean.size() != ncols || std.size() != ncols) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(*files), ": normalisation has ", mean.size(), " columns, the schema has ", ncols));
  }
  return ReadAll(spec, *files, mean, std);
}

}  // namespace kubetrain
