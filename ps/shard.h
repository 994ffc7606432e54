// The PS shard: the variables placed on one PS task, their optimizer state and
// version, and the rules of sync aggregation, async apply and bounded
// staleness. Pure domain logic: no sockets, tested directly (shard_test.cc);
// ps/service.cc is a thin gRPC adapter over it.
//
// Versions: the shard starts at version 0 and every optimizer step adds one.
// Training is done when the version reaches `target_steps`; after that pushes
// are ignored and every pull returns at once with done = true.
//
// Sync mode: a push carries the version it was computed against. A push for
// the current version is kept (at most one per worker); when
// `replicas_to_aggregate` have arrived they are averaged and applied, and the
// version advances. A push for an older version is stale: dropped and counted.
// A push for a version the shard has not reached is INVALID_ARGUMENT.
// Workers wait at the barrier by pulling with min_version = v + 1.
//
// Numerics: the average is summed in double, in worker-index order (so it
// cannot overflow for finite float32 inputs and does not depend on the order
// in which gradients arrive), then rounded to float32 once. Every update is
// staged and checked: an update that would store a non-finite value in a
// parameter or in the optimizer's state is refused as a whole (nothing
// changes), counted (nonfinite_updates) and logged at most once per 10 s.
// A refused sync step still advances the version (the step is skipped, so the
// workers at the barrier go on); a refused async push is dropped (dropped =
// true, the version does not move).
//
// Async mode: a push is applied on arrival; staleness = version at apply -
// version pulled is recorded. With max_staleness = tau, a pull from a worker
// whose clock (steps done) is more than tau ahead of the slowest worker that
// has not left is held until that is no longer so.
//
// Failures: with barrier_timeout > 0, a sync step that has at least one
// gradient proceeds with what arrived once the first gradient is that old
// (counted as a barrier timeout), and a worker silent that long stops holding
// others back under bounded staleness. A sync worker that missed such a
// barrier is absent: later steps need only the workers that are not
// (min(replicas_to_aggregate, present), at least 1) and do not wait for it
// again, until it pushes again (any push, even a stale one), when it is
// expected from the next step on. Every start of a PS task has a new
// incarnation; requests that name another incarnation are answered at once
// (pulls) or dropped as stale (pushes), so workers resynchronise with a shard
// that restarted from an older checkpoint.
//
// Readers: besides the training workers, a job's chief (when the job has a
// Chief replica) and its evaluators pull values. They are never workers: their
// pulls wait only for min_version, they are not in the barrier, the staleness
// bound or the worker clocks, and their Leave is not a worker's. Only the task
// that does the chief's duties (the chief, else worker 0) may end the job.
// The exporter reads like them and is always admitted (index 0).
//
// Read-only (SetReadOnly): the PS task could not save the parameters and
// holds them for `kubetrain export --from-ps`: every push is refused with
// FAILED_PRECONDITION and its reason, nothing changes any more, and every
// pull (held ones too) is answered at once.
//
// Embedding tables: the shard holds rows r = shard_index (mod num_shards) of
// every table (core/placement.h TablePlacement), each with a row-wise
// optimizer (ps/optimizer.h RowOptimizer; the wide part's tables use
// model.wide.optimizer when the job gives one). PullRows reads rows by id at
// once (no hold). A push may carry gradient rows (ids + rows) besides the
// dense gradient; they ride the same version, staleness and sync rules. In
// sync mode the rows of a step's workers are summed by id in double, in
// worker-index order, and divided by the number of gradients, exactly as the
// dense mean is (a row a worker did not touch adds 0), then applied once,
// to the touched rows only; in async mode a push's rows are applied on
// arrival (duplicate ids in one push are summed). The dense and sparse
// updates of a step are staged together and committed together (or refused
// together as non-finite). Tables are checkpointed and restored with the
// dense parts, as extra parts named "<table>@rows".
//
// Dynamic tables (TablePlacement::dynamic): the shard holds the rows of the
// ids it owns (id mod num_shards, unsigned) in a DynamicTable, bounded to
// MaxRowsPerShard rows (least recently used evicted). A worker's PullRows
// creates the missing rows (their deterministic initial value) and marks
// them used; a reader's (chief, evaluator), a read-only one and any once
// training is done reads a missing row as its initial value without
// creating it or changing recency (so the rows a finished job exports are
// the ones it trained). ListRows lists the held rows a page at a time. A push creates the rows it
// names that are missing (evicted since the pull: the gradient applies to the initial value); rows
// created by a push whose update is refused as non-finite stay (untrained). Checkpoints hold the
// held rows only, least recently used first: parts "<table>@ids" (3 floats per id, EncodeTableId)
// and "<table>@rows" (values, optimizer slots), restored with the recency order.
//
// Checkpoints are taken in place (StartCheckpoint): the dense parts are copied
// when it is taken, and table rows are read from the live tables while
// training goes on; an update about to change a row the open checkpoint still
// holds copies that row first. So a checkpoint of a large table costs the rows
// changed while it is written, not a second copy of the table, and serving
// pauses for one chunk of rows at a time, not for the whole copy.
//
// Thread safety: all methods are thread-safe. Pull callbacks run without the
// shard's lock held, exactly once per Pull.
#ifndef KUBETRAIN_PS_SHARD_H_
#define KUBETRAIN_PS_SHARD_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/clock.h"
#include "core/job_spec.h"
#include "core/log.h"
#include "core/model.h"
#include "core/placement.h"
#include "core/task_config.h"
#include "ps/checkpoint.h"
#include "ps/dynamic_table.h"
#include "ps/optimizer.h"
#include "ps/sparse_sum.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

