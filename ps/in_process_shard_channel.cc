#include "ps/in_process_shard_channel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "ps/shard_wire.h"

namespace kubetrain {

class InProcessPs::Channel final : public ShardChannel {
 public:
  Channel(InProcessPs* ps, uint64_t max_chunk_bytes)
      : ps_(ps), max_chunk_bytes_(std::max<uint64_t>(4, max_chunk_bytes - max_chunk_bytes % 4)) {}
  using ShardChannel::Push;

  absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request, absl::Duration) override {
    v1::ShardInfo info;
    if (absl::Status s = FillShardInfo(ps_->shard().get(), ps_->config_.fingerprint,
                                       max_chunk_bytes_, request, &info);
        !s.ok()) {
      return s;
    }
    return info;
  }

  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override {
    auto task = TaskFromWire(request.task_type(), request.worker_index());
    if (!task.ok()) return task.status();
    const absl::Duration wait = request.wait_timeout_ms() > 0
                                    ? absl::Milliseconds(request.wait_timeout_ms())
                                    : absl::Seconds(60);
    absl::Notification served;
    absl::StatusOr<Shard::Snapshot> result;
    std::shared_ptr<Shard> shard;
    const uint64_t ticket = ps_->StartPull(
        {task->index, request.min_version(), request.worker_clock(), request.incarnation(),
         task->role},
        ps_->clock_->Now() + wait,
        [&](absl::StatusOr<Shard::Snapshot> s) {
          result = std::move(s);
          served.Notify();
        },
        &shard);
    served.WaitForNotification();
    ps_->EndPull(ticket);
    if (absl::IsCancelled(result.status())) {
      return absl::UnavailableError(
          absl::StrCat("ps:", shard->options().shard_index, " restarted"));
    }
    if (!result.ok()) return result.status();
    if (absl::Status s = ForEachPulledChunk(
            *shard, *result, max_chunk_bytes_,
            [&sink](const std::string& part, uint64_t offset, const char* data, uint64_t bytes) {
              return sink(FlatPulledChunk(part, offset, data, bytes));
            });
        !s.ok()) {
      return s;
    }
    return PullHeaderOf(*result);
  }

  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks,
                                        const std::vector<SparseRef>& sparse) override {
    std::shared_ptr<Shard> shard = ps_->shard();
    PushAssembler assembler(shard.get());
    if (absl::Status s = assembler.SetHeader(header); !s.ok()) return s;
    for (const ChunkRef& c : chunks) {
      if (absl::Status s = AwaitRef(c); !s.ok()) return s;
      absl::string_view data(reinterpret_cast<const char*>(c.data), c.count * sizeof(float));
      if (absl::Status s = assembler.AddChunk(*c.part, c.offset, data); !s.ok()) return s;
    }
    for (const SparseRef& r : sparse) {
      if (absl::Status s = AwaitRef(r); !s.ok()) return s;
      absl::string_view data(reinterpret_cast<const char*>(r.data), r.count * r.dim * 4);
      if (absl::Status s = assembler.AddSparse(*r.table, r.ids, r.count, data); !s.ok()) return s;
    }
    auto r = assembler.Finish();
    if (!r.ok()) return r.status();
    if (ps_->shard() != shard) {
      return absl::UnavailableError(
          absl::StrCat("ps:", shard->options().shard_index, " restarted during the push"));
    }
    return PushResponseOf(*r, shard->incarnation());
  }

  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override {
    PushPullAnswer answer{Push(header, chunks, sparse), absl::UnknownError("")};
    if (!answer.push.ok()) {
      answer.pull = answer.push.status();
      return answer;
    }
    v1::PullRequest request = pull;
    request.set_worker_index(header.worker_index());
    request.set_task_type(v1::TASK_TYPE_WORKER);
    answer.pull = Pull(request, sink);
    return answer;
  }

  absl::StatusOr<v1::SparsePullResponse> SparsePull(const v1::SparsePullRequest& request) override {
    v1::SparsePullResponse response;
    if (absl::Status s = ServeSparsePull(ps_->shard().get(), request, &response); !s.ok()) {
      return s;
    }
    return response;
  }

  absl::StatusOr<v1::ListRowsResponse> ListRows(const v1::ListRowsRequest& request) override {
    v1::ListRowsResponse response;
    if (absl::Status s = ServeListRows(ps_->shard().get(), request, max_chunk_bytes_, &response);
        !s.ok()) {
      return s;
    }
    return response;
  }

  absl::Status Leave(const v1::LeaveRequest& request) override {
    std::shared_ptr<Shard> shard = ps_->shard();
    auto task = TaskFromWire(request.task_type(), request.worker_index());
    if (!task.ok()) return task.status();
    return shard->Leave(*task);
  }

  absl::StatusOr<v1::ShardStats> Shutdown(const v1::ShutdownRequest& request) override {
    std::shared_ptr<Shard> shard = ps_->shard();
    auto task = TaskFromWire(request.task_type(), request.worker_index());
    if (!task.ok()) return task.status();
    if (absl::Status allowed = shard->RequestShutdown(*task); !allowed.ok()) return allowed;
    v1::ShardStats stats;
    FillShardStats(shard->stats(), &stats);
    return stats;
  }

  absl::StatusOr<v1::ShardStats> GetStats(const v1::InfoRequest&) override {
    v1::ShardStats stats;
    FillShardStats(ps_->shard()->stats(), &stats);
    return stats;
  }

 private:
  InProcessPs* const ps_;
  const uint64_t max_chunk_bytes_;
};

