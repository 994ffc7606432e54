// Tabular training data (spec.training.dataset.format: csv): the column
// schema, and a reader that turns CSV files (plain or gzip) into a Dataset of
// feature vectors, one row per record.
//
// Features are laid out in column order: a numeric column is one value
// (optionally normalised to (x - mean) / stddev), a categorical column is a
// one-hot block over its vocabulary or its hash buckets; label and ignore
// columns add none. Means and stddevs are computed in one pass over the
// training files (population stddev; 1 when it is 0) and rounded to float;
// the test set and `kubetrain eval` use the training set's figures (recorded
// in the model file).
//
// Parsing: records are lines ('\n' or "\r\n"); blank lines and lines starting
// with `comment_prefix` are skipped, and so is the first other line when
// `header` is set. Fields are split at `delimiter`; a field may be quoted
// with '"' ("" inside quotes is one quote, and a delimiter inside quotes is
// text); unquoted fields are trimmed of spaces and tabs. A field equal to one
// of `missing_values` (after trimming) is missing: numeric columns then take
// the training mean (missing "mean", the default) or 0 ("zero") before
// normalisation, categorical columns an all-zero block ("zeros", the
// default); with missing "error", and for the label always, the record is
// bad. A categorical value outside its vocabulary is an all-zero block.
//
// A bad record (wrong field count, a value that does not parse, a label
// outside its classes, an unterminated quote) fails the load with
// "<file>:<line>: column '<name>': <what>", or with skip_bad_records is
// dropped and counted in Dataset::skipped_records.
#ifndef KUBETRAIN_CORE_TABULAR_H_
#define KUBETRAIN_CORE_TABULAR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dataset.h"

namespace kubetrain {

enum class ColumnType { kNumeric, kCategorical, kLabel, kIgnore };

// format libsvm: how the first token of a row reads (core/libsvm.h).
enum class LibsvmLabels { kBinary, kClasses, kRegression };

struct ColumnSpec {
  std::string name;
  ColumnType type = ColumnType::kNumeric;
  bool normalize = false;  // numeric
  // numeric: "mean" | "zero" | "error"; categorical: "zeros" | "error".
  std::string missing;
  std::vector<std::string> vocabulary;  // categorical: one-hot over these
  int hash_buckets = 0;                 // categorical: one-hot over FNV-1a(value) % N
  // categorical: no vocabulary, no buckets: the id of a value is
  // DynamicColumnId(value), looked up in dynamic tables (as_ids only).
  bool dynamic = false;
  // categorical, set when the model looks the column up by id (an embedding
  // or the wide part): no one-hot block; its id (vocabulary index, hash
  // bucket or dynamic id; -1 when missing or out of the vocabulary) is one
  // of the record's lookup_ids, in column order.
  bool as_ids = false;
  // categorical: a multi-valued column ("drama|comedy"): the field holds up
  // to max_values values split at `separator` (0: one value per field). As
  // ids: max_values lookup ids, -1 past the record's values; one-hot: every
  // value's bit set (multi-hot).
  char separator = 0;
  int max_values = 1;
  // label: value -> class index; or num_classes for integer labels
  // 0..num_classes-1; with neither, a numeric regression target.
  std::vector<std::pair<std::string, int>> classes;
  int num_classes = 0;
};

struct TabularSpec {
  std::vector<std::string> train_files, test_files;  // paths or glob patterns
  // The spec.training.dataset keys they were given as, for messages: "path"
  // or "trainFiles", "testPath" or "testFiles".
  std::string train_files_key = "trainFiles", test_files_key = "testFiles";
  bool header = false;
  char delimiter = ',';
  std::string comment_prefix;
  std::vector<std::string> missing_values = {"?", ""};
  bool skip_bad_records = false;
  std::vector<ColumnSpec> columns;  // format csv
  // format libsvm (core/libsvm.h); `columns` stay empty.
  bool libsvm = false;
  int64_t num_features = 0;  // features per record: ids 0..num_features-1
  int index_base = 1;        // the file's first feature index (1 or 0)
  LibsvmLabels libsvm_labels = LibsvmLabels::kBinary;
  int libsvm_classes = 0;  // kClasses: ids 0..libsvm_classes-1
  // libsvm: the features as one weighted categorical column of this name
  // (ids: the 0-based indices, weights: the values; at most
  // weighted_max_values a record) that embeddings and the wide part look up,
  // instead of num_features dense inputs. Empty: dense.
  std::string weighted_column;
  int weighted_max_values = 0;
};

// `v` in double quotes for an error message, cut after 40 characters.
std::string QuoteDataValue(absl::string_view v);

// Dense features per record (looked-up columns are ids, not features).
int64_t FeatureDim(const TabularSpec& spec);
// Lookup ids per record: max_values per column with as_ids (libsvm:
// weighted_max_values).
int64_t IdSlots(const TabularSpec& spec);

// The id of a dynamic column's value: SplitMix64(Fnv1a64(value)) >> 1
// (core/hash.h), in [0, 2^63) so that -1 still means "no value". Mixed so
// that ids mod the number of PS tasks (the shard of a row) spread evenly
// even for values that differ in one character.
int64_t DynamicColumnId(absl::string_view value);
// Classes of the label column (0: a regression target; -1: no label column).
int LabelClasses(const TabularSpec& spec);

// The files matching the patterns, in order (each pattern's matches sorted).
// NotFoundError naming the pattern if one matches nothing.
absl::StatusOr<std::vector<std::string>> ExpandFiles(const std::vector<std::string>& patterns);

// Reads the files. With `norm` null, means and stddevs are computed from
// these records (the training set); otherwise those are used (the test set,
// eval). The result's norm_mean/norm_std hold the figures used.
absl::StatusOr<Dataset> LoadCsv(const TabularSpec& spec, const std::vector<std::string>& patterns,
                                const Dataset* norm);

// The training set of `spec` (csv or libsvm): one scan of spec.train_files
// (records that load, bad ones skipped, and for csv the means and stddevs;
// under onBadRecord: fail the first bad record is the error, file:line),
// and a source that streams them again for every pass.
absl::StatusOr<TrainingSet> OpenTabularTrainingSet(const TabularSpec& spec);

// Reads `file` (one file, not a pattern) from its start as a pass of the
// tasks would (the schema, onBadRecord) until `limit` records have loaded
// or it ends; returns how many loaded. Records are checked, not kept (no
// normalisation). Errors name the file (missing, unreadable, corrupt gzip)
// or file:line (a bad record): the pre-flight check of `kubetrain validate`
// and `kubetrain run` (CheckDatasetFiles, core/task_config.h).
absl::StatusOr<int64_t> CheckTabularFile(const TabularSpec& spec, const std::string& file,
                                         int64_t limit);

// The records of the files in memory (test sets, eval): LoadCsv, or for
// spec.libsvm the libsvm reader (no normalisation).
absl::StatusOr<Dataset> LoadTabular(const TabularSpec& spec,
                                    const std::vector<std::string>& patterns, const Dataset* norm);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_TABULAR_H_