// Who sends a request: a training worker, or a task that only reads. The
// exporter (`kubetrain export --from-ps`, index 0) is a reader every job has.
enum class TaskRole { kWorker, kChief, kEvaluator, kExporter };
struct TaskId {
  TaskRole role = TaskRole::kWorker;
  int index = 0;
};
// TF_CONFIG's spelling of the role: "worker", "chief", "evaluator", "exporter".
const char* TaskTypeName(TaskRole role);
// "worker:0", "chief:0", "evaluator:0".
std::string TaskName(const TaskId& task);

struct ShardOptions {
  int shard_index = 0;
  int num_shards = 1;  // PS tasks of the job (Shard::Create takes it from the placement)
  int num_workers = 1;
  // The job has a Chief replica: its task ("chief", 0) does the chief's
  // duties and is the only one that may end the job; else worker 0 is.
  bool has_chief_task = false;
  int num_evaluators = 0;
  TrainingMode mode = TrainingMode::kSync;
  int replicas_to_aggregate = 1;
  std::optional<int64_t> max_staleness;
  int64_t target_steps = 1;
  uint64_t seed = 1;
  absl::Duration barrier_timeout = absl::ZeroDuration();  // 0: wait forever
  int64_t incarnation = 1;                                // unique per start of the PS task
  // > 0: take a checkpoint at every multiple of this version, exactly (see
  // TakePendingCheckpoint), so a restart loses at most this many steps.
  int64_t checkpoint_every_steps = 0;
  std::string job_name;
  std::string fingerprint;
  std::string optimizer_type;
  // The wide part's tables' optimizer (model.wide.optimizer), if the job sets one.
  std::optional<OptimizerSpec> wide_optimizer;

  // The options of PS task config.tf.task_index of a job, as kubetrain-ps
  // uses them.
  static ShardOptions ForTask(const TaskConfig& config, int64_t incarnation);
};

// The task that does the chief's duties and alone may end the job: the
// Chief replica's task if the job has one, else worker 0.
TaskId ChiefTask(const ShardOptions& options);

// Where the shard reports what happens; any pointer may be null.
struct ShardMetrics {
  prometheus::Histogram* staleness = nullptr;    // steps, per applied async gradient
  prometheus::Counter* stale_dropped = nullptr;  // sync gradients too old to apply
  prometheus::Counter* applied = nullptr;        // gradients applied (sync: aggregated ones)
  prometheus::Counter* rejected = nullptr;       // invalid pushes
  prometheus::Gauge* version = nullptr;
  prometheus::Histogram* hold_seconds = nullptr;     // how long pulls were held
  prometheus::Counter* barrier_timeouts = nullptr;   // sync steps applied after the timeout
  prometheus::Counter* nonfinite_updates = nullptr;  // updates refused as non-finite
  prometheus::Gauge* absent_workers = nullptr;       // sync workers treated as absent now
};

