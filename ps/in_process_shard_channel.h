// Test-only: PS tasks inside the test's own process, reached through the same
// ShardChannel interface as over gRPC, so whole jobs (several shards, several
// training loops on threads) run in one gtest process, on a fake clock.
//
//   InProcessPs           one PS task: a Shard configured exactly as
//                         kubetrain-ps configures it, which a test can restart
//                         (a new Shard, a new incarnation, optionally restored
//                         from a checkpoint) while channels stay connected;
//   InProcessPs::NewChannel  a ShardChannel to it: requests go through the
//                         same wire-level code as the gRPC service
//                         (ps/shard_wire.h), pulls arrive chunk by chunk;
//                         a PushPull is its Push, then its Pull;
//   FaultyShardChannel    a ShardChannelWrapper with ready-made faults: drop,
//                         delay, fail with a status, restart the PS.
//
// What is not simulated: nothing expires a held pull or a timed-out barrier
// unless the test calls InProcessPs::Tick (the PS's serve loop does it in
// kubetrain-ps), so a test decides exactly when time has passed.
#ifndef KUBETRAIN_PS_IN_PROCESS_SHARD_CHANNEL_H_
#define KUBETRAIN_PS_IN_PROCESS_SHARD_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/task_config.h"
#include "ps/checkpoint.h"
#include "ps/shard.h"
#include "ps/shard_channel.h"

namespace kubetrain {

class InProcessPs {
 public:
  // PS task `shard_index` of the job in `config` (whatever task `config`
  // itself is for). `config` and `clock` must outlive the PS.
  static absl::StatusOr<std::unique_ptr<InProcessPs>> Create(const TaskConfig& config,
                                                             int shard_index, const Clock* clock,
                                                             int64_t incarnation = 1);
  // Channels to a shard that already exists (e.g. a PsTask's, so a test
  // reaches a whole PS task over this transport). `config` and `clock` must
  // outlive the PS; `shard` is kept alive by it.
  static std::unique_ptr<InProcessPs> Over(const TaskConfig& config, std::shared_ptr<Shard> shard,
                                           const Clock* clock);

  // The shard serving now (a restart replaces it).
  std::shared_ptr<Shard> shard() const;
  int restarts() const;
  // Pulls the current shard is holding (of tasks with `role`, if given), so a
  // test can act while a task waits.
  int held_pulls(std::optional<TaskRole> role = std::nullopt) const;

  // The task dies and starts again: a new Shard with the next incarnation,
  // restored from `from` if given (else at version 0). Pulls held by the old
  // shard fail with UNAVAILABLE, as when the process goes away.
  absl::Status Restart(std::optional<ShardCheckpoint> from = std::nullopt);

  // One round of the PS's serve loop: expires held pulls and timed-out barriers.
  void Tick();

  // A channel to this PS; pulls are streamed in chunks of at most
  // `max_chunk_bytes`. The PS must outlive the channel.
  std::unique_ptr<ShardChannel> NewChannel(uint64_t max_chunk_bytes = 1 << 20);

 private:
  class Channel;
  InProcessPs(const TaskConfig& config, ShardOptions options, const Clock* clock);
  // Shard::Pull on the current shard, remembered so that a restart can fail it.
  uint64_t StartPull(const Shard::PullWait& wait, absl::Time deadline, Shard::PullCallback done,
                     std::shared_ptr<Shard>* shard);
  void EndPull(uint64_t ticket);

  // Constant after construction.
  const TaskConfig& config_;
  const ShardOptions base_options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::shared_ptr<Shard> shard_ ABSL_GUARDED_BY(mu_);
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, TaskRole> pulls_in_flight_ ABSL_GUARDED_BY(mu_);  // tickets on shard_
};

enum class ShardRpc {
  kGetInfo,
  kPull,
  kPush,
  kLeave,
  kShutdown,
  kSparsePull,
  kGetStats,
  kListRows,
  kPushPull
};

// A ShardChannelWrapper with faults a test switches on per RPC. Faults run
// before the call is forwarded, in the order they were added; the first one
// that fails the call ends it (the PS never sees it). Thread-safe.
class FaultyShardChannel : public ShardChannelWrapper {
 public:
  using ShardChannelWrapper::Push;
  using ShardChannelWrapper::ShardChannelWrapper;

  // The next `n` calls of `rpc` fail with `status` (n < 0: every call).
  void FailNext(ShardRpc rpc, int n, absl::Status status);
  // The next `n` calls of `rpc` are lost on the way: UNAVAILABLE.
  void DropNext(ShardRpc rpc, int n);
  // Every later call of `rpc` takes `delay` longer, in real time (a slow
  // link, whatever clock the test runs on).
  void Delay(ShardRpc rpc, absl::Duration delay);
  // `ps` restarts (InProcessPs::Restart(from)) right before the `nth` next
  // call of `rpc` (1: the next one) goes through.
  void RestartBefore(ShardRpc rpc, int nth, InProcessPs* ps,
                     std::optional<ShardCheckpoint> from = std::nullopt);
  // Runs `hook` before every later call of `rpc` (with the call's number,
  // counted from 1 since the channel was made); an error fails the call.
  void Before(ShardRpc rpc, std::function<absl::Status(int call)> hook);
  // Calls of `rpc` so far, including failed ones.
  int calls(ShardRpc rpc) const;

  absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request,
                                        absl::Duration timeout) override;
  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override;
  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks,
                                        const std::vector<SparseRef>& sparse) override;
  // A fault on kPushPull fails the whole call before the PS sees it (push
  // and pull with the same status).
  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override;
  absl::StatusOr<v1::SparsePullResponse> SparsePull(const v1::SparsePullRequest& request) override;
  absl::StatusOr<v1::ListRowsResponse> ListRows(const v1::ListRowsRequest& request) override;
  absl::Status Leave(const v1::LeaveRequest& request) override;
  absl::StatusOr<v1::ShardStats> Shutdown(const v1::ShutdownRequest& request) override;
  absl::StatusOr<v1::ShardStats> GetStats(const v1::InfoRequest& request) override;

 private:
  using Hook = std::function<absl::Status(int call)>;
  // Counts the call and runs the hooks of `rpc`.
  absl::Status Intercept(ShardRpc rpc);

  mutable absl::Mutex mu_;
  std::map<ShardRpc, int> calls_ ABSL_GUARDED_BY(mu_);
  std::map<ShardRpc, std::vector<Hook>> hooks_ ABSL_GUARDED_BY(mu_);
};

// Forwards every call; loses the answer of the first `n` PushPulls after the
// PS handled them (a connection that breaks on the way back): the caller
// sees UNAVAILABLE for both halves and cannot know the push was applied.
class LosesPushPullAnswers : public ShardChannelWrapper {
 public:
  LosesPushPullAnswers(std::unique_ptr<ShardChannel> target, int n)
      : ShardChannelWrapper(std::move(target)), left_(n) {}
  using ShardChannelWrapper::Push;
  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override;

 private:
  std::atomic<int> left_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_IN_PROCESS_SHARD_CHANNEL_H_
