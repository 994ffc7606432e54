// The worker's view of the parameter servers: one ShardChannel per PS task
// (ps/shard_channel.h; gRPC in production, in-process in tests) and a
// PsClient that fans pulls and pushes out over all shards at once and maps
// parts onto whole variables. No gRPC here.
//
// Key contract (as in ps-lite): every dense variable of the model lives on
// exactly one shard or is split by rows over several (core/placement.h); a
// pull fills every element of every dense variable, a push sends every
// element of every dense gradient. Params/grads are laid out as
// Model::variables(). Embedding tables (VariableSpec::table) are never moved
// whole: row r lives on shard r mod (PS tasks); PullRows fetches the rows of
// given ids (one request per shard that holds any, split only if the answer
// would pass the chunk size), and a push carries the gradient rows of the
// same ids. For a table, params/grads hold ids.size() x dim floats, the rows
// in the order of the ids; Pull and the dense part of Push leave tables alone.
//
// A client speaks for one task: a training worker, or a chief/evaluator that
// only reads (its pulls never count as a worker's; it cannot push).
//
// Thread safety: one call at a time (a task's training loop), except
// Cancel() and GradientReady(), which any thread may call. Each shard beyond
// the first is served by a thread of the client's own, started once; an
// overlapped step (StartPushPull) runs on one more, started by the first.
#ifndef KUBETRAIN_WORKER_PS_CLIENT_H_
#define KUBETRAIN_WORKER_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/model.h"
#include "core/placement.h"
#include "ps/shard_channel.h"

namespace prometheus {
class Counter;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

struct PsClientMetrics {  // any pointer may be null
  prometheus::Histogram* pull_seconds = nullptr;
  prometheus::Histogram* push_seconds = nullptr;
  prometheus::Counter* pull_bytes = nullptr;
  prometheus::Counter* push_bytes = nullptr;
  prometheus::Counter* sparse_pull_bytes = nullptr;    // table rows received
  prometheus::Counter* sparse_push_bytes = nullptr;    // table gradient rows sent
  prometheus::Histogram* push_pull_seconds = nullptr;  // a fused step (PushPull), both halves
};

// The stats of a job's shards as one: counts (dynamic rows too) summed; version the lowest;
// staleness_max, restored_version and absent_workers the largest;
// checkpoint_error that of the first shard failing now, else the first
// shard's that has one.
v1::ShardStats SumShardStats(const std::vector<v1::ShardStats>& shards);

class PsClient {
 public:
  struct Options {
    v1::TaskType task_type = v1::TASK_TYPE_WORKER;  // the task this client speaks for
    int task_index = 0;
    std::string fingerprint;  // expected from every shard
    int64_t chunk_bytes = 1 << 20;
    absl::Duration retry_timeout = absl::Seconds(300);  // PS unreachable: retry this long
    absl::Duration hold_timeout = absl::Seconds(30);    // one held pull; re-issued after
  };
  struct PullResult {
    int64_t version = 0;        // lowest version over shards (the global step)
    bool done = false;          // every shard reached the target
    double waited_seconds = 0;  // longest hold over shards
    int64_t steps_lost = 0;     // versions lost by shards that restarted from a checkpoint
    int ps_restarts = 0;        // shards seen restarted (a new incarnation), lost steps or not
    int absent_workers = 0;     // most over shards: sync workers not waited for
  };
  struct PushResult {
    int64_t version = 0;
    bool dropped = false;
    bool done = false;
    int64_t staleness = 0;   // largest over shards
    int absent_workers = 0;  // as in PullResult
  };
  struct PushPullResult {
    PushResult push;
    PullResult pull;
  };
  // Where training is, without moving any values.
  struct StepResult {
    int64_t version = 0;     // lowest version over shards (the global step)
    bool done = false;       // every shard reached the target
    int64_t steps_lost = 0;  // as in PullResult
    int ps_restarts = 0;     // as in PullResult
    int absent_workers = 0;  // as in PullResult
  };

