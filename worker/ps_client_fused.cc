// PsClient's fused step (PushPull) and its overlapped form (StartPushPull,
// GradientReady, FinishPushPull): see worker/ps_client.h.
#include <algorithm>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/log.h"
#include "worker/ps_client.h"

namespace kubetrain {

absl::Status PsClient::PushPullShard(int s, const v1::PushRequest::Header& h,
                                     const std::vector<ChunkRef>& chunks,
                                     const std::vector<SparseRef>& sparse, uint64_t bytes,
                                     const v1::PullRequest& req,
                                     const ShardChannel::ChunkSink& sink,
                                     v1::PushResponse* response, v1::PullResponse::Header* header,
                                     ShardRestart* restart) {
  PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
  // Until the push is answered, the whole call is retried with the same
  // push id: a shard that applied it answers the repeat without applying
  // it again; one that restarted meanwhile drops it (another incarnation).
  bool unfused = false;  // a PS from before PushPull: its Push, then its Pull
  absl::Status rs = WithRetry("push-pull", s, [&] {
    answer = channels_[s]->PushPull(h, chunks, sparse, req, sink);
    if (absl::IsUnimplemented(answer.push.status())) {
      unfused = true;
      answer.push = channels_[s]->Push(h, chunks, sparse);
    }
    return answer.push.status();
  });
  if (!rs.ok()) return rs;
  if (unfused) return PullShard(s, req, sink, /*reask=*/true, header, restart);
  *response = *answer.push;
  CountPushBytes(bytes, sparse);
  if (answer.pull.ok()) {
    *header = *answer.pull;
    *restart = Observe(s, answer.pull->incarnation(), answer.pull->version(), answer.pull->done());
    return absl::OkStatus();
  }
  // The push is done; only the pull is left, asked again alone (a PS that
  // restarted during the hold answers it at once, with its new incarnation).
  const absl::Status& failed = answer.pull.status();
  if (failed.code() != absl::StatusCode::kUnavailable &&
      failed.code() != absl::StatusCode::kResourceExhausted &&
      failed.code() != absl::StatusCode::kDeadlineExceeded) {
    return failed;
  }
  if (cancelled_) return absl::CancelledError(absl::StrCat("pull from ps:", s, " cancelled"));
  Log(TaskName(), " pull from ps:", s, " failed after its push was answered (", failed.message(),
      "); asking for it again");
  return PullShard(s, req, sink, /*reask=*/true, header, restart);
}

absl::StatusOr<PsClient::PushPullResult> PsClient::PushPull(
    const Params& grads, int64_t worker_clock, const TableIds& ids, bool next_version,
    const std::vector<VariableSpec>& variables, Params* params) {
  if (absl::Status s = RequireWorker(); !s.ok()) return s;
  SparseGradients sparse;
  if (absl::Status s = SplitSparse(grads, ids, &sparse); !s.ok()) return s;
  ResizeParams(variables, params);
  std::vector<v1::PushResponse> responses(channels_.size());
  std::vector<v1::PullResponse::Header> headers(channels_.size());
  std::vector<ShardRestart> restarts(channels_.size());
  const uint64_t push_id = next_push_id_++;
  absl::Time start = clock_->Now();
  absl::Status st = ForEachShard([&](int s) {
    std::vector<ChunkRef> chunks;
    uint64_t bytes = 0;
    const v1::PushRequest::Header h =
        NewPushHeader(s, grads, worker_clock, push_id, &chunks, &bytes);
    // Both halves are tagged with what the last pull saw, as Push then
    // Pull(next_version) would be.
    const v1::PullRequest req = NewPullRequest(s, next_version ? shards_[s].version + 1 : 0,
                                               worker_clock, options_.hold_timeout);
    return PushPullShard(s, h, chunks, sparse.refs[s], bytes, req, PullSink(s, params),
                         &responses[s], &headers[s], &restarts[s]);
  });
  if (!st.ok()) return st;
  if (metrics_.push_pull_seconds)
    metrics_.push_pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  return PushPullResult{SumPushes(responses), SumPulls(headers, restarts)};
}

// An overlapped fused step: its inputs (built on the caller's thread at the
// start, read by the shards' threads), the per-variable gates the chunks
// wait on, and the thread that runs the step (ForEachShard from there, so
// the caller computes meanwhile). One step at a time.
class PsClient::Overlap {
 public:
  Overlap() : thread_([this] { Loop(); }) {}
  // A step still running has its closed gates opened with an error (its
  // push abandoned), so the thread can end.
  ~Overlap() {
    Abandon(absl::CancelledError("the client was destroyed during an overlapped step"));
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Closes every gate (all of `variables` not ready; `tables` of them tables).
  void ResetGates(const std::vector<VariableSpec>& variables) {
    absl::MutexLock l(&mu_);
    ready_.assign(variables.size(), false);
    is_table_.assign(variables.size(), false);
    tables_left_ = 0;
    for (size_t v = 0; v < variables.size(); ++v) {
      is_table_[v] = variables[v].table;
      tables_left_ += variables[v].table;
    }
    abandoned_ = absl::OkStatus();
  }
  void MarkReady(int v) {
    absl::MutexLock l(&mu_);
    if (v < 0 || v >= static_cast<int>(ready_.size()) || ready_[v]) return;
    ready_[v] = true;
    if (is_table_[v]) --tables_left_;
  }
  // Opens every gate still closed with `why`: their chunks are never sent.
  void Abandon(absl::Status why) {
    absl::MutexLock l(&mu_);
    if (abandoned_.ok()) abandoned_ = std::move(why);
  }
  absl::Status AwaitVariable(int v) {
    absl::MutexLock l(&mu_);
    auto open = [this, v]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_[v] || !abandoned_.ok(); };
    mu_.Await(absl::Condition(&open));
    return ready_[v] ? absl::OkStatus() : abandoned_;
  }
  absl::Status AwaitTables() {
    absl::MutexLock l(&mu_);
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return tables_left_ == 0 || !abandoned_.ok();
    };
    mu_.Await(absl::Condition(&open));
    return tables_left_ == 0 ? absl::OkStatus() : abandoned_;
  }