struct ShardStatsSnapshot {
  int64_t version = 0;
  int64_t gradients_applied = 0;
  int64_t stale_gradients_dropped = 0;
  int64_t pushes_rejected = 0;
  int64_t staleness_sum = 0;  // async
  int64_t staleness_max = 0;
  int64_t barrier_timeouts = 0;
  int64_t restored_version = 0;
  int64_t nonfinite_updates = 0;  // updates refused: they would have stored Inf/NaN
  int64_t duplicate_pushes = 0;   // repeated push ids, answered without applying again
  int64_t absent_workers = 0;     // now (see Failures)
  // Checkpoint writes of this PS task (RecordCheckpointWrite): failed ones
  // since it started; whether the latest failed; the latest failure's message
  // (kept after a later success).
  int64_t checkpoint_failures = 0;
  // Table rows an update changed while a checkpoint holding them was open,
  // so copied first (the extra memory of checkpoints: see StartCheckpoint).
  int64_t checkpoint_rows_copied = 0;
  bool checkpoint_failing = false;
  std::string checkpoint_error;
  // Dynamic tables, all of them: rows held now, rows evicted (maxRows).
  int64_t dynamic_rows = 0;
  int64_t dynamic_rows_evicted = 0;
};

class Shard {
 public:
  struct PullWait {
    int worker = 0;  // the task's index within its role
    int64_t min_version = 0;
    int64_t worker_clock = 0;  // ignored for readers
    int64_t incarnation = 0;   // 0: none known yet
    TaskRole role = TaskRole::kWorker;
  };
  struct Snapshot {
    int64_t version = 0;
    int64_t incarnation = 0;
    bool done = false;
    double waited_seconds = 0;
    int absent_workers = 0;  // sync workers treated as absent (see Failures)
    // The values of parts(), concatenated in order, as little-endian float32.
    std::shared_ptr<const std::string> bytes;
  };
  using PullCallback = std::function<void(absl::StatusOr<Snapshot>)>;

  struct PushHeader {
    int worker = 0;
    int64_t version = 0;
    int64_t worker_clock = 0;
    int64_t incarnation = 0;  // 0: do not check
    uint64_t push_id = 0;     // 0: none (see Push)
  };
  // Gradient rows of one table in a push (ps/sparse_sum.h).
  using SparseGrad = ::kubetrain::SparseGrad;
  struct RowsResult {
    int64_t version = 0;
    int64_t incarnation = 0;
    std::vector<std::vector<float>> rows;  // per request table: ids.size() x dim
  };
  struct PushResult {
    int64_t version = 0;
    bool dropped = false;
    bool done = false;
    int64_t staleness = 0;
    int absent_workers = 0;
  };

