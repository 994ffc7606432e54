// A trained model in one file: the model spec and every variable, with a
// CRC32, written atomically. The chief exports it at the end of a job;
// `kubetrain eval MODEL` loads it and reports test accuracy.
#ifndef KUBETRAIN_CORE_MODEL_FILE_H_
#define KUBETRAIN_CORE_MODEL_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_env.h"
#include "core/model.h"

namespace kubetrain {

// Where WriteModelFile takes the rows of a model's dynamic tables
// (VariableSpec::dynamic): they are streamed to the file a page at a time,
// never held whole (the chief lists them off the PS tasks).
class DynamicRowSource {
 public:
  // n ids and n x dim values (the table's dim).
  using Page = std::function<void(const int64_t* ids, const float* values, int64_t n)>;
  virtual ~DynamicRowSource() = default;
  // How many rows of table variable `variable` the file will hold; asked
  // once per write, before ForEachPage.
  virtual absl::StatusOr<int64_t> CountRows(int variable) = 0;
  // Calls `page` for all those rows, in the order the file is to hold them
  // (the same rows in the same order make the same bytes). The write fails (nothing
  // is written) if it returns an error or the rows are not exactly
  // CountRows's.
  virtual absl::Status ForEachPage(int variable, const Page& page) = 0;
};

struct ModelFile {
  ModelSpec spec;
  // Layout of Model::Create(spec)->variables(); nothing of a dynamic table
  // (whatever it holds there is ignored by WriteModelFile).
  Params params;
  int64_t global_step = 0;
  std::string job_name;
  // What eval needs to read data as training did: the spec's
  // spec.training.dataset section as YAML ("" for the IDX defaults), and
  // per-column normalisation (mean, stddev; indexed by column, empty when
  // nothing is normalised) computed from the training files.
  std::string dataset_yaml;
  std::vector<float> norm_mean, norm_std;
  // spec.training.seed: what a dynamic table's missing rows are initialised
  // from (InitialTableRow). Recorded from format 4 on.
  uint64_t seed = 1;
  // Writing a model with dynamic tables: their rows (not owned).
  DynamicRowSource* dynamic_rows = nullptr;

  // Set by ReadModelFile: the file's payload and where each dynamic table's
  // rows lie in it (ReadDynamicRows reads them from there).
  struct StoredRows {
    int variable = 0;
    int64_t rows = 0;
    std::string_view data;  // rows x (u64 id, dim floats)
  };
  std::shared_ptr<const std::string> payload;
  std::vector<StoredRows> stored_rows;
};

// Format version 4: version 3 (the sparse features: sparse inputs,
// embeddings, the wide part) plus dynamic tables: the seed, dynamic columns
// and maxRows, and each dynamic table's existing rows as (id, row) pairs;
// params hold every fixed table whole. Versions 3, 2 and 1 (1: softmax and
// mlp, before layer lists) are still read. The payload is streamed from
// `model` (and model.dynamic_rows) to the file. Errors name the path.
// REQUIRES: params match the spec's variables; dynamic_rows is set if the
// model has a dynamic table.
absl::Status WriteModelFile(const std::string& path, const ModelFile& model,
                            FileEnv* env = FileEnv::Default());
// Verifies magic, length, checksum, and that the variables match the spec.
// The payload stays in memory (ModelFile::payload): dynamic tables' rows are
// read from it on demand, never decoded whole.
absl::StatusOr<ModelFile> ReadModelFile(const std::string& path);

// Rows of dynamic table `variable` of `model` (the file's model) for `ids`
// (ids.size() x dim into out): the row the file holds, else the row's
// initial value InitialTableRow(file.seed, ...) -- what a PS serves a reader
// for an id it does not hold. INVALID_ARGUMENT if `variable` is not a
// dynamic table of the file.
absl::Status ReadDynamicRows(const ModelFile& file, const Model& model, int variable,
                             const std::vector<int64_t>& ids, float* out);

// Makes file->params fit evaluation with compact tables (Batch::sparse,
// CompactLookups): each table's values become the rows of ids[t] only, in
// order (a fixed table's from its whole values, a dynamic table's by
// ReadDynamicRows) -- what the chief pulls from the PS tasks to evaluate.
absl::Status KeepTableRows(const Model& model, const TableIds& ids, ModelFile* file);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_MODEL_FILE_H_
