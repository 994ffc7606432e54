#include "worker/ps_client.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "proto/ps.grpc.pb.h"

namespace kubetrain {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

class GrpcShardChannel final : public ShardChannel {
 public:
  GrpcShardChannel(const std::string& address, int64_t chunk_bytes) : address_(address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(chunk_bytes + (64 << 10)));
    args.SetMaxSendMessageSize(static_cast<int>(chunk_bytes + (64 << 10)));
    // Reconnect quickly after a PS restart instead of gRPC's default 1..120 s backoff.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }

  absl::StatusOr<v1::ShardInfo> GetInfo(int worker, absl::Duration timeout) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    // Wait for the channel to connect (until the deadline) rather than failing
    // fast: a PS that is still starting is the normal case here.
    ctx.set_wait_for_ready(true);
    v1::InfoRequest req;
    req.set_worker_index(worker);
    v1::ShardInfo info;
    auto s = stub_->GetInfo(&ctx, req, &info);
    if (!s.ok()) return Annotate(s);
    return info;
  }

  absl::StatusOr<v1::PullResponse::Header> Pull(
      const v1::PullRequest& request,
      const std::function<absl::Status(const v1::TensorChunk&)>& sink) override {
    grpc::ClientContext ctx;
    // The PS answers a held pull by its wait timeout; allow for the transfer on top.
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(request.wait_timeout_ms() + 60000));
    auto reader = stub_->Pull(&ctx, request);
    v1::PullResponse msg;
    v1::PullResponse::Header header;
    bool have_header = false;
    absl::Status sink_status;
    while (reader->Read(&msg)) {
      if (msg.has_header()) {
        header = msg.header();
        have_header = true;
      } else if (sink_status.ok()) {
        sink_status = sink(msg.chunk());
        if (!sink_status.ok()) ctx.TryCancel();
      }
    }
    auto s = reader->Finish();
    if (!sink_status.ok()) return sink_status;
    if (!s.ok()) return Annotate(s);
    if (!have_header) return absl::DataLossError(absl::StrCat("pull from ", address_, ": no header"));
    return header;
  }

  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::PushResponse resp;
    auto writer = stub_->Push(&ctx, &resp);
    v1::PushRequest msg;
    *msg.mutable_header() = header;
    bool ok = writer->Write(msg);
    for (size_t i = 0; ok && i < chunks.size(); ++i) {
      msg.Clear();
      auto* c = msg.mutable_chunk();
      c->set_part(*chunks[i].part);
      c->set_offset(chunks[i].offset);
      c->set_data(reinterpret_cast<const char*>(chunks[i].data), chunks[i].count * sizeof(float));
      ok = writer->Write(msg);
    }
    if (ok) writer->WritesDone();
    auto s = writer->Finish();
    if (!s.ok()) return Annotate(s);
    return resp;
  }

  absl::Status Leave(int worker) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::LeaveRequest req;
    req.set_worker_index(worker);
    v1::LeaveResponse resp;
    return Annotate(stub_->Leave(&ctx, req, &resp));
  }

  absl::StatusOr<v1::ShardStats> Shutdown(int worker) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ShutdownRequest req;
    req.set_worker_index(worker);
    v1::ShardStats stats;
    auto s = stub_->Shutdown(&ctx, req, &stats);
    if (!s.ok()) return Annotate(s);
    return stats;
  }

 private:
  absl::Status Annotate(const grpc::Status& s) {
    absl::Status st = FromGrpc(s);
    if (st.ok()) return st;
    return absl::Status(st.code(), absl::StrCat("ps at ", address_, ": ", st.message()));
  }
  std::string address_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

}  // namespace

std::unique_ptr<ShardChannel> NewGrpcShardChannel(const std::string& address, int64_t chunk_bytes) {
  return std::make_unique<GrpcShardChannel>(address, chunk_bytes);
}

PsClient::PsClient(Options options, const Placement* placement, const Clock* clock,
                   std::vector<std::unique_ptr<ShardChannel>> channels, PsClientMetrics metrics)
    : options_(std::move(options)), placement_(placement), clock_(clock),
      channels_(std::move(channels)), metrics_(metrics), shards_(channels_.size()) {}

