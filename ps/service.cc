#include "ps/service.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/push_wire.h"
#include "ps/raw_push.h"
#include "ps/shard_wire.h"

namespace kubetrain {
namespace {

// gRPC releases a slice through a C callback; the slice keeps the snapshot alive.
void ReleaseSnapshot(void* holder) {
  delete static_cast<std::shared_ptr<const std::string>*>(holder);
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& msg) {
  std::string encoded = msg.SerializeAsString();
  grpc::Slice slice(std::move(encoded));
  return grpc::ByteBuffer(&slice, 1);
}

// Parses a request; consumes `raw`. INVALID_ARGUMENT naming the method and
// the message type if the bytes are not one.
template <typename T>
absl::Status Parse(const char* method, grpc::ByteBuffer* raw, T* out) {
  grpc::Status s = grpc::GenericDeserialize<grpc::ProtoBufferReader, T>(raw, out);
  if (s.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(method, ": malformed request: not a valid ", T::descriptor()->name(),
                   s.error_message().empty() ? "" : absl::StrCat(" (", s.error_message(), ")")));
}

// Answers a pull whose request was refused.
class RejectReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// The messages of a pull's answer, one at a time: the header, then the
// chunks of every part, as slices into the snapshot (zero copy).
class PsService::SnapshotWriter {
 public:
  SnapshotWriter(const PsService* service, Shard::Snapshot snapshot)
      : service_(service), snapshot_(std::move(snapshot)) {}

  // The next message; false once every one is out.
  bool Next(grpc::ByteBuffer* out) {
    if (!header_sent_) {
      header_sent_ = true;
      v1::PullResponse msg;
      *msg.mutable_header() = PullHeaderOf(snapshot_);
      *out = Serialize(msg);
      return true;
    }
    // Next chunk of the current part, or of the next non-empty part.
    const auto& parts = service_->shard_->parts();
    while (part_ < parts.size()) {
      uint64_t part_bytes = parts[part_].num_bytes();
      if (part_offset_ < part_bytes) {
        uint64_t n =
            std::min<uint64_t>(service_->options_.max_chunk_bytes, part_bytes - part_offset_);
        n -= n % 4;
        std::string prefix;
        AppendChunkPrefix(parts[part_].name, part_offset_ / 4, n, &prefix);
        const char* data = snapshot_.bytes->data() + base_ + part_offset_;
        grpc::Slice slices[2] = {
            grpc::Slice(prefix.data(), prefix.size()),
            grpc::Slice(const_cast<char*>(data), n, ReleaseSnapshot,
                        new std::shared_ptr<const std::string>(snapshot_.bytes))};
        *out = grpc::ByteBuffer(slices, 2);
        part_offset_ += n;
        if (service_->metrics_.pull_bytes) {
          service_->metrics_.pull_bytes->Increment(static_cast<double>(n));
        }
        return true;
      }
      base_ += part_bytes;
      part_offset_ = 0;
      ++part_;
    }
    return false;
  }

 private:
  const PsService* const service_;
  const Shard::Snapshot snapshot_;
  bool header_sent_ = false;
  size_t part_ = 0;
  uint64_t part_offset_ = 0;  // bytes into the current part
  uint64_t base_ = 0;         // bytes before the current part in the snapshot
};

// Holds a pull in the shard, then streams the header and the chunks.
class PsService::PullReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(PsService* service, grpc::CallbackServerContext* ctx, const v1::PullRequest& req,
              const TaskId& task)
      : service_(service), ctx_(ctx), shard_(service->shard_), start_(service->clock_->Now()) {
    absl::Duration wait = req.wait_timeout_ms() > 0 ? absl::Milliseconds(req.wait_timeout_ms())
                                                    : service->options_.default_pull_wait;
    uint64_t ticket = shard_->Pull(
        {task.index, req.min_version(), req.worker_clock(), req.incarnation(), task.role},
        start_ + wait, [this](absl::StatusOr<Shard::Snapshot> s) { OnSnapshot(std::move(s)); });
    absl::MutexLock l(&mu_);
    ticket_ = ticket;
  }

  void OnCancel() override {
    uint64_t ticket;
    {
      absl::MutexLock l(&mu_);
      ticket = ticket_;
    }
    if (ticket != 0) shard_->CancelPull(ticket);  // OnSnapshot(CANCELLED) finishes the call
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    NextWrite();
  }