  // Runs `step` on the overlap thread. REQUIRES: none running.
  void Start(std::function<absl::StatusOr<PushPullResult>()> step) {
    absl::MutexLock l(&mu_);
    step_ = std::move(step);
    result_.reset();
    busy_ = true;
  }
  absl::StatusOr<PushPullResult> Wait() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](Overlap* o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(o->mu_) { return o->result_.has_value(); },
        this));
    absl::StatusOr<PushPullResult> r = std::move(*result_);
    result_.reset();
    busy_ = false;
    return r;
  }
  bool running() {
    absl::MutexLock l(&mu_);
    return busy_;
  }

  // The step's inputs: written by StartPushPull before Start, then only
  // read (by the shards' threads) until Wait returns; the sparse rows of
  // shard s are filled by shard s's thread.
  const Params* grads = nullptr;
  TableIds ids;
  SparseGradients sparse;
  std::vector<v1::PushRequest::Header> push_headers;
  std::vector<std::vector<ChunkRef>> chunks;  // per shard, in backprop order
  std::vector<uint64_t> bytes;
  std::vector<v1::PullRequest> pulls;
  std::vector<RefReady> await_variable;  // per variable
  std::vector<RefReady> await_sparse;    // per shard
  // Per shard, written by its thread only: bytes, not vector<bool>'s shared
  // words (TSan found the race).
  std::vector<char> sparse_filled;

 private:
  void Loop() {
    while (true) {
      std::function<absl::StatusOr<PushPullResult>()> step;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](Overlap* o)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(o->mu_) { return o->step_ != nullptr || o->stop_; },
            this));
        if (step_ == nullptr) return;  // stopped
        step = std::move(step_);
        step_ = nullptr;
      }
      absl::StatusOr<PushPullResult> r = step();
      absl::MutexLock l(&mu_);
      result_ = std::move(r);
    }
  }

  absl::Mutex mu_;
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);     // per variable
  std::vector<bool> is_table_ ABSL_GUARDED_BY(mu_);  // per variable
  int tables_left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status abandoned_ ABSL_GUARDED_BY(mu_);
  std::function<absl::StatusOr<PushPullResult>()> step_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<PushPullResult>> result_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // from Start until Wait returns
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

void PsClient::OverlapDeleter::operator()(Overlap* o) const { delete o; }