  // `placement` and `clock` must outlive the client. channels[i] talks to ps task i.
  PsClient(Options options, const Placement* placement, const Clock* clock,
           std::vector<std::unique_ptr<ShardChannel>> channels, PsClientMetrics metrics);
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Handshake with every shard, retrying unreachable ones with exponential
  // backoff (100 ms doubling to 2 s, slept on the clock) until
  // options.retry_timeout (their DNS names may not resolve yet). Fails at
  // once on a fingerprint mismatch (different model or placement).
  absl::Status Connect();
  // Steps this worker had done before it (re)started, as the shards recall
  // (valid after Connect): a restarted worker resumes its clock from here.
  int64_t resume_clock() const { return resume_clock_; }

  // Fills `params` (resized to the model layout). With `next_version`, each
  // shard holds the pull until its version passes the one last pulled from it
  // (the sync barrier); the shard may also hold a worker's pull for bounded
  // staleness (worker_clock). A hold that times out on the PS is asked again.
  // A shard that restarted answers at once; its lost versions are reported
  // in steps_lost.
  absl::StatusOr<PullResult> Pull(bool next_version, int64_t worker_clock,
                                  const std::vector<VariableSpec>& variables, Params* params);
  // Like Pull, but waits until every shard has reached `version`. A shard
  // that gets there answers at that moment, with its values at `version`.
  absl::StatusOr<PullResult> PullAtLeast(int64_t version, int64_t worker_clock,
                                         const std::vector<VariableSpec>& variables,
                                         Params* params);
  // PullAtLeast that waits at most `hold` on each shard and then ends with
  // DEADLINE_EXCEEDED (`params` incomplete) instead of asking again.
  absl::StatusOr<PullResult> PullAtLeastWithin(int64_t version, absl::Duration hold,
                                               const std::vector<VariableSpec>& variables,
                                               Params* params);
  // Every shard's version (a handshake each; no values move).
  absl::StatusOr<StepResult> PollStep();
  // Pushes each shard its part of `grads`, tagged with the version and
  // incarnation last pulled from that shard and an id of this push, which a
  // retry repeats so a shard applies it at most once. Workers only.
  absl::StatusOr<PushResult> Push(const Params& grads, int64_t worker_clock);
  // The same, with the gradient rows of the tables' `ids` (grads of a table:
  // ids.size() x dim, in the order of its ids) to the shards holding them.
  absl::StatusOr<PushResult> Push(const Params& grads, int64_t worker_clock, const TableIds& ids);
  // A worker's steady-state step in one round trip per shard: Push(grads,
  // worker_clock, ids), then, as each shard has handled it, the pull that
  // Pull(next_version, worker_clock, variables, params) would make (tagged
  // with the same last-pulled version and incarnation). The same retries and
  // accounting as that Push then that Pull: until a shard answers the push,
  // the call is retried with the push's id (applied at most once); a pull
  // that fails after the answer (the PS restarted during the hold, a hold
  // timed out) is asked again alone, never the push. The whole round trip
  // is one push_pull_seconds observation. A PS that predates PushPull
  // (UNIMPLEMENTED) gets the Push then the Pull. Workers only.
  absl::StatusOr<PushPullResult> PushPull(const Params& grads, int64_t worker_clock,
                                          const TableIds& ids, bool next_version,
                                          const std::vector<VariableSpec>& variables,
                                          Params* params);
  // PushPull overlapped with the computation of `grads` (--overlap_layers,
  // worker/ps_client_fused.cc): starts the fused step on threads of the
  // client's own and returns. Each shard's push sends its variables in
  // `backprop_order` (Model::BackpropOrder), each as soon as
  // GradientReady(variable) says it is final (the PS takes a push's parts in
  // any order and still applies the push whole or not at all), the table
  // rows once every table's gradient is. FinishPushPull then waits and
  // returns what PushPull would: the same pushes (one id, every retry),
  // the same pull (asked again alone after a failure), the same fallback
  // and accounting; only sooner.
  // REQUIRES: grads already has the step's layout (dense variables whole,
  // tables ids[t].size() x dim; LossAndGradients keeps the buffers), and
  // params its tables' rows (PullRows). Until FinishPushPull: no call on the
  // client but GradientReady and Cancel; grads[v] is not written after
  // GradientReady(v) nor params[v] read (a shard's pull may be writing it).
  absl::Status StartPushPull(const Params& grads, int64_t worker_clock, const TableIds& ids,
                             bool next_version, const std::vector<VariableSpec>& variables,
                             Params* params, const std::vector<int>& backprop_order);
  // grads[variable] of the started step is final. Thread-safe.
  void GradientReady(int variable);
  // Waits for the started step. A variable never made ready abandons the
  // push (never applied; FAILED_PRECONDITION).
  absl::StatusOr<PushPullResult> FinishPushPull();
  // params of each table = the current rows of its `ids`, in order (no hold).
  // A worker's pull creates the missing rows of dynamic tables (see
  // ps/shard.h); with `read_only` (or from a reader) they read as their
  // initial values and nothing is created: evaluation.
  absl::Status PullRows(const TableIds& ids, Params* params, bool read_only = false);
  // params of each fixed table = the whole table (ids 0..rows-1): the model
  // export. Dynamic tables are left alone (ListRows lists theirs).
  absl::Status PullTables(Params* params);
  // The rows dynamic table `table` (index into Placement::tables) holds now,
  // summed over the shards (no rows move).
  absl::StatusOr<int64_t> CountRows(int table);
  // Calls page(ids, values, n) (values n x dim) for every row dynamic table
  // `table` holds, shard by shard, each shard's rows in increasing id order
  // (so the same rows always come in the same order), a page of at most
  // chunk_bytes at a time.
  // ABORTED if a shard creates, evicts or restores rows of the table (or
  // restarts) during the listing: the pages would not be one table.
  using RowsPage = std::function<void(const int64_t* ids, const float* values, int64_t n)>;
  absl::Status ListRows(int table, const RowsPage& page);
  // A worker stops training; an evaluator stops reading.
  absl::Status Leave();
  // The chief only: ends training on every shard and returns the summed stats.
  absl::StatusOr<v1::ShardStats> Shutdown();
  // Every shard's counters now, summed (SumShardStats), in one GetStats each
  // (no retry: a shard that cannot be reached fails the call).
  absl::StatusOr<v1::ShardStats> Stats();