  void OnDone() override { delete this; }

 private:
  void OnSnapshot(absl::StatusOr<Shard::Snapshot> snap) {
    if (!snap.ok()) {
      Finish(absl::IsInvalidArgument(snap.status()) ? service_->Refuse("Pull", ctx_, snap.status())
                                                    : ToGrpcStatus(snap.status()));
      return;
    }
    writer_.emplace(service_, std::move(*snap));
    NextWrite();
  }

  void NextWrite() {
    if (writer_->Next(&out_)) {
      StartWrite(&out_);
      return;
    }
    if (service_->metrics_.pull_seconds) {
      service_->metrics_.pull_seconds->Observe(
          absl::ToDoubleSeconds(service_->clock_->Now() - start_));
    }
    Finish(grpc::Status::OK);
  }

  PsService* const service_;
  grpc::CallbackServerContext* const ctx_;
  Shard* const shard_;
  const absl::Time start_;
  absl::Mutex mu_;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // Touched only by the write sequence, which gRPC serialises.
  std::optional<SnapshotWriter> writer_;
  grpc::ByteBuffer out_;
};

// Reassembles a pushed gradient message by message (ps/shard_wire.h),
// refusing anything malformed at once; applies it only on a clean half-close.
// Reads and the end of the push are serialised by mu_, so Tick can close an
// idle stream from its own thread (gRPC never runs a reaction inline in
// StartRead, StartWrite or Finish, so holding mu_ across them cannot
// deadlock).
//
// kFused (PushPull): the same push, then, instead of ending the call, the
// push's answer as the first message and the header's pull, as PullReactor
// serves it. The push's slots and buffers are freed once it is handled: a
// held pull counts as no push stream and is never closed as idle.
template <bool kFused>
class PsService::PushReactor final
    : public PsService::PushStream,
      public std::conditional_t<kFused, grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                                grpc::ServerReadReactor<grpc::ByteBuffer>> {
 public:
  // `resp`: the answer of a plain Push (null for kFused).
  PushReactor(PsService* service, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp)
      : service_(service),
        ctx_(ctx),
        resp_(resp),
        start_(service->clock_->Now()),
        last_active_(start_),
        assembler_(service->shard_) {
    service_->RegisterPush(this);  // before mu_: the lock order
    absl::MutexLock l(&mu_);
    // The caller first: a stream that may not push takes no slot and no read.
    absl::Status auth = service_->Authenticate(PsMethod::kPush, ctx_, &caller_);
    if (auth.ok()) auth = service_->Authorize(PsMethod::kPush, caller_, caller_);
    if (!auth.ok()) {
      EndLocked(service_->Refuse(kName, ctx_, auth));
      return;
    }
    admitted_ = service_->AdmitPush();
    if (!admitted_) {
      EndLocked(service_->Refuse(
          kName, ctx_,
          absl::ResourceExhaustedError(absl::StrCat("push: ", service_->max_push_streams_,
                                                    " push streams already open on this PS"))));
      return;
    }
    this->StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock l(&mu_);
    if (ended_) return;  // closed as idle while this read was outstanding
    if (!ok) {
      // The reads end both on the client's half-close and on a cancel (or a
      // broken connection); gRPC marks the context cancelled in the latter
      // case before this call.
      if (ctx_->IsCancelled()) {
        EndLocked(grpc::Status(grpc::StatusCode::CANCELLED,
                               "push cancelled before the client half-closed it: nothing applied"));
        return;
      }
      CompleteLocked();
      return;
    }
    last_active_ = service_->clock_->Now();
    ++messages_;
    absl::Status s;
    uint64_t data_bytes = 0;  // gradient bytes in the message
    bool sparse = false;
    if (!AddRawChunk(&in_, &assembler_, &s, &data_bytes)) {
      s = AddParsedLocked(&data_bytes, &sparse);
    }
    in_.Clear();  // the slices go back before the next read
    if (!s.ok()) {
      EndLocked(service_->Refuse(
          kName, ctx_,
          absl::Status(s.code(), absl::StrCat(s.message(), " (message ", messages_, ")"))));
      return;
    }
    if (service_->metrics_.push_bytes) {
      service_->metrics_.push_bytes->Increment(static_cast<double>(data_bytes));
    }
    if (service_->metrics_.sparse_push_bytes && sparse) {
      service_->metrics_.sparse_push_bytes->Increment(static_cast<double>(data_bytes));
    }
    this->StartRead(&in_);
  }

  // kFused: the push's answer is out, then each pull message.
  void OnWriteDone(bool ok) {
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    if (writer_.has_value()) {
      NextWrite();
      return;
    }
    StartPull();
  }

  // kFused: a cancel during the pull's hold lets go of it.
  void OnCancel() {
    uint64_t ticket;
    {
      absl::MutexLock l(&mu_);
      ticket = ticket_;
    }
    if (ticket != 0) service_->shard_->CancelPull(ticket);  // OnSnapshot finishes the call
  }

  void OnDone() override {
    service_->RemovePush(this);
    delete this;
  }

  // Tick: ends the call if no message came for `timeout`. REQUIRES: the
  // service's pushes_mu_ is held (so OnDone cannot run meanwhile).
  void ExpireIfIdle(absl::Time now, absl::Duration timeout) override {
    absl::MutexLock l(&mu_);
    if (ended_ || now - last_active_ < timeout) return;
    if (service_->metrics_.push_streams_refused)
      service_->metrics_.push_streams_refused->Increment();
    EndLocked(service_->Refuse(
        kName, ctx_,
        absl::UnavailableError(absl::StrCat("push: no message for ", absl::FormatDuration(timeout),
                                            ": stream closed, nothing applied"))));
  }

 private:
  static constexpr const char* kName = kFused ? "PushPull" : "Push";

  // Frees the push's slots and buffers (before the client hears the end, so
  // its next push never finds them taken); the push is over.
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ended_ = true;
    if (worker_ >= 0) service_->ReleaseWorker(worker_);
    worker_ = -1;
    if (admitted_) service_->ReleasePush();
    admitted_ = false;
    assembler_.Abandon();
  }