absl::Status PsClient::ForEachShard(const std::function<absl::Status(int)>& fn) {
  const int n = static_cast<int>(channels_.size());
  if (n == 1) return fn(0);
  std::vector<std::future<absl::Status>> results;
  for (int s = 1; s < n; ++s) results.push_back(std::async(std::launch::async, fn, s));
  absl::Status first = fn(0);
  for (auto& r : results) {
    absl::Status st = r.get();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

absl::Status PsClient::WithRetry(const std::string& what, int shard,
                                 const std::function<absl::Status()>& fn) {
  absl::Time deadline = clock_->Now() + options_.retry_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  int attempts = 0;
  while (true) {
    absl::Status s = fn();
    if (s.code() != absl::StatusCode::kUnavailable) return s;
    ++attempts;
    if (clock_->Now() + backoff > deadline) {
      return absl::UnavailableError(absl::StrCat("gave up on ", what, " to ps:", shard, " after ",
                                                 attempts, " attempts over ",
                                                 absl::FormatDuration(options_.retry_timeout),
                                                 ": ", s.message()));
    }
    if (attempts == 1 || attempts % 10 == 0) {
      Log("worker:", options_.worker_index, " ", what, " to ps:", shard, " unavailable (",
          s.message(), "); retrying");
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

absl::Status PsClient::Connect() {
  if (static_cast<int>(channels_.size()) != placement_->num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(channels_.size(), " PS addresses for ",
                                                   placement_->num_shards, " shards"));
  }
  std::vector<int64_t> clocks(channels_.size(), 0);
  absl::Status st = ForEachShard([&](int s) {
    absl::StatusOr<v1::ShardInfo> info;
    absl::Status st = WithRetry("connect", s, [&] {
      info = channels_[s]->GetInfo(options_.worker_index, absl::Seconds(5));
      // A deadline on the handshake means "not there yet" too.
      if (info.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::UnavailableError(info.status().message());
      }
      return info.status();
    });
    if (!st.ok()) return st;
    if (info->model_fingerprint() != options_.fingerprint || info->shard_index() != s) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ps:", s, " holds model/placement ", info->model_fingerprint(), " as shard ",
          info->shard_index(), ", this worker expects ", options_.fingerprint,
          ": the tasks were started with different TrainingJob specs"));
    }
    shards_[s].incarnation = info->incarnation();
    shards_[s].version = info->version();
    clocks[s] = info->worker_clock();
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  resume_clock_ = *std::max_element(clocks.begin(), clocks.end());
  return absl::OkStatus();
}

absl::StatusOr<PsClient::PullResult> PsClient::Pull(bool next_version, int64_t worker_clock,
                                                    const std::vector<VariableSpec>& variables,
                                                    Params* params) {
  return PullImpl([&](int s) { return next_version ? shards_[s].version + 1 : 0; }, worker_clock,
                  variables, params);
}

absl::StatusOr<PsClient::PullResult> PsClient::PullAtLeast(int64_t version, int64_t worker_clock,
                                                           const std::vector<VariableSpec>& variables,
                                                           Params* params) {
  return PullImpl([version](int) { return version; }, worker_clock, variables, params);
}

absl::StatusOr<PsClient::PullResult> PsClient::PullImpl(
    const std::function<int64_t(int)>& min_version, int64_t worker_clock,
    const std::vector<VariableSpec>& variables, Params* params) {
  params->resize(variables.size());
  for (size_t v = 0; v < variables.size(); ++v) {
    (*params)[v].resize(variables[v].num_elements());
  }
  std::vector<v1::PullResponse::Header> headers(channels_.size());
  std::vector<int64_t> lost(channels_.size(), 0);
  absl::Time start = clock_->Now();
  absl::Status st = ForEachShard([&](int s) {
    std::map<std::string, const PartPlacement*> parts;
    for (const auto* p : placement_->PartsOfShard(s)) parts[p->name] = p;
    v1::PullRequest req;
    req.set_worker_index(options_.worker_index);
    req.set_min_version(min_version(s));
    req.set_worker_clock(worker_clock);
    req.set_incarnation(shards_[s].incarnation);
    req.set_wait_timeout_ms(absl::ToInt64Milliseconds(options_.hold_timeout));
    auto sink = [&](const v1::TensorChunk& c) -> absl::Status {
      auto it = parts.find(c.part());
      uint64_t n = c.data().size() / 4;
      if (it == parts.end() || c.data().size() % 4 != 0 ||
          c.offset() + n > static_cast<uint64_t>(it->second->num_elements())) {
        return absl::DataLossError(absl::StrCat("ps:", s, " sent a bad chunk of \"", c.part(), "\""));
      }
      float* dst = (*params)[it->second->variable].data() + it->second->element_offset() + c.offset();
      std::memcpy(dst, c.data().data(), c.data().size());
      if (metrics_.pull_bytes) metrics_.pull_bytes->Increment(static_cast<double>(c.data().size()));
      return absl::OkStatus();
    };
    while (true) {
      absl::StatusOr<v1::PullResponse::Header> h;
      absl::Status rs = WithRetry("pull", s, [&] {
        h = channels_[s]->Pull(req, sink);
        return h.status();
      });
      if (rs.code() == absl::StatusCode::kDeadlineExceeded) {
        Log("worker:", options_.worker_index, " still waiting on ps:", s, " for version ",
            req.min_version(), " (", rs.message(), ")");
        continue;  // the PS let go of a long hold; ask again
      }
      if (!rs.ok()) return rs;
      headers[s] = *h;
      ShardState& state = shards_[s];
      if (state.incarnation != 0 && h->incarnation() != state.incarnation) {
        lost[s] = std::max<int64_t>(0, state.version - h->version());
        Log("worker:", options_.worker_index, " ps:", s, " restarted: now at version ",
            h->version(), ", was ", state.version, " (", lost[s], " steps lost)");
      }
      state.incarnation = h->incarnation();
      state.version = h->version();
      state.done = h->done();
      return absl::OkStatus();
    }
  });
  if (!st.ok()) return st;
  if (metrics_.pull_seconds) metrics_.pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  PullResult r;
  r.version = headers[0].version();
  r.done = true;
  for (size_t s = 0; s < headers.size(); ++s) {
    r.version = std::min<int64_t>(r.version, headers[s].version());
    r.done = r.done && headers[s].done();
    r.waited_seconds = std::max(r.waited_seconds, headers[s].waited_seconds());
    r.steps_lost += lost[s];
  }
  return r;
}

absl::StatusOr<PsClient::PushResult> PsClient::Push(const Params& grads, int64_t worker_clock) {
  std::vector<v1::PushResponse> responses(channels_.size());
  absl::Time start = clock_->Now();
  const uint64_t chunk_elems = std::max<int64_t>(1, options_.chunk_bytes / 4);
  absl::Status st = ForEachShard([&](int s) {
    std::vector<ChunkRef> chunks;
    uint64_t bytes = 0;
    for (const auto* p : placement_->PartsOfShard(s)) {
      const float* base = grads[p->variable].data() + p->element_offset();
      const uint64_t n = p->num_elements();
      for (uint64_t off = 0; off < n; off += chunk_elems) {
        chunks.push_back({&p->name, off, base + off, std::min(chunk_elems, n - off)});
      }
      bytes += n * 4;
    }
    v1::PushRequest::Header h;
    h.set_worker_index(options_.worker_index);
    h.set_version(shards_[s].version);
    h.set_worker_clock(worker_clock);
    h.set_incarnation(shards_[s].incarnation);
    absl::StatusOr<v1::PushResponse> r;
    absl::Status rs = WithRetry("push", s, [&] {
      r = channels_[s]->Push(h, chunks);
      return r.status();
    });
    if (!rs.ok()) return rs;
    responses[s] = *r;
    if (metrics_.push_bytes) metrics_.push_bytes->Increment(static_cast<double>(bytes));
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  if (metrics_.push_seconds) metrics_.push_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  PushResult r;
  r.version = responses[0].version();
  for (const auto& resp : responses) {
    r.version = std::min<int64_t>(r.version, resp.version());
    r.dropped = r.dropped || resp.dropped();
    r.done = r.done || resp.done();
    r.staleness = std::max<int64_t>(r.staleness, resp.staleness());
  }
  return r;
}

absl::Status PsClient::Leave() {
  return ForEachShard([this](int s) { return channels_[s]->Leave(options_.worker_index); });
}

absl::StatusOr<v1::ShardStats> PsClient::Shutdown() {
  std::vector<v1::ShardStats> stats(channels_.size());
  absl::Status st = ForEachShard([&](int s) {
    auto r = channels_[s]->Shutdown(options_.worker_index);
    if (!r.ok()) return r.status();
    stats[s] = *r;
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  v1::ShardStats total;
  total.set_version(stats[0].version());
  for (const auto& s : stats) {
    total.set_version(std::min(total.version(), s.version()));
    total.set_gradients_applied(total.gradients_applied() + s.gradients_applied());
    total.set_stale_gradients_dropped(total.stale_gradients_dropped() + s.stale_gradients_dropped());
    total.set_pushes_rejected(total.pushes_rejected() + s.pushes_rejected());
    total.set_staleness_sum(total.staleness_sum() + s.staleness_sum());
    total.set_staleness_max(std::max(total.staleness_max(), s.staleness_max()));
    total.set_barrier_timeouts(total.barrier_timeouts() + s.barrier_timeouts());
    total.set_restored_version(std::max(total.restored_version(), s.restored_version()));
  }
  return total;
}

}  // namespace kubetrain