absl::Status PsClient::StartPushPull(const Params& grads, int64_t worker_clock, const TableIds& ids,
                                     bool next_version, const std::vector<VariableSpec>& variables,
                                     Params* params, const std::vector<int>& backprop_order) {
  if (absl::Status s = RequireWorker(); !s.ok()) return s;
  if (overlap_ == nullptr) overlap_.reset(new Overlap());
  Overlap& o = *overlap_;
  if (o.running()) return absl::FailedPreconditionError("an overlapped step is already running");
  // The chunks point into grads: its buffers must be the ones the step writes.
  if (grads.size() != variables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradients of ", grads.size(),
                                                   " variables, the model has ", variables.size()));
  }
  for (size_t v = 0; v < variables.size(); ++v) {
    if (!variables[v].table &&
        static_cast<int64_t>(grads[v].size()) != variables[v].num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of ", variables[v].name, " has ",
                                                     grads[v].size(), " values, not ",
                                                     variables[v].num_elements()));
    }
  }
  o.grads = &grads;
  o.ids = ids;
  if (absl::Status s = PlanSparse(o.ids, &o.sparse); !s.ok()) return s;
  ResizeParams(variables, params);
  o.ResetGates(variables);

  // Each variable's place in backprop order; chunks of variables not in it go last.
  std::vector<size_t> rank(variables.size(), backprop_order.size());
  for (size_t i = 0; i < backprop_order.size(); ++i) {
    if (backprop_order[i] >= 0 && backprop_order[i] < static_cast<int>(variables.size())) {
      rank[backprop_order[i]] = std::min(rank[backprop_order[i]], i);
    }
  }
  o.await_variable.clear();
  for (size_t v = 0; v < variables.size(); ++v) {
    o.await_variable.push_back([&o, v] { return o.AwaitVariable(static_cast<int>(v)); });
  }
  const int shards = static_cast<int>(channels_.size());
  o.sparse_filled.assign(shards, 0);
  o.await_sparse.clear();
  for (int s = 0; s < shards; ++s) {
    // The table rows leave once every table's gradient is final, copied
    // into the push by the shard's own thread (once: a retry resends them).
    o.await_sparse.push_back([this, &o, s]() -> absl::Status {
      if (absl::Status st = o.AwaitTables(); !st.ok()) return st;
      if (o.sparse_filled[s]) return absl::OkStatus();
      if (absl::Status st = FillSparse(s, *o.grads, o.ids, &o.sparse); !st.ok()) {
        o.Abandon(st);
        return st;
      }
      o.sparse_filled[s] = 1;
      return absl::OkStatus();
    });
  }
  for (int s = 0; s < shards; ++s) {  // once await_sparse holds them all (no more moves)
    for (SparseRef& r : o.sparse.refs[s]) r.ready = &o.await_sparse[s];
  }
  const uint64_t push_id = next_push_id_++;
  o.push_headers.assign(shards, {});
  o.chunks.assign(shards, {});
  o.bytes.assign(shards, 0);
  o.pulls.assign(shards, {});
  for (int s = 0; s < shards; ++s) {
    o.push_headers[s] = NewPushHeader(s, grads, worker_clock, push_id, &o.chunks[s], &o.bytes[s]);
    // In backprop order; a part's chunks keep their order (the PS wants
    // each part's elements in order, the parts in any order).
    std::vector<ChunkRef>& c = o.chunks[s];
    std::vector<int> var(c.size());
    for (size_t i = 0; i < c.size(); ++i) var[i] = parts_by_name_[s].at(*c[i].part)->variable;
    std::vector<size_t> order(c.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return rank[var[a]] < rank[var[b]]; });
    std::vector<ChunkRef> sorted;
    sorted.reserve(c.size());
    for (size_t i : order) {
      sorted.push_back(c[i]);
      sorted.back().ready = &o.await_variable[var[i]];
    }
    c = std::move(sorted);
    o.pulls[s] = NewPullRequest(s, next_version ? shards_[s].version + 1 : 0, worker_clock,
                                options_.hold_timeout);
  }
  const absl::Time start = clock_->Now();
  o.Start([this, &o, params, start]() -> absl::StatusOr<PushPullResult> {
    const size_t n = channels_.size();
    std::vector<v1::PushResponse> responses(n);
    std::vector<v1::PullResponse::Header> headers(n);
    std::vector<ShardRestart> restarts(n);
    absl::Status st = ForEachShard([&](int s) {
      return PushPullShard(s, o.push_headers[s], o.chunks[s], o.sparse.refs[s], o.bytes[s],
                           o.pulls[s], PullSink(s, params), &responses[s], &headers[s],
                           &restarts[s]);
    });
    if (!st.ok()) return st;
    if (metrics_.push_pull_seconds)
      metrics_.push_pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
    return PushPullResult{SumPushes(responses), SumPulls(headers, restarts)};
  });
  return absl::OkStatus();
}

void PsClient::GradientReady(int variable) {
  if (overlap_ != nullptr) overlap_->MarkReady(variable);
}

absl::StatusOr<PsClient::PushPullResult> PsClient::FinishPushPull() {
  if (overlap_ == nullptr || !overlap_->running()) {
    return absl::FailedPreconditionError("no overlapped step was started");
  }
  // Normally every gate is open by now; one that is not will never be.
  overlap_->Abandon(absl::FailedPreconditionError(
      "the overlapped step ended before every gradient was ready: the push was abandoned"));
  return overlap_->Wait();
}

}  // namespace kubetrain