absl::StatusOr<std::unique_ptr<InProcessPs>> InProcessPs::Create(const TaskConfig& config,
                                                                 int shard_index,
                                                                 const Clock* clock,
                                                                 int64_t incarnation) {
  if (shard_index < 0 || shard_index >= config.placement.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("no PS task ", shard_index, " (the job has ",
                                                   config.placement.num_shards, ")"));
  }
  ShardOptions options = ShardOptions::ForTask(config, incarnation);
  options.shard_index = shard_index;
  std::unique_ptr<InProcessPs> ps(new InProcessPs(config, options, clock));
  auto shard = Shard::Create(options, *config.model, config.placement,
                             config.job.training.optimizer, clock, ShardMetrics{});
  if (!shard.ok()) return shard.status();
  absl::MutexLock l(&ps->mu_);
  ps->shard_ = std::move(*shard);
  return ps;
}

std::unique_ptr<InProcessPs> InProcessPs::Over(const TaskConfig& config,
                                               std::shared_ptr<Shard> shard, const Clock* clock) {
  std::unique_ptr<InProcessPs> ps(new InProcessPs(config, shard->options(), clock));
  absl::MutexLock l(&ps->mu_);
  ps->shard_ = std::move(shard);
  return ps;
}

InProcessPs::InProcessPs(const TaskConfig& config, ShardOptions options, const Clock* clock)
    : config_(config), base_options_(std::move(options)), clock_(clock) {}

std::shared_ptr<Shard> InProcessPs::shard() const {
  absl::MutexLock l(&mu_);
  return shard_;
}

int InProcessPs::restarts() const {
  absl::MutexLock l(&mu_);
  return restarts_;
}

absl::Status InProcessPs::Restart(std::optional<ShardCheckpoint> from) {
  ShardOptions options = base_options_;
  {
    absl::MutexLock l(&mu_);
    options.incarnation = shard_->incarnation() + 1;
  }
  auto fresh = Shard::Create(options, *config_.model, config_.placement,
                             config_.job.training.optimizer, clock_, ShardMetrics{});
  if (!fresh.ok()) return fresh.status();
  if (from.has_value()) {
    if (absl::Status s = (*fresh)->Restore(std::move(*from)); !s.ok()) return s;
  }
  std::shared_ptr<Shard> old;
  std::map<uint64_t, TaskRole> held;
  {
    absl::MutexLock l(&mu_);
    old = std::move(shard_);
    shard_ = std::move(*fresh);
    ++restarts_;
    held.swap(pulls_in_flight_);
  }
  for (const auto& [ticket, role] : held) old->CancelPull(ticket);  // their callers see UNAVAILABLE
  return absl::OkStatus();
}

int InProcessPs::held_pulls(std::optional<TaskRole> role) const {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& [ticket, r] : pulls_in_flight_) n += !role.has_value() || r == *role;
  return n;
}

void InProcessPs::Tick() { shard()->Tick(clock_->Now()); }

std::unique_ptr<ShardChannel> InProcessPs::NewChannel(uint64_t max_chunk_bytes) {
  return std::make_unique<Channel>(this, max_chunk_bytes);
}

uint64_t InProcessPs::StartPull(const Shard::PullWait& wait, absl::Time deadline,
                                Shard::PullCallback done, std::shared_ptr<Shard>* shard) {
  // Under mu_, so a restart either comes first (the pull goes to the new
  // shard) or sees the ticket (and fails the pull).
  absl::MutexLock l(&mu_);
  *shard = shard_;
  const uint64_t ticket = shard_->Pull(wait, deadline, std::move(done));
  if (ticket != 0) pulls_in_flight_[ticket] = wait.role;
  return ticket;
}

void InProcessPs::EndPull(uint64_t ticket) {
  if (ticket == 0) return;
  absl::MutexLock l(&mu_);
  pulls_in_flight_.erase(ticket);
}

void FaultyShardChannel::FailNext(ShardRpc rpc, int n, absl::Status status) {
  absl::MutexLock l(&mu_);
  const int first = calls_[rpc] + 1;
  hooks_[rpc].push_back([first, n, status](int call) {
    return call >= first && (n < 0 || call < first + n) ? status : absl::OkStatus();
  });
}

void FaultyShardChannel::DropNext(ShardRpc rpc, int n) {
  FailNext(rpc, n, absl::UnavailableError("dropped by the test's FaultyShardChannel"));
}