  // Initial values come from model.InitialValue(variable, seed), sliced to the
  // parts placed on options.shard_index.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(const ShardOptions& options,
                                                       const Model& model,
                                                       const Placement& placement,
                                                       const OptimizerSpec& optimizer,
                                                       const Clock* clock, ShardMetrics metrics);

  const std::vector<PartPlacement>& parts() const { return parts_; }
  const std::vector<TablePlacement>& tables() const { return tables_; }
  // Index into tables() of the table with this name, or -1.
  int TableIndex(const std::string& name) const;
  // Per table (tables() order): bytes of its rows held here and their
  // optimizer slots (local rows x dim x 4 x (1 + slots)); a dynamic table's
  // DynamicTable::Bytes (ids, LRU links and hash map too).
  std::vector<int64_t> TableBytes() const;
  struct TableCounts {
    int64_t rows = 0;     // held here now
    int64_t created = 0;  // dynamic tables: rows created since the start
    int64_t evicted = 0;  // dynamic tables: rows evicted since the start
  };
  std::vector<TableCounts> TableRowCounts() const;
  // Rows of this shard's tables, by table and global id (read_only: see
  // Dynamic tables). INVALID_ARGUMENT (nothing read) for an unknown task or
  // table, an id out of range or held by another shard.
  absl::StatusOr<RowsResult> PullRows(const TaskId& task,
                                      const std::vector<std::pair<int, std::vector<int64_t>>>& ids,
                                      bool read_only = false);
  struct RowsPage {
    int64_t version = 0;
    int64_t incarnation = 0;
    std::vector<int64_t> ids;
    std::vector<float> values;  // ids.size() x dim
    int64_t next_cursor = 0;
    bool done = false;
    int64_t total_rows = 0;  // held now
    int64_t generation = 0;  // DynamicTable::generation
  };
  // A page of the rows dynamic table `table` holds, in increasing id order
  // (DynamicTable::List): at most max_rows from `cursor` (0 first, then the
  // previous page's next_cursor). INVALID_ARGUMENT
  // for an unknown task or table or a fixed table (pull those by id).
  absl::StatusOr<RowsPage> ListRows(const TaskId& task, int table, int64_t cursor,
                                    int64_t max_rows);
  // Index into parts() of the part with this name, or -1.
  int PartIndex(absl::string_view name) const;
  const ShardOptions& options() const { return options_; }

  // Calls `done` once: at once if the shard can serve the pull, else when it
  // can, when `deadline` passes (DEADLINE_EXCEEDED, via ExpireWaiters), or on
  // CancelPull (CANCELLED). Returns a ticket for CancelPull.
  // Invalid requests (a task the job does not have) get INVALID_ARGUMENT.
  uint64_t Pull(const PullWait& wait, absl::Time deadline, PullCallback done);
  void CancelPull(uint64_t ticket);
  // The PS task is stopping (SIGTERM): answers every held pull with `why`
  // (UNAVAILABLE, so a worker asks again and finds the restarted PS, instead
  // of its step failing with the CANCELLED of a server shutting down), and
  // from now on any pull that would be held gets `why` at once. A pull that
  // can be served still is.
  void StopHolding(absl::Status why);
  // Called periodically by the server: fails pulls whose deadline passed,
  // applies a sync step whose barrier timed out, and stops counting workers
  // silent for longer than the barrier timeout under bounded staleness.
  void Tick(absl::Time now);

  // grads[i] holds the gradient of parts()[i]. Validates everything (worker
  // index, version, sizes, finiteness) before touching any state: a rejected
  // push leaves the shard unchanged. A push whose push_id (non-zero) is the
  // last one this worker's pushes had is a retry: it is answered as the first
  // was (with the current version) and not applied again.
  // `sparse`: gradient rows of tables (validated likewise: known table, ids in
  // range and held here, ids.size() x dim finite values).
  absl::StatusOr<PushResult> Push(const PushHeader& header, std::vector<std::vector<float>> grads,
                                  std::vector<SparseGrad> sparse = {});
  // A push refused before it reached Push (malformed on the wire): counted
  // with the rejected pushes.
  void RecordRejectedPush();
  // The PS task's checkpoint writer reports each write (ok, or the error
  // naming the task, version and OS error), so stats() and every reader of
  // them (GetStats, the chief's report) show the job's storage health.
  void RecordCheckpointWrite(const absl::Status& result);

  // A set of buffers for one push's gradients (parts() layout, full size,
  // contents unspecified) recycled from earlier pushes, or empty if there is
  // none: large buffers are expensive to fault in again on every RPC. Push()
  // takes them back; so does ReleaseGradientBuffers (wrong sizes are freed).
  std::vector<std::vector<float>> TakePooledGradientBuffers();
  void ReleaseGradientBuffers(std::vector<std::vector<float>> buffers);
  // ReleaseGradientBuffers that says whether the pool took them: false (and
  // *buffers left as they were) for wrong sizes or a full pool.
  bool PoolGradientBuffers(std::vector<std::vector<float>>* buffers);
  // Bytes of one whole gradient (every part).
  uint64_t gradient_bytes() const { return gradient_bytes_; }
  // The same for a push's gradient rows: a set of SparseGrad entries whose
  // vectors keep their capacity (contents unspecified), or an empty vector.
  // A push's rows go back to the pool when the shard is done with them (at
  // once in async mode, after the step in sync mode), so rows of the same
  // size every step allocate nothing (ps/sparse_push_alloc_test.cc).
  std::vector<SparseGrad> TakePooledSparse();
  void ReleaseSparse(std::vector<SparseGrad> sparse);

  // A worker sends nothing more (it no longer holds back bounded staleness);
  // an evaluator reads nothing more. A chief's Leave changes nothing.
  absl::Status Leave(const TaskId& task);
  // Training is over: every held pull is answered. PERMISSION_DENIED unless
  // `from` is the task that does the chief's duties (ChiefTask).
  absl::Status RequestShutdown(const TaskId& from);
  bool shutdown_requested() const;
  // See Read-only above: from now on pushes get FAILED_PRECONDITION(reason)
  // and held pulls are answered.
  void SetReadOnly(const std::string& reason);
  bool read_only() const;
  bool all_workers_left() const;
  bool all_evaluators_left() const;
  int64_t version() const;
  int64_t incarnation() const { return options_.incarnation; }
  ShardStatsSnapshot stats() const;
  // Steps `worker` had done as far as this shard knows; also marks it alive.
  int64_t WorkerClock(int worker);
  // INVALID_ARGUMENT naming the task if the job has no such task.
  absl::Status CheckTask(const TaskId& task) const;

  // A checkpoint of the shard as it is now, read in place while the shard
  // goes on serving and training (see the top of this file): its fields and
  // dense parts are copied now; table rows are read under the lock one chunk
  // at a time by the source's Read. One is handed out at a time: nullptr
  // while another is. It supersedes a boundary's checkpoint not handed out
  // yet. The shard must outlive it; destroying it closes it.
  std::unique_ptr<CheckpointSource> StartCheckpoint();
  // A whole copy of the state in memory (tests, in-process restarts): waits
  // for an open checkpoint to close first.
  ShardCheckpoint Checkpoint();
  // The checkpoint taken at the last checkpoint_every_steps boundary and not
  // yet handed out, if any (none while another is handed out). Waits up to
  // `wait` for one, so the writer wakes the moment a boundary is crossed. A
  // boundary crossed while the previous checkpoint is still being written is
  // taken at that version all the same (both keep the rows they hold).
  std::unique_ptr<CheckpointSource> TakePendingCheckpoint(
      absl::Duration wait = absl::ZeroDuration());
  // Loads a checkpoint's state; parts and sizes must match exactly (nothing
  // is changed otherwise). Takes its vectors over: pass it with std::move
  // (a restarting PS then holds its tables once, not twice).
  absl::Status Restore(ShardCheckpoint ckpt);

 private:
  struct Waiter {
    PullWait wait;
    absl::Time start;
    absl::Time deadline;
    PullCallback done;
  };
  Shard(ShardOptions options, std::vector<PartPlacement> parts, std::unique_ptr<Optimizer> opt,
        std::vector<TablePlacement> tables, std::vector<std::unique_ptr<RowOptimizer>> row_opts,
        std::vector<std::unique_ptr<DynamicTable>> dynamic, const Clock* clock,
        ShardMetrics metrics);

  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanServe(const PullWait& w, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Snapshot MakeSnapshot(absl::Time start, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the waiters that can now be served; the caller runs them unlocked.
  std::vector<std::pair<Waiter, Snapshot>> TakeReadyWaiters(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Averages and applies the pending sync gradients (at least one) and
  // advances the version; their buffers go back to the pool, or to *freed
  // (freed outside mu_) when it is full.
  void ApplyPendingLocked(std::vector<std::vector<std::vector<float>>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Alive(int worker, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gradients a sync step needs now: replicas_to_aggregate, fewer if workers are absent.
  int NeededLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetAbsentLocked(int worker, bool absent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stages the optimizer's update for every part and commits it only if every
  // new value and slot is finite (else counts and logs it). Returns whether
  // it was applied. Does not change the version.
  // `sparse`: per table (once each), distinct ids (sorted) and their
  // gradient rows. Allocates nothing once its scratch has grown, except to
  // create the missing rows of a dynamic table.
  bool ApplyLocked(const std::vector<std::vector<float>>& grads,
                   absl::Span<const SparseGrad> sparse) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ApplyLocked in two steps. StageDenseLocked writes the new values of every
  // part into *next (a values buffer no pull reads) and stages the slots;
  // with `check_grads` it also checks the gradient's finiteness in the same
  // pass (the async push's ValidatePush leaves that to it) and returns the
  // first non-finite gradient's error (nothing staged counts: *next is
  // dropped). *staged = false: an update element was not finite.
  // FinishApplyLocked stages the rows and commits all (values_ = *next) or
  // refuses all as non-finite.
  absl::Status StageDenseLocked(const std::vector<std::vector<float>>& grads, bool check_grads,
                                std::shared_ptr<std::string>* next, bool* staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FinishApplyLocked(std::shared_ptr<std::string> next, bool staged,
                         absl::Span<const SparseGrad> sparse) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT naming the first part (from `from_part`) whose gradient
  // has a non-finite value.
  absl::Status GradsFinite(const std::vector<std::vector<float>>& grads,
                           size_t from_part = 0) const;
  // ApplyLocked's rows (shard_tables.cc): stages the row optimizers' update
  // of every entry into sparse_local_/sparse_staged_, false (nothing
  // committed) if anything new is not finite; then commits what it staged.
  bool StageSparseLocked(absl::Span<const SparseGrad> sparse, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitSparseLocked(absl::Span<const SparseGrad> sparse) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sums the rows of `pushes` (in order) by id per table, in double, and
  // divides by `n`: distinct sorted ids per table (SparseRowSum), valid
  // until the next call.
  absl::Span<const SparseGrad> AggregateSparseLocked(
      absl::Span<const std::vector<SparseGrad>* const> pushes, double n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateSparse(const std::vector<SparseGrad>& sparse) const;
  // The version advances by one optimizer step (applied or skipped).
  void StepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetVersionLocked(int64_t v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  friend class ShardImage;  // reads an open checkpoint (shard_checkpoint.cc)
  // What an open checkpoint needs beyond the live state: the copied fields
  // and dense parts, and per table the rows changed since it was taken, as
  // they were then.
  struct OpenCheckpoint {
    std::shared_ptr<const ShardCheckpoint> fixed;  // tables' values and slots empty
    struct Table {
      int64_t rows = 0;        // rows it holds: local rows, or a dynamic table's slab rows
      int64_t row_floats = 0;  // a saved row: value, each slot, (dynamic) the id's 2 floats
      // Copy-on-write storage. Rows are saved under the shard's lock, so
      // saving one never moves the others (a growing vector would copy every
      // saved row when it reallocates) and never rehashes: `index` maps a
      // row to 1 + its place among the saved rows (0: not saved); it is
      // allocated zeroed (calloc: its pages appear as rows are saved, 4 bytes
      // a row at most) on the first save. Block b holds the saved rows
      // 2^b - 1 .. 2^(b+1) - 2 (1, 2, 4, ... rows): a few dozen blocks at
      // most, never moved, and a block's pages are resident only once used.
      struct FreeDeleter {
        void operator()(uint32_t* p) const { std::free(p); }
      };
      std::unique_ptr<uint32_t[], FreeDeleter> index;
      int64_t saved = 0;
      std::vector<std::unique_ptr<float[]>> blocks;
      static int BlockOf(int64_t at) { return 63 - __builtin_clzll(static_cast<uint64_t>(at) + 1); }
      float* SavedAt(int64_t at) const {
        const int b = BlockOf(at);
        return blocks[b].get() + (at + 1 - (int64_t{1} << b)) * row_floats;
      }
      // The saved copy of `row` (value, each slot, the id's 2 floats), or null.
      const float* Saved(int64_t row) const {
        return index == nullptr || index[row] == 0 ? nullptr : SavedAt(index[row] - 1);
      }
      // Dynamic tables: the held rows and their recency then (moved to the
      // image when it is handed out).
      int64_t held = 0;
      std::vector<int32_t> prev;
      int32_t tail = -1;
    };
    std::vector<Table> tables;
  };
  // A checkpoint of the current state.
  std::unique_ptr<OpenCheckpoint> OpenCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `open` the checkpoint handed out (written_checkpoint_): its image.
  std::unique_ptr<CheckpointSource> HandOutLocked(std::unique_ptr<OpenCheckpoint> open)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copy-on-write: rows of table `t` about to change are saved first by each
  // open checkpoint that holds them and has not saved them yet.
  void SaveRowLocked(int t, int64_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SaveRowsLocked(int t, const std::vector<int64_t>& rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SaveRowsLocked(int t, const std::vector<int64_t>& rows, OpenCheckpoint::Table& table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The handed-out checkpoint's `rows` of table `t` (local or slab rows): their
  // value (slot < 0), optimizer slot `slot`, or encoded id (slot == kIdSlot).
  static constexpr int kIdSlot = -2;
  void ReadCheckpointRows(int t, int slot, const int64_t* rows, int64_t n, float* out);
  // Called by the image's destructor.
  void CloseCheckpoint();
  // `check_finite` false: all but the gradient's finiteness (the caller
  // checks it while staging: StageDenseLocked).
  absl::Status ValidatePush(const PushHeader& h, const std::vector<std::vector<float>>& grads,
                            bool check_finite) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunReady(std::vector<std::pair<Waiter, Snapshot>> ready);
  // Push() without the buffer recycling: it may keep `grads` and `sparse`
  // (sync) and puts the buffers it is done with in *freed.
  absl::StatusOr<PushResult> PushImpl(const PushHeader& header,
                                      std::vector<std::vector<float>>* grads,
                                      std::vector<SparseGrad>* sparse,
                                      std::vector<std::vector<std::vector<float>>>* freed);

  const ShardOptions options_;
  const std::vector<PartPlacement> parts_;
  const std::vector<TablePlacement> tables_;
  const std::vector<int64_t> table_local_rows_;  // per table: rows held here
  const std::vector<int64_t> table_dims_;        // per table: its dim
  const uint64_t gradient_bytes_;
  const Clock* const clock_;
  const ShardMetrics metrics_;
  // Recycles a values buffer (see values_) that neither the shard nor any
  // pull reads any more: the last holder hands it back through the
  // shared_ptr's deleter under `mu`, so the next version's writes are ordered
  // after that pull's reads (a use_count() check is a relaxed load and orders
  // nothing; TSan found the race). Shared with the deleters by weak_ptr, since
  // a pull may outlive the shard. Two spares: one for the next update, one
  // more so a pull still streaming an older version does not make an update
  // allocate (and fault in) a whole new buffer.
  struct SnapshotBufferPool {
    static constexpr size_t kMaxSpares = 2;
    static constexpr size_t kMaxBlocks = 8;
    SnapshotBufferPool() {
      spares.reserve(kMaxSpares);
      blocks.reserve(kMaxBlocks);
    }
    ~SnapshotBufferPool() {
      for (void* b : blocks) ::operator delete(b);
    }
    absl::Mutex mu;
    std::vector<std::unique_ptr<std::string>> spares ABSL_GUARDED_BY(mu);
    // The freed control blocks of the buffers' shared_ptrs (BlockAllocator),
    // all of one size: an update allocates nothing (ps/push_alloc_test.cc).
    std::vector<void*> blocks ABSL_GUARDED_BY(mu);
  };
  // Allocates a buffer's shared_ptr control block from the pool's freed ones.
  // Its copies (in the control block) keep the pool alive until the block is
  // given back, so a pull may outlive the shard.
  template <typename T>
  struct BlockAllocator {
    using value_type = T;
    explicit BlockAllocator(std::shared_ptr<SnapshotBufferPool> p) : pool(std::move(p)) {}
    template <typename U>
    BlockAllocator(const BlockAllocator<U>& other) : pool(other.pool) {}  // NOLINT: rebinding
    T* allocate(size_t n) {
      if (n == 1) {
        absl::MutexLock l(&pool->mu);
        if (!pool->blocks.empty()) {
          void* b = pool->blocks.back();
          pool->blocks.pop_back();
          return static_cast<T*>(b);
        }
      }
      return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, size_t n) {
      if (n == 1) {
        absl::MutexLock l(&pool->mu);
        if (pool->blocks.size() < SnapshotBufferPool::kMaxBlocks) {
          pool->blocks.push_back(p);
          return;
        }
      }
      ::operator delete(p);
    }
    template <typename U>
    bool operator==(const BlockAllocator<U>& other) const {
      return pool == other.pool;
    }
    template <typename U>
    bool operator!=(const BlockAllocator<U>& other) const {
      return pool != other.pool;
    }
    std::shared_ptr<SnapshotBufferPool> pool;
  };
  const std::shared_ptr<SnapshotBufferPool> snapshot_pool_ = std::make_shared<SnapshotBufferPool>();
  // A spare buffer if there is one, else a new one, of values_bytes_ bytes
  // (contents unspecified), not shared with anyone; returned to the pool
  // when its last holder drops it.
  std::shared_ptr<std::string> NewValuesBuffer();
  // Part i's values in `buffer` (a values_ layout).
  const float* PartValues(const std::string& buffer, size_t i) const {
    return reinterpret_cast<const float*>(buffer.data()) + part_offsets_[i];
  }
  float* PartValues(std::string* buffer, size_t i) const {
    return reinterpret_cast<float*>(buffer->data()) + part_offsets_[i];
  }
  const std::vector<int64_t> part_offsets_;  // per part: its first element in values_
  const uint64_t values_bytes_;              // all parts' values (== gradient_bytes_)

  mutable absl::Mutex mu_;
  // The current values of every part, concatenated in parts() order as
  // little-endian float32: the layout a pull sends, so it is every pull's
  // snapshot of this version as it is (Snapshot::bytes), with no copy. Never
  // written once it holds a version: an update writes the next version's
  // values into another buffer (NewValuesBuffer) and then replaces this
  // pointer, so a pull still streaming an older version keeps reading it.
  std::shared_ptr<std::string> values_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  // Per table: its local rows (local_rows x dim) and their row-wise optimizer.
  std::vector<std::vector<float>> table_values_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<RowOptimizer>> row_opts_ ABSL_GUARDED_BY(mu_);  // null: dynamic
  // Per table: its rows if it is dynamic, else null.
  std::vector<std::unique_ptr<DynamicTable>> dynamic_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // Sync aggregation for the current version: each contributing worker's
  // gradient, by worker index (the order they are summed in).
  using PendingMap = std::map<int, std::vector<std::vector<float>>>;
  PendingMap pending_ ABSL_GUARDED_BY(mu_);
  // The map nodes of earlier steps' pending_, reused: a step of dense
  // gradients allocates nothing (ps/push_alloc_test.cc).
  std::vector<PendingMap::node_type> spare_pending_ ABSL_GUARDED_BY(mu_);
  std::vector<const float*> mean_inputs_ ABSL_GUARDED_BY(mu_);  // ApplyPendingLocked's, reused
  // By worker index: the rows of the workers in pending_ whose push had any
  // (empty for the others). A vector, not a map: no node per push.
  std::vector<std::vector<SparseGrad>> pending_sparse_ ABSL_GUARDED_BY(mu_);
  // Scratch of a step's sparse update, kept so a step allocates nothing:
  // AggregateSparseLocked's inputs and sums, and per sparse entry
  // ApplyLocked's local rows and staged values (grown, never shrunk: a
  // shorter vector would free its entries' buffers).
  std::vector<const std::vector<SparseGrad>*> sparse_inputs_ ABSL_GUARDED_BY(mu_);
  SparseRowSum sparse_sum_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<int64_t>> sparse_local_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<float>> sparse_staged_ ABSL_GUARDED_BY(mu_);
  absl::Time accum_started_ ABSL_GUARDED_BY(mu_);  // first gradient of the current step
  std::map<int, absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  // Steps completed per worker (bounded staleness); left workers are removed.
  std::map<int, int64_t> worker_clock_ ABSL_GUARDED_BY(mu_);
  std::set<int> left_ ABSL_GUARDED_BY(mu_);
  // Sync workers that missed a timed-out barrier and have not pushed since.
  std::set<int> absent_ ABSL_GUARDED_BY(mu_);
  // Per worker: the id of its last push handled and the answer it got.
  std::map<int, std::pair<uint64_t, PushResult>> last_push_ ABSL_GUARDED_BY(mu_);
  std::set<int> evaluators_left_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::Status stop_holding_ ABSL_GUARDED_BY(mu_);  // StopHolding's `why`; OK until then
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::string read_only_reason_ ABSL_GUARDED_BY(mu_);  // "" = not read-only
  ShardStatsSnapshot stats_ ABSL_GUARDED_BY(mu_);
  // Open checkpoints (see OpenCheckpoint): the one handed out (being
  // written), and the last boundary's not handed out yet.
  std::unique_ptr<OpenCheckpoint> written_checkpoint_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<OpenCheckpoint> pending_checkpoint_ ABSL_GUARDED_BY(mu_);

  // Taken inside mu_ (ApplyPendingLocked gives buffers back), never the
  // other way round.
  absl::Mutex pool_mu_;
  std::vector<std::vector<std::vector<float>>> gradient_pool_ ABSL_GUARDED_BY(pool_mu_);
  std::vector<std::vector<SparseGrad>> sparse_pool_ ABSL_GUARDED_BY(pool_mu_);

  LogLimiter nonfinite_log_{absl::Seconds(10)};  // thread-safe itself
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SHARD_H_