  void EndLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ReleaseLocked();
    if (!status.ok()) ++service_->abnormal_ends_;
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        service_->metrics_.push_streams_refused) {
      service_->metrics_.push_streams_refused->Increment();
    }
    this->Finish(status);
  }

  // A message that is not a plain chunk (the header, sparse rows, anything
  // malformed), through protobuf. Sets the gradient bytes it carried.
  absl::Status AddParsedLocked(uint64_t* data_bytes, bool* sparse)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::PushRequest msg;
    absl::Status s = Parse(kName, &in_, &msg);
    if (!s.ok()) service_->shard_->RecordRejectedPush();  // the assembler counts its own
    if (s.ok() && msg.has_header()) {
      s = service_->Authorize(PsMethod::kPush, caller_,
                              {TaskRole::kWorker, msg.header().worker_index()});
    }
    if (s.ok()) s = assembler_.Add(msg);
    if (s.ok() && msg.has_header()) {
      if (!service_->AdmitWorker(msg.header().worker_index())) {
        s = absl::ResourceExhaustedError(absl::StrCat(
            "push: worker ", msg.header().worker_index(), " already has ",
            service_->options_.max_push_streams_per_worker, " push streams open on this PS"));
      } else {
        worker_ = msg.header().worker_index();
        pusher_ = worker_;
        if (kFused) pull_ = msg.header().pull();
      }
    }
    *sparse = msg.has_sparse();
    *data_bytes = msg.has_chunk()    ? msg.chunk().data().size()
                  : msg.has_sparse() ? msg.sparse().data().size()
                                     : 0;
    return s;
  }

  void CompleteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto r = assembler_.Finish();
    if (!r.ok()) {
      EndLocked(absl::IsInvalidArgument(r.status()) ? service_->Refuse(kName, ctx_, r.status())
                                                    : ToGrpcStatus(r.status()));
      return;
    }
    v1::PushResponse resp = PushResponseOf(*r, service_->shard_->incarnation());
    if (service_->metrics_.push_seconds) {
      service_->metrics_.push_seconds->Observe(
          absl::ToDoubleSeconds(service_->clock_->Now() - start_));
    }
    if constexpr (kFused) {
      ReleaseLocked();
      v1::PullResponse msg;
      *msg.mutable_push() = std::move(resp);
      out_ = Serialize(msg);
      this->StartWrite(&out_);  // then OnWriteDone starts the pull
    } else {
      *resp_ = Serialize(resp);
      EndLocked(grpc::Status::OK);
    }
  }

  // kFused: after the push's answer went out (the write sequence; no lock
  // held, as the shard may answer at once, from this call).
  void StartPull() {
    int pusher;
    v1::PullRequest pull;
    {
      absl::MutexLock l(&mu_);
      pusher = pusher_;
      pull = pull_;
    }
    pull_start_ = service_->clock_->Now();
    const absl::Duration wait = pull.wait_timeout_ms() > 0
                                    ? absl::Milliseconds(pull.wait_timeout_ms())
                                    : service_->options_.default_pull_wait;
    const uint64_t ticket = service_->shard_->Pull(
        {pusher, pull.min_version(), pull.worker_clock(), pull.incarnation(), TaskRole::kWorker},
        pull_start_ + wait,
        [this](absl::StatusOr<Shard::Snapshot> s) { OnSnapshot(std::move(s)); });
    absl::MutexLock l(&mu_);
    ticket_ = ticket;
  }

  void OnSnapshot(absl::StatusOr<Shard::Snapshot> snap) {
    if (!snap.ok()) {
      this->Finish(absl::IsInvalidArgument(snap.status())
                       ? service_->Refuse(kName, ctx_, snap.status())
                       : ToGrpcStatus(snap.status()));
      return;
    }
    writer_.emplace(service_, std::move(*snap));
    NextWrite();
  }

  void NextWrite() {
    if (writer_->Next(&out_)) {
      this->StartWrite(&out_);
      return;
    }
    if (service_->metrics_.pull_seconds) {
      service_->metrics_.pull_seconds->Observe(
          absl::ToDoubleSeconds(service_->clock_->Now() - pull_start_));
    }
    this->Finish(grpc::Status::OK);
  }

  PsService* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const resp_;
  const absl::Time start_;
  absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // the push is over (the pull may go on)
  absl::Time last_active_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer in_ ABSL_GUARDED_BY(mu_);
  int64_t messages_ ABSL_GUARDED_BY(mu_) = 0;
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;  // counted in the PS's open streams
  int worker_ ABSL_GUARDED_BY(mu_) = -1;        // counted as this worker's stream
  int pusher_ ABSL_GUARDED_BY(mu_) = -1;        // the header's worker
  TaskId caller_ ABSL_GUARDED_BY(mu_);          // as authenticated (with a job key)
  PushAssembler assembler_ ABSL_GUARDED_BY(mu_);
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;   // kFused: the held pull
  v1::PullRequest pull_ ABSL_GUARDED_BY(mu_);  // kFused: the header's
  // kFused: touched only by the write sequence, which gRPC serialises.
  absl::Time pull_start_;
  std::optional<SnapshotWriter> writer_;
  grpc::ByteBuffer out_;
};

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // A refusal with no text leaves the worker's log saying nothing about which
  // limit or rule it hit (issue 26): every status the PS sends says something.
  if (s.message().empty()) {
    return grpc::Status(
        static_cast<grpc::StatusCode>(s.code()),
        absl::StrCat("ps: ", absl::StatusCodeToString(s.code()), " with no detail from the shard"));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void ConfigurePsServer(uint64_t max_chunk_bytes, grpc::ServerBuilder* builder) {
  // Both ends agree on the chunk size; leave headroom for the message framing.
  builder->SetMaxReceiveMessageSize(static_cast<int>(max_chunk_bytes + (64 << 10)));
  builder->SetMaxSendMessageSize(static_cast<int>(max_chunk_bytes + (64 << 10)));
  // Pings find a peer that is gone without a word (a killed or stopped pod,
  // a cut link): its streams end instead of holding the PS's resources.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Accept the workers' pings (every 20 s, worker/grpc_shard_channel.cc).
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
}

std::shared_ptr<grpc::ServerCredentials> PsServerCredentials(const TaskCredentials& creds) {
  if (!creds.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions tls(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  tls.pem_root_certs = creds.ca_cert_pem;
  tls.pem_key_cert_pairs.push_back({creds.key_pem, creds.cert_pem});
  return grpc::SslServerCredentials(tls);
}

PsService::PsService(Shard* shard, const Clock* clock, PsServiceOptions options,
                     PsServiceMetrics metrics)
    : shard_(shard),
      clock_(clock),
      options_(std::move(options)),
      metrics_(metrics),
      max_push_streams_(options_.max_push_streams > 0 ? options_.max_push_streams
                                                      : 2 * shard->options().num_workers + 16),
      worker_pushes_(new std::atomic<int>[std::max(1, shard->options().num_workers)]()) {}

void PsService::RegisterPush(PushStream* push) {
  absl::MutexLock l(&pushes_mu_);
  pushes_.insert(push);
}

void PsService::RemovePush(PushStream* push) {
  absl::MutexLock l(&pushes_mu_);
  pushes_.erase(push);
}

bool PsService::AdmitPush() {
  if (open_pushes_.fetch_add(1) >= max_push_streams_) {
    --open_pushes_;
    return false;
  }
  if (metrics_.push_streams) metrics_.push_streams->Increment();
  return true;
}

void PsService::ReleasePush() {
  --open_pushes_;
  if (metrics_.push_streams) metrics_.push_streams->Decrement();
}

bool PsService::AdmitWorker(int worker) {
  // The assembler has checked nothing about the index yet: the shard refuses
  // an unknown worker when the push completes; such streams are not counted.
  if (worker < 0 || worker >= shard_->options().num_workers) return true;
  if (worker_pushes_[worker].fetch_add(1) >= options_.max_push_streams_per_worker) {
    --worker_pushes_[worker];
    return false;
  }
  return true;
}

void PsService::ReleaseWorker(int worker) {
  if (worker >= 0 && worker < shard_->options().num_workers) --worker_pushes_[worker];
}

int64_t PsService::Tick(absl::Time now) {
  {
    absl::MutexLock l(&pushes_mu_);
    for (PushStream* push : pushes_) push->ExpireIfIdle(now, options_.push_idle_timeout);
  }
  return abnormal_ends_.exchange(0);
}

grpc::Status PsService::Refuse(const char* method, grpc::CallbackServerContext* ctx,
                               const absl::Status& s) {
  int64_t suppressed = 0;
  if (refused_log_.Allow(clock_->Now(), &suppressed)) {
    Log("ps:", shard_->options().shard_index, " refused ", method, " from ", ctx->peer(), ": ",
        s.message(),
        suppressed > 0 ? absl::StrCat(" (", suppressed, " refused requests not logged before)")
                       : std::string());
  }
  return ToGrpcStatus(s);
}

grpc::ServerUnaryReactor* PsService::Answer(const char* method, grpc::CallbackServerContext* ctx,
                                            const absl::Status& status,
                                            const google::protobuf::Message& resp,
                                            grpc::ByteBuffer* out) {
  auto* reactor = ctx->DefaultReactor();
  if (status.ok()) {
    *out = Serialize(resp);
    reactor->Finish(grpc::Status::OK);
  } else {
    reactor->Finish(Refuse(method, ctx, status));
  }
  return reactor;
}

absl::Status PsService::Authenticate(PsMethod method, grpc::CallbackServerContext* ctx,
                                     TaskId* caller) {
  if (options_.job_key.empty()) return absl::OkStatus();
  const auto& metadata = ctx->client_metadata();
  auto value = [&metadata](const char* key) -> std::optional<absl::string_view> {
    auto it = metadata.find(key);
    if (it == metadata.end()) return std::nullopt;
    return absl::string_view(it->second.data(), it->second.size());
  };
  absl::StatusOr<TaskId> task = AuthenticateCaller(
      method, options_.job_key, value(kTaskMetadataKey), value(kAuthorizationMetadataKey));
  if (!task.ok()) {
    if (metrics_.auth_unauthenticated) metrics_.auth_unauthenticated->Increment();
    return task.status();
  }
  *caller = *task;
  return absl::OkStatus();
}

absl::Status PsService::Authorize(PsMethod method, const TaskId& caller, const TaskId& named) {
  if (options_.job_key.empty()) return absl::OkStatus();
  absl::Status s = AuthorizeCall(method, caller, named, ChiefTask(shard_->options()));
  if (!s.ok() && metrics_.auth_permission_denied) metrics_.auth_permission_denied->Increment();
  return s;
}

template <typename Request>
absl::Status PsService::Admit(PsMethod method, grpc::CallbackServerContext* ctx,
                              const grpc::ByteBuffer* raw, Request* req) {
  TaskId caller;
  if (absl::Status s = Authenticate(method, ctx, &caller); !s.ok()) return s;
  grpc::ByteBuffer copy(*raw);  // shares the slices; parsing consumes the buffer
  if (absl::Status s = Parse(PsMethodName(method), &copy, req); !s.ok()) return s;
  absl::StatusOr<TaskId> named = TaskFromWire(req->task_type(), req->worker_index());
  if (!named.ok()) return named.status();
  return Authorize(method, caller, *named);
}

grpc::ServerUnaryReactor* PsService::GetInfo(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* raw, grpc::ByteBuffer* out) {
  v1::InfoRequest req;
  v1::ShardInfo resp;
  absl::Status s = Admit(PsMethod::kGetInfo, ctx, raw, &req);
  if (s.ok())
    s = FillShardInfo(shard_, options_.model_fingerprint, options_.max_chunk_bytes, req, &resp);
  resp.set_bulk_port(options_.bulk_port);
  return Answer("GetInfo", ctx, s, resp, out);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PsService::Pull(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* raw) {
  v1::PullRequest req;
  absl::Status s = Admit(PsMethod::kPull, ctx, raw, &req);
  absl::StatusOr<TaskId> task = s.ok() ? TaskFromWire(req.task_type(), req.worker_index()) : s;
  if (!task.ok()) return new RejectReactor(Refuse("Pull", ctx, task.status()));
  return new PullReactor(this, ctx, req, *task);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* PsService::Push(grpc::CallbackServerContext* ctx,
                                                           grpc::ByteBuffer* resp) {
  return new PushReactor<false>(this, ctx, resp);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PsService::PushPull(
    grpc::CallbackServerContext* ctx) {
  return new PushReactor<true>(this, ctx, nullptr);
}

grpc::ServerUnaryReactor* PsService::Leave(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* raw, grpc::ByteBuffer* out) {
  v1::LeaveRequest req;
  absl::Status s = Admit(PsMethod::kLeave, ctx, raw, &req);
  absl::StatusOr<TaskId> task = s.ok() ? TaskFromWire(req.task_type(), req.worker_index()) : s;
  s = task.ok() ? shard_->Leave(*task) : task.status();
  return Answer("Leave", ctx, s, v1::LeaveResponse(), out);
}

grpc::ServerUnaryReactor* PsService::SparsePull(grpc::CallbackServerContext* ctx,
                                                const grpc::ByteBuffer* raw,
                                                grpc::ByteBuffer* out) {
  v1::SparsePullRequest req;
  v1::SparsePullResponse resp;
  absl::Status s = Admit(PsMethod::kSparsePull, ctx, raw, &req);
  if (s.ok()) s = ServeSparsePull(shard_, req, &resp);
  if (s.ok() && metrics_.sparse_pull_bytes) {
    double bytes = 0;
    for (const auto& t : resp.tables()) bytes += static_cast<double>(t.data().size());
    metrics_.sparse_pull_bytes->Increment(bytes);
  }
  return Answer("SparsePull", ctx, s, resp, out);
}

grpc::ServerUnaryReactor* PsService::ListRows(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* raw, grpc::ByteBuffer* out) {
  v1::ListRowsRequest req;
  v1::ListRowsResponse resp;
  absl::Status s = Admit(PsMethod::kListRows, ctx, raw, &req);
  if (s.ok()) s = ServeListRows(shard_, req, options_.max_chunk_bytes, &resp);
  if (s.ok() && metrics_.sparse_pull_bytes) {
    metrics_.sparse_pull_bytes->Increment(static_cast<double>(resp.rows().data().size()));
  }
  return Answer("ListRows", ctx, s, resp, out);
}

grpc::ServerUnaryReactor* PsService::Shutdown(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* raw, grpc::ByteBuffer* out) {
  v1::ShutdownRequest req;
  v1::ShardStats resp;
  absl::Status s = Admit(PsMethod::kShutdown, ctx, raw, &req);
  absl::StatusOr<TaskId> task = s.ok() ? TaskFromWire(req.task_type(), req.worker_index()) : s;
  s = task.ok() ? shard_->RequestShutdown(*task) : task.status();
  if (s.ok()) FillShardStats(shard_->stats(), &resp);
  return Answer("Shutdown", ctx, s, resp, out);
}

grpc::ServerUnaryReactor* PsService::GetStats(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* raw, grpc::ByteBuffer* out) {
  v1::InfoRequest req;
  v1::ShardStats resp;
  absl::Status s = Admit(PsMethod::kGetStats, ctx, raw, &req);
  if (s.ok()) FillShardStats(shard_->stats(), &resp);
  return Answer("GetStats", ctx, s, resp, out);
}

}  // namespace kubetrain