void FaultyShardChannel::Delay(ShardRpc rpc, absl::Duration delay) {
  Before(rpc, [delay](int) {
    absl::SleepFor(delay);
    return absl::OkStatus();
  });
}

void FaultyShardChannel::RestartBefore(ShardRpc rpc, int nth, InProcessPs* ps,
                                       std::optional<ShardCheckpoint> from) {
  absl::MutexLock l(&mu_);
  const int target = calls_[rpc] + nth;
  hooks_[rpc].push_back([target, ps, from](int call) {
    return call == target ? ps->Restart(from) : absl::OkStatus();
  });
}

void FaultyShardChannel::Before(ShardRpc rpc, std::function<absl::Status(int call)> hook) {
  absl::MutexLock l(&mu_);
  hooks_[rpc].push_back(std::move(hook));
}

int FaultyShardChannel::calls(ShardRpc rpc) const {
  absl::MutexLock l(&mu_);
  auto it = calls_.find(rpc);
  return it == calls_.end() ? 0 : it->second;
}

absl::Status FaultyShardChannel::Intercept(ShardRpc rpc) {
  int call;
  std::vector<Hook> hooks;
  {
    absl::MutexLock l(&mu_);
    call = ++calls_[rpc];
    hooks = hooks_[rpc];
  }
  for (const Hook& hook : hooks) {
    if (absl::Status s = hook(call); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardInfo> FaultyShardChannel::GetInfo(const v1::InfoRequest& request,
                                                          absl::Duration timeout) {
  if (absl::Status s = Intercept(ShardRpc::kGetInfo); !s.ok()) return s;
  return ShardChannelWrapper::GetInfo(request, timeout);
}

absl::StatusOr<v1::PullResponse::Header> FaultyShardChannel::Pull(const v1::PullRequest& request,
                                                                  const ChunkSink& sink) {
  if (absl::Status s = Intercept(ShardRpc::kPull); !s.ok()) return s;
  return ShardChannelWrapper::Pull(request, sink);
}

absl::StatusOr<v1::PushResponse> FaultyShardChannel::Push(const v1::PushRequest::Header& header,
                                                          const std::vector<ChunkRef>& chunks,
                                                          const std::vector<SparseRef>& sparse) {
  if (absl::Status s = Intercept(ShardRpc::kPush); !s.ok()) return s;
  return ShardChannelWrapper::Push(header, chunks, sparse);
}

PushPullAnswer FaultyShardChannel::PushPull(const v1::PushRequest::Header& header,
                                            const std::vector<ChunkRef>& chunks,
                                            const std::vector<SparseRef>& sparse,
                                            const v1::PullRequest& pull, const ChunkSink& sink) {
  if (absl::Status s = Intercept(ShardRpc::kPushPull); !s.ok()) return {s, s};
  return ShardChannelWrapper::PushPull(header, chunks, sparse, pull, sink);
}

absl::StatusOr<v1::SparsePullResponse> FaultyShardChannel::SparsePull(
    const v1::SparsePullRequest& request) {
  if (absl::Status s = Intercept(ShardRpc::kSparsePull); !s.ok()) return s;
  return ShardChannelWrapper::SparsePull(request);
}

absl::StatusOr<v1::ListRowsResponse> FaultyShardChannel::ListRows(
    const v1::ListRowsRequest& request) {
  if (absl::Status s = Intercept(ShardRpc::kListRows); !s.ok()) return s;
  return ShardChannelWrapper::ListRows(request);
}

absl::Status FaultyShardChannel::Leave(const v1::LeaveRequest& request) {
  if (absl::Status s = Intercept(ShardRpc::kLeave); !s.ok()) return s;
  return ShardChannelWrapper::Leave(request);
}

absl::StatusOr<v1::ShardStats> FaultyShardChannel::Shutdown(const v1::ShutdownRequest& request) {
  if (absl::Status s = Intercept(ShardRpc::kShutdown); !s.ok()) return s;
  return ShardChannelWrapper::Shutdown(request);
}

absl::StatusOr<v1::ShardStats> FaultyShardChannel::GetStats(const v1::InfoRequest& request) {
  if (absl::Status s = Intercept(ShardRpc::kGetStats); !s.ok()) return s;
  return ShardChannelWrapper::GetStats(request);
}

PushPullAnswer LosesPushPullAnswers::PushPull(const v1::PushRequest::Header& header,
                                              const std::vector<ChunkRef>& chunks,
                                              const std::vector<SparseRef>& sparse,
                                              const v1::PullRequest& pull, const ChunkSink& sink) {
  PushPullAnswer answer = ShardChannelWrapper::PushPull(header, chunks, sparse, pull, sink);
  if (left_.fetch_sub(1) <= 0) return answer;
  const absl::Status lost = absl::UnavailableError("the answer was lost");
  return {lost, lost};
}

}  // namespace kubetrain
