// What a job's model costs in memory, and whether that fits the memory a task
// will have. Checked by `kubetrain validate` and `kubetrain run` before any
// task starts, and by every PS and worker task at start-up (LoadTaskConfig),
// so a model that cannot fit is refused naming spec.training.model instead of
// dying of std::bad_alloc (or the OOM killer) half-way through allocating.
//
// The figures are lower bounds of what the tasks really allocate (they leave
// out transport buffers and the dataset), so a job refused here could never
// have run:
//   PS task i:  its parts of the dense variables x (1 value + optimizer slots
//               + 1 sync accumulator + 1 gradient buffer), plus (1 + slots)
//               more for the checkpoint snapshot when checkpoints are on;
//               its rows of every table (a bounded dynamic table: its maxRows
//               share; an unbounded one cannot be counted ahead) x (1 + the
//               table optimizer's slots), once even with checkpoints (they
//               read the rows in place: ps/shard.h; sparse gradients and
//               their sync sums are only the touched rows); and a dynamic
//               table's bookkeeping per row (DynamicTableBookkeepingBytes),
//               plus 12 bytes a row while a checkpoint is written (its
//               recency list and row order);
//   worker / chief / evaluator: the whole model x 2 (parameters + gradients),
//               plus one training step's activations at batchSize: every
//               layer's output, conv2d's im2col patches (and the same again
//               for their gradient), dropout masks, max-pool indices.
#ifndef KUBETRAIN_CORE_MEMORY_BUDGET_H_
#define KUBETRAIN_CORE_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/job_spec.h"

namespace kubetrain {

// How much memory a task may use, and where that figure comes from.
struct MemoryLimit {
  int64_t bytes = 0;   // 0: unknown (nothing is refused)
  std::string source;  // "--memory-limit", "the cgroup memory limit (...)", "the machine's memory"
};

// The cgroup's memory limit (v2 memory.max, else v1 memory.limit_in_bytes)
// if it is set and below the machine's memory, else the machine's memory
// (MemTotal). `root` prefixes /sys and /proc (tests).
MemoryLimit DetectMemoryLimit(const std::string& root = "");

// "8Gi", "512Mi", "1G", "1500000000": a Kubernetes memory quantity (binary
// Ki..Ei, decimal k..E suffixes, or plain bytes). Errors say what is wrong.
absl::StatusOr<int64_t> ParseMemoryQuantity(absl::string_view text);

// "1.5 GiB", "512.0 MiB", "17 B".
std::string FormatBytes(int64_t bytes);

// Float32 buffers the optimizer keeps per parameter (sgd 0, momentum 1,
// adam 2, adagrad 1, ftrl 2).
int OptimizerSlots(const std::string& optimizer_type);

// What a shard of a dynamic table holding `rows` rows spends beside their
// values and optimizer slots (ps/dynamic_table.h): per row its id (8 bytes)
// and LRU links (2 x 4), and the hash map's slots (id, row and a control
// byte: 17 bytes each) at the capacity absl's flat_hash_map has for that many
// entries (the smallest 2^k - 1 whose 7/8 holds them): 35 to 55 bytes a row.
int64_t DynamicTableBookkeepingBytes(int64_t rows);

// What one PS task needs (see above).
struct PsMemory {
  int64_t dense_bytes = 0;        // its parts of the dense variables
  int64_t table_bytes = 0;        // its table rows and their optimizer slots
  int64_t dynamic_rows = 0;       // rows of bounded dynamic tables it may hold
  int64_t bookkeeping_bytes = 0;  // their DynamicTableBookkeepingBytes
  int64_t total_bytes = 0;        // all of it, with the copies
};

struct ModelMemory {
  int64_t model_bytes = 0;       // all parameters, float32
  int64_t largest_ps_bytes = 0;  // what the biggest PS task needs (see above)
  int largest_ps = 0;            // its index
  PsMemory largest_ps_memory;    // its figures
  int64_t reader_bytes = 0;      // a worker, chief or evaluator task
  int64_t activation_bytes = 0;  // of reader_bytes: one step's activations
  int largest_layer = -1;        // the layer holding most of them (-1: none)
  int64_t largest_layer_bytes = 0;
  std::string largest_layer_what;  // "conv2d: im2col patches [12544 x 288] and their gradient"
  int64_t all_tasks_bytes = 0;     // every task of the job together
};

// REQUIRES: `job` is valid (ValidateTrainingJob).
absl::StatusOr<ModelMemory> EstimateModelMemory(const TrainingJob& job);

// InvalidArgumentError naming spec.training.model (and saying what needs how
// much, and which limit it exceeds) if a task needs more than `limit`; with
// `tasks_share_limit` (`kubetrain run`: every task on this machine) the sum
// over all tasks must fit. OK if the limit is unknown.
absl::Status CheckModelFitsMemory(const TrainingJob& job, const MemoryLimit& limit,
                                  bool tasks_share_limit);

// The same check for one task of the job ("ps"/"worker"/"chief"/"evaluator",
// TF_CONFIG's type) against the memory it runs with.
absl::Status CheckTaskFitsMemory(const TrainingJob& job, const std::string& task_type,
                                 int task_index, const MemoryLimit& limit);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_MEMORY_BUDGET_H_
