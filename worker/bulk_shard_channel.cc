#include "worker/bulk_shard_channel.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/log.h"
#include "proto/bulk_wire.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

constexpr absl::Duration kConnectTimeout = absl::Seconds(2);
// The TLS handshake and the hello, after the connect (a busy PS answers late).
constexpr absl::Duration kHelloTimeout = absl::Seconds(5);
// After a failed connection, calls go through gRPC this long before the data
// plane is tried again (doubling up to kMaxRetryAfter).
constexpr absl::Duration kRetryAfter = absl::Seconds(5);
constexpr absl::Duration kMaxRetryAfter = absl::Seconds(60);
constexpr absl::Duration kCallTimeout = absl::Seconds(120);  // as the gRPC channel's

// A pulled chunk still in the socket: CopyTo receives it straight into `out`.
class SocketChunk final : public PulledChunk {
 public:
  SocketChunk(BulkSocket* socket, const v1::TensorChunk& meta, uint64_t bytes, absl::Time deadline)
      : socket_(socket), meta_(meta), bytes_(bytes), deadline_(deadline) {}
  absl::string_view part() const override { return meta_.part(); }
  uint64_t offset() const override { return meta_.offset(); }
  uint64_t data_bytes() const override { return bytes_; }
  void CopyTo(char* out) const override {
    if (read_) {
      status_ = absl::InternalError("bulk: a pulled chunk was read twice");
      return;
    }
    read_ = true;
    status_ = socket_->ReadData(out, bytes_, deadline_);
  }
  // After the sink: the bytes it did not take are skipped; the socket's error, if any.
  absl::Status Finish() {
    if (!read_) {
      read_ = true;
      status_ = socket_->SkipData(bytes_, deadline_);
    }
    return status_;
  }

 private:
  BulkSocket* const socket_;
  const v1::TensorChunk& meta_;
  const uint64_t bytes_;
  const absl::Time deadline_;
  mutable bool read_ = false;
  mutable absl::Status status_;
};

// The client TLS of a caller with TLS files (null without; or, logged, when
// they do not load: the data plane is then not used).
std::shared_ptr<const BulkTlsContext> ClientTls(const CallerCredentials& caller,
                                                const std::string& address) {
  if (!caller.tls()) return nullptr;
  auto tls = BulkTlsContext::Create(
      {caller.ca_cert_pem, caller.cert_pem, caller.key_pem, kTaskTlsName}, /*server=*/false);
  if (!tls.ok()) {
    Log("warning: no bulk data plane to the PS at ", address, ": ", tls.status().message());
    return nullptr;
  }
  return *std::move(tls);
}

class BulkShardChannel final : public ShardChannelWrapper {
 public:
  BulkShardChannel(std::unique_ptr<ShardChannel> control, std::string address, int64_t chunk_bytes,
                   CallerCredentials caller)
      : ShardChannelWrapper(std::move(control)),
        address_(std::move(address)),
        host_(HostOfAddress(address_)),
        chunk_bytes_(std::max<uint64_t>(4, static_cast<uint64_t>(chunk_bytes) & ~uint64_t{3})),
        limits_(BulkLimitsFor(static_cast<uint64_t>(chunk_bytes))),
        caller_(std::move(caller)),
        tls_(ClientTls(caller_, address_)) {}
  using ShardChannel::Push;

  absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request,
                                        absl::Duration timeout) override {
    absl::StatusOr<v1::ShardInfo> info = ShardChannelWrapper::GetInfo(request, timeout);
    if (info.ok()) SetPort(info->bulk_port());
    return info;
  }

  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override {
    std::unique_ptr<BulkSocket> socket = Acquire();
    if (socket == nullptr) return ShardChannelWrapper::Pull(request, sink);
    const absl::Time deadline = PullDeadline(request);
    v1::BulkFrame frame;
    *frame.mutable_pull() = request;
    bool in_step = false;
    absl::Status sent = socket->WriteFrame(frame, {}, deadline);
    absl::StatusOr<v1::PullResponse::Header> header =
        sent.ok() ? ReadPull(socket.get(), sink, deadline, &in_step) : sent;
    Release(std::move(socket), in_step);
    return Named(std::move(header));
  }

  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks,
                                        const std::vector<SparseRef>& sparse) override {
    std::unique_ptr<BulkSocket> socket = Acquire();
    if (socket == nullptr) return ShardChannelWrapper::Push(header, chunks, sparse);
    bool in_step = false;
    absl::StatusOr<v1::PushResponse> answer =
        SendPush(socket.get(), header, chunks, sparse, /*fused=*/false);
    if (answer.ok()) answer = ReadStatus(socket.get(), std::move(answer), &in_step);
    Release(std::move(socket), in_step);
    return Named(std::move(answer));
  }

  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override {
    std::unique_ptr<BulkSocket> socket = Acquire();
    if (socket == nullptr) return ShardChannelWrapper::PushPull(header, chunks, sparse, pull, sink);
    v1::PushRequest::Header fused = header;
    *fused.mutable_pull() = pull;
    bool in_step = false;
    PushPullAnswer answer{SendPush(socket.get(), fused, chunks, sparse, /*fused=*/true),
                          absl::UnknownError("")};
    if (!answer.push.ok()) {
      answer.push = Named(std::move(answer.push));
      answer.pull = answer.push.status();
    } else {
      answer.pull = Named(ReadPull(socket.get(), sink, PullDeadline(pull), &in_step));
    }
    Release(std::move(socket), in_step);
    return answer;
  }

 private:
  absl::Time PullDeadline(const v1::PullRequest& request) const {
    return absl::Now() + kCallTimeout +
           absl::Milliseconds(std::max<int64_t>(0, request.wait_timeout_ms()));
  }

  template <typename T>
  absl::StatusOr<T> Named(absl::StatusOr<T> r) const {
    if (r.ok()) return r;
    return absl::Status(r.status().code(),
                        absl::StrCat("ps at ", address_, " (bulk): ", r.status().message()));
  }

  void SetPort(int port) {
    std::vector<std::unique_ptr<BulkSocket>> dropped;
    absl::MutexLock l(&mu_);
    if (port == port_) return;
    port_ = port;
    warned_ = false;
    retry_at_ = absl::InfinitePast();
    retry_after_ = kRetryAfter;
    dropped.swap(idle_);  // connections to the old port (closed outside the lock)
  }

  // A connection from the pool or a new one (hello answered OK); null when
  // the PS has no data plane, or it could not be reached lately (then it is
  // tried again after a backoff, or at once when GetInfo advertises another
  // port).
  std::unique_ptr<BulkSocket> Acquire() {
    int port;
    std::vector<std::unique_ptr<BulkSocket>> dead;  // closed outside the lock
    {
      absl::MutexLock l(&mu_);
      while (!idle_.empty()) {
        std::unique_ptr<BulkSocket> s = std::move(idle_.back());
        idle_.pop_back();
        // An idle connection the PS closed (it stopped, restarted, or
        // dropped it) would fail the call it is given, as gRPC's channel
        // never does with a connection it saw close: a new one instead.
        if (!s->PeerGone()) return s;
        dead.push_back(std::move(s));
      }
      if (absl::Now() < retry_at_) return nullptr;
      port = port_;
    }
    if (port <= 0) return nullptr;
    absl::StatusOr<std::unique_ptr<BulkSocket>> socket = Connect(port);
    absl::MutexLock l(&mu_);
    if (socket.ok()) {
      retry_after_ = kRetryAfter;
      return *std::move(socket);
    }
    if (port_ == port) {
      retry_at_ = absl::Now() + retry_after_;
      retry_after_ = std::min(2 * retry_after_, kMaxRetryAfter);
      if (!warned_) {
        warned_ = true;
        Log("warning: the bulk data plane of the PS at ", address_, " cannot be used (",
            socket.status().message(),
            "); its pulls and pushes go through gRPC, and the data plane is tried again later");
      }
    }
    return nullptr;
  }

  absl::StatusOr<std::unique_ptr<BulkSocket>> Connect(int port) {
    if (caller_.tls() && tls_ == nullptr) {
      return absl::UnavailableError("no TLS context for the data plane (see the log)");
    }
    absl::StatusOr<std::unique_ptr<BulkSocket>> socket =
        ConnectBulk(host_, port, kConnectTimeout, limits_);
    if (!socket.ok()) return socket.status();
    if (tls_ != nullptr) {
      auto session = tls_->Handshake((*socket)->fd(), absl::Now() + kHelloTimeout);
      if (!session.ok()) return session.status();
      (*socket)->UseTls(*std::move(session));
    }
    v1::BulkFrame frame;
    frame.mutable_hello()->set_task(caller_.task);
    if (!caller_.token.empty()) {
      frame.mutable_hello()->set_authorization(absl::StrCat("Bearer ", caller_.token));
    }
    const absl::Time deadline = absl::Now() + kHelloTimeout;
    if (absl::Status s = (*socket)->WriteFrame(frame, {}, deadline); !s.ok()) return s;
    uint64_t data_bytes = 0;
    if (absl::Status s = (*socket)->ReadFrame(&frame, &data_bytes, deadline); !s.ok()) return s;
    if (!frame.has_status() || data_bytes != 0) {
      return absl::InvalidArgumentError("bulk hello: the PS answered with no status");
    }
    if (absl::Status s = FromBulkStatus(frame.status()); !s.ok()) return s;
    return socket;
  }

  void Release(std::unique_ptr<BulkSocket> socket, bool in_step) {
    if (!in_step) return;  // closed: its position in the stream is lost
    absl::MutexLock l(&mu_);
    idle_.push_back(std::move(socket));
  }

  // Header, chunks, sparse rows, end; then the push's answer.
  absl::StatusOr<v1::PushResponse> SendPush(BulkSocket* socket,
                                            const v1::PushRequest::Header& header,
                                            const std::vector<ChunkRef>& chunks,
                                            const std::vector<SparseRef>& sparse, bool fused) {
    const absl::Time deadline = absl::Now() + kCallTimeout;
    absl::Status sent = WritePush(socket, header, chunks, sparse, fused, deadline);
    if (!sent.ok() && !absl::IsUnavailable(sent)) return sent;  // a gate failed: never ended
    // The PS may have refused the push and closed: its status says why.
    v1::BulkFrame frame;
    uint64_t data_bytes = 0;
    absl::Status read = socket->ReadFrame(&frame, &data_bytes,
                                          sent.ok() ? deadline : absl::Now() + absl::Seconds(1));
    if (!read.ok()) return sent.ok() ? read : sent;
    if (frame.has_status() && data_bytes == 0) {
      // A refused push: the PS may be closing the connection, so it is not
      // reused (refusals are rare; a new connection costs a round trip).
      absl::Status why = FromBulkStatus(frame.status());
      return why.ok() ? absl::InternalError("bulk push: answered OK with no answer") : why;
    }
    if (!sent.ok()) return sent;
    if (!frame.answer().has_push() || data_bytes != 0) {
      return absl::InternalError("bulk push: the PS's answer is not a push answer");
    }
    return frame.answer().push();
  }

  absl::Status WritePush(BulkSocket* socket, const v1::PushRequest::Header& header,
                         const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                         bool fused, absl::Time deadline) {
    v1::BulkFrame frame;
    *frame.mutable_push()->mutable_header() = header;
    if (absl::Status s = socket->WriteFrame(frame, {}, deadline); !s.ok()) return s;
    frame.Clear();
    v1::TensorChunk* chunk = frame.mutable_push()->mutable_chunk();
    for (const ChunkRef& c : chunks) {
      if (absl::Status s = AwaitRef(c); !s.ok()) return s;
      const char* data = reinterpret_cast<const char*>(c.data);
      const uint64_t bytes = c.count * sizeof(float);
      for (uint64_t off = 0; off < bytes; off += chunk_bytes_) {
        chunk->set_part(*c.part);
        chunk->set_offset(c.offset + off / 4);
        const absl::string_view piece(data + off, std::min(chunk_bytes_, bytes - off));
        if (absl::Status s = socket->WriteFrame(frame, absl::MakeConstSpan(&piece, 1), deadline);
            !s.ok()) {
          return s;
        }
      }
    }
    frame.Clear();
    v1::SparseRows* rows = frame.mutable_push()->mutable_sparse();
    for (const SparseRef& r : sparse) {
      if (absl::Status s = AwaitRef(r); !s.ok()) return s;
      const uint64_t row_bytes = std::max<uint64_t>(1, r.dim) * sizeof(float);
      const uint64_t per_frame = std::max<uint64_t>(1, chunk_bytes_ / row_bytes);
      for (uint64_t first = 0; first < r.count || (first == 0 && r.count == 0);
           first += per_frame) {
        const uint64_t n = std::min(per_frame, r.count - first);
        rows->set_table(*r.table);
        rows->mutable_ids()->Assign(r.ids + first, r.ids + first + n);
        const absl::string_view piece(reinterpret_cast<const char*>(r.data + first * r.dim),
                                      n * r.dim * sizeof(float));
        if (absl::Status s = socket->WriteFrame(frame, absl::MakeConstSpan(&piece, 1), deadline);
            !s.ok()) {
          return s;
        }
        if (r.count == 0) break;
      }
    }
    frame.Clear();
    frame.mutable_end()->set_pull(fused);
    return socket->WriteFrame(frame, {}, deadline);
  }

  // A call's status frame after its answer: `answer` if OK.
  template <typename T>
  absl::StatusOr<T> ReadStatus(BulkSocket* socket, absl::StatusOr<T> answer, bool* in_step) {
    v1::BulkFrame frame;
    uint64_t data_bytes = 0;
    if (absl::Status s = socket->ReadFrame(&frame, &data_bytes, absl::Now() + kCallTimeout);
        !s.ok()) {
      return s;
    }
    if (!frame.has_status() || data_bytes != 0) {
      return absl::InternalError("bulk: expected the call's status frame");
    }
    *in_step = true;
    if (absl::Status s = FromBulkStatus(frame.status()); !s.ok()) return s;
    return answer;
  }

  // A pull's answer: its header, chunks into `sink`, then its status.
  absl::StatusOr<v1::PullResponse::Header> ReadPull(BulkSocket* socket, const ChunkSink& sink,
                                                    absl::Time deadline, bool* in_step) {
    v1::BulkFrame frame;
    uint64_t data_bytes = 0;
    if (absl::Status s = socket->ReadFrame(&frame, &data_bytes, deadline); !s.ok()) return s;
    if (frame.has_status() && data_bytes == 0) {
      *in_step = true;
      absl::Status why = FromBulkStatus(frame.status());
      return why.ok() ? absl::InternalError("bulk pull: answered OK with no header") : why;
    }
    if (!frame.answer().has_header() || data_bytes != 0) {
      return absl::InternalError("bulk pull: the PS's answer does not start with a header");
    }
    const v1::PullResponse::Header header = frame.answer().header();
    for (;;) {
      if (absl::Status s = socket->ReadFrame(&frame, &data_bytes, deadline); !s.ok()) return s;
      if (frame.has_status() && data_bytes == 0) {
        *in_step = true;
        if (absl::Status s = FromBulkStatus(frame.status()); !s.ok()) return s;
        return header;
      }
      if (!frame.answer().has_chunk() || !frame.answer().chunk().data().empty()) {
        return absl::InternalError("bulk pull: expected a chunk or the status");
      }
      SocketChunk chunk(socket, frame.answer().chunk(), data_bytes, deadline);
      absl::Status taken = sink(chunk);
      if (absl::Status s = chunk.Finish(); !s.ok()) return s;
      if (!taken.ok()) return taken;  // the rest of the answer is not read: closed
    }
  }

  const std::string address_;
  const std::string host_;
  const uint64_t chunk_bytes_;
  const BulkLimits limits_;
  const CallerCredentials caller_;
  const std::shared_ptr<const BulkTlsContext> tls_;  // null: plain TCP

  absl::Mutex mu_;
  int port_ ABSL_GUARDED_BY(mu_) = 0;
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // no new connection before
  absl::Duration retry_after_ ABSL_GUARDED_BY(mu_) = kRetryAfter;
  std::vector<std::unique_ptr<BulkSocket>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ShardChannel> NewBulkShardChannel(std::unique_ptr<ShardChannel> control,
                                                  const std::string& address, int64_t chunk_bytes,
                                                  const CallerCredentials& caller) {
  return std::make_unique<BulkShardChannel>(std::move(control), address, chunk_bytes, caller);
}

std::unique_ptr<ShardChannel> NewPsChannel(const std::string& address, int64_t chunk_bytes,
                                           const CallerCredentials& caller) {
  return NewBulkShardChannel(NewGrpcShardChannel(address, chunk_bytes, caller), address,
                             chunk_bytes, caller);
}

}  // namespace kubetrain