  // Stops retrying and re-asking held pulls: calls in progress end with
  // CANCELLED at their next retry or re-ask (a call the PS is holding ends
  // when the PS answers it). Thread-safe.
  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  class Lanes;
  class Overlap;
  // Per-shard state from the last pull; each element is written only by the
  // thread serving that shard.
  struct ShardState {
    int64_t version = 0;
    int64_t incarnation = 0;
    bool done = false;
  };
  bool is_worker() const { return options_.task_type == v1::TASK_TYPE_WORKER; }
  // FAILED_PRECONDITION unless this client speaks for a worker (pushes are a worker's).
  absl::Status RequireWorker() const;
  // hold: how long each shard may hold the pull; reask: ask again after a
  // hold ran out (else DEADLINE_EXCEEDED).
  absl::StatusOr<PullResult> PullImpl(const std::function<int64_t(int)>& min_version,
                                      int64_t worker_clock,
                                      const std::vector<VariableSpec>& variables, Params* params,
                                      absl::Duration hold, bool reask);
  // Push with sparse[s]: the table rows for shard s.
  absl::StatusOr<PushResult> PushImpl(const Params& grads, int64_t worker_clock,
                                      const std::vector<std::vector<SparseRef>>& sparse);
  // The gradient rows of the tables' ids, split by the shard holding them
  // (refs[s] points into ids and rows).
  struct SparseGradients {
    std::vector<std::vector<std::vector<uint64_t>>> ids;      // [shard][table]
    std::vector<std::vector<std::vector<float>>> rows;        // [shard][table]
    std::vector<std::vector<std::vector<size_t>>> positions;  // [shard][table]: in ids[t]
    std::vector<std::vector<SparseRef>> refs;                 // [shard]
  };
  absl::Status SplitSparse(const Params& grads, const TableIds& ids, SparseGradients* out) const;
  // SplitSparse in two: the ids by shard and room for their rows (refs
  // final), then shard s's rows copied in from `grads`.
  absl::Status PlanSparse(const TableIds& ids, SparseGradients* out) const;
  absl::Status FillSparse(int s, const Params& grads, const TableIds& ids,
                          SparseGradients* out) const;
  // Shard s's push header for `grads`, and its dense chunks (*bytes of them).
  v1::PushRequest::Header NewPushHeader(int s, const Params& grads, int64_t worker_clock,
                                        uint64_t push_id, std::vector<ChunkRef>* chunks,
                                        uint64_t* bytes) const;
  void CountPushBytes(uint64_t dense_bytes, const std::vector<SparseRef>& sparse) const;
  static PushResult SumPushes(const std::vector<v1::PushResponse>& responses);
  // Whether `incarnation` is a restart of shard `s` and the versions it lost
  // (0 when its checkpoint was as new as what this client last saw); records
  // the shard's new state.
  struct ShardRestart {
    bool restarted = false;
    int64_t steps_lost = 0;
  };
  v1::PullRequest NewPullRequest(int s, int64_t min_version, int64_t worker_clock,
                                 absl::Duration hold) const;
  // Copies shard s's chunks into `params` (laid out by ResizeParams).
  ShardChannel::ChunkSink PullSink(int s, Params* params) const;
  static void ResizeParams(const std::vector<VariableSpec>& variables, Params* params);
  // Pulls `req` from shard s (retrying UNAVAILABLE; re-asking a hold the PS
  // let go of if `reask`), then Observe.
  absl::Status PullShard(int s, const v1::PullRequest& req, const ShardChannel::ChunkSink& sink,
                         bool reask, v1::PullResponse::Header* header, ShardRestart* restart);
  // Shard s's half of a fused step (PushPull): until the push is answered,
  // the call is retried whole with its push id; then the pull alone.
  absl::Status PushPullShard(int s, const v1::PushRequest::Header& h,
                             const std::vector<ChunkRef>& chunks,
                             const std::vector<SparseRef>& sparse, uint64_t bytes,
                             const v1::PullRequest& req, const ShardChannel::ChunkSink& sink,
                             v1::PushResponse* response, v1::PullResponse::Header* header,
                             ShardRestart* restart);
  static PullResult SumPulls(const std::vector<v1::PullResponse::Header>& headers,
                             const std::vector<ShardRestart>& restarts);
  ShardRestart Observe(int s, int64_t incarnation, int64_t version, bool done);
  // Runs fn(shard) for every shard at once; the first error (by shard) wins.
  absl::Status ForEachShard(const std::function<absl::Status(int)>& fn);
  // Retries fn while it returns UNAVAILABLE, with backoff, until retry_timeout.
  absl::Status WithRetry(const std::string& what, int shard,
                         const std::function<absl::Status()>& fn);
  std::string TaskName() const;
  // A ListRows request of this task for `table` (Placement::tables index).
  v1::ListRowsRequest NewListRowsRequest(int table, uint64_t max_rows) const;

  // Constant after construction.
  const Options options_;
  const Placement* const placement_;
  const Clock* const clock_;
  const std::vector<std::unique_ptr<ShardChannel>> channels_;
  const PsClientMetrics metrics_;
  const uint64_t chunk_elements_;
  // Per shard: its parts, and the same by name (built once).
  std::vector<std::vector<const PartPlacement*>> shard_parts_;
  std::vector<absl::flat_hash_map<std::string, const PartPlacement*>> parts_by_name_;
  std::unique_ptr<Lanes> lanes_;
  // The overlapped step (StartPushPull); created by the first. (Deleted in
  // ps_client_fused.cc, where Overlap is defined.)
  struct OverlapDeleter {
    void operator()(Overlap* o) const;
  };
  std::unique_ptr<Overlap, OverlapDeleter> overlap_;

  std::atomic<bool> cancelled_{false};
  // The calling thread's (see the class comment).
  std::vector<ShardState> shards_;
  int64_t resume_clock_ = 0;
  uint64_t next_push_id_;  // of the next Push (one id for all shards; retries reuse it)
};

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_PS_CLIENT_H_
