#include "ps/bulk_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "ps/rpc_auth.h"
#include "ps/shard_wire.h"

namespace kubetrain {

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(Shard* shard, const Clock* clock,
                                                              BulkServerOptions options,
                                                              PsServiceMetrics metrics) {
  int port = 0;
  absl::StatusOr<int> fd = ListenBulk(options.bind_host, options.port, &port);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<BulkServer> server(
      new BulkServer(shard, clock, std::move(options), metrics, *fd, port));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

BulkServer::BulkServer(Shard* shard, const Clock* clock, BulkServerOptions options,
                       PsServiceMetrics metrics, int listen_fd, int port)
    : shard_(shard),
      clock_(clock),
      options_(std::move(options)),
      metrics_(metrics),
      limits_(BulkLimitsFor(options_.max_chunk_bytes)),
      listen_fd_(listen_fd),
      port_(port) {}

BulkServer::~BulkServer() {
  Stop();
  ::close(listen_fd_);
}

void BulkServer::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    for (Connection& c : connections_) c.socket->ShutdownBoth();
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  // No new connection after the accept thread ended; the list is ours.
  std::list<Connection> all;
  {
    absl::MutexLock l(&mu_);
    all.swap(connections_);
  }
  for (Connection& c : all) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void BulkServer::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->finished.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void BulkServer::AcceptLoop() {
  while (!stopping_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: back off instead of spinning.
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    auto socket = std::make_unique<BulkSocket>(fd, limits_);
    absl::MutexLock l(&mu_);
    ReapLocked();
    if (stopped_) return;
    if (open_.load() >= options_.max_connections) {
      // Answered here, without a thread: the client's hello is not read.
      const v1::BulkFrame full = BulkStatusFrame(absl::ResourceExhaustedError(absl::StrCat(
          "bulk: ", options_.max_connections, " connections already open on this PS")));
      // The connection is closed either way.
      socket->WriteFrame(full, {}, absl::Now() + absl::Seconds(1)).IgnoreError();
      continue;
    }
    ++open_;
    connections_.emplace_back();
    Connection* conn = &connections_.back();
    conn->socket = std::move(socket);
    conn->thread = std::thread([this, conn] {
      Serve(conn);
      // The connection ends here, not when the thread is reaped (at the next
      // accept, or Stop): the client sees it closed at once (a push dropped
      // as idle, a stream out of step) instead of waiting out its deadline.
      conn->socket->ShutdownBoth();
      --open_;
      conn->finished = true;
    });
  }
}

absl::Status BulkServer::Refuse(BulkSocket* socket, const char* method, const absl::Status& why) {
  int64_t suppressed = 0;
  if (refused_log_.Allow(clock_->Now(), &suppressed)) {
    Log("ps:", shard_->options().shard_index, " refused bulk ", method, ": ", why.message(),
        suppressed > 0 ? absl::StrCat(" (", suppressed, " refused requests not logged before)")
                       : std::string());
  }
  return socket->WriteFrame(BulkStatusFrame(why), {}, FrameDeadline());
}

void BulkServer::RefuseAndClose(BulkSocket* socket, const char* method, const absl::Status& why) {
  if (!Refuse(socket, method, why).ok()) return;
  ::shutdown(socket->fd(), SHUT_WR);
  // Up to a push's worth of frames still in flight, for at most a second.
  socket->SkipData(uint64_t{1} << 32, absl::Now() + absl::Seconds(1)).IgnoreError();
}

absl::Status BulkServer::Hello(BulkSocket* socket, TaskId* caller) {
  v1::BulkFrame frame;
  uint64_t data_bytes = 0;
  if (absl::Status s = socket->ReadFrame(&frame, &data_bytes, absl::Now() + options_.hello_timeout);
      !s.ok()) {
    return s;
  }
  if (!frame.has_hello() || data_bytes != 0) {
    return absl::InvalidArgumentError("bulk: a connection's first frame must be its hello");
  }
  if (!options_.job_key.empty()) {
    absl::StatusOr<TaskId> task = AuthenticateCaller(
        PsMethod::kPull, options_.job_key, frame.hello().task(), frame.hello().authorization());
    if (!task.ok()) {
      if (metrics_.auth_unauthenticated) metrics_.auth_unauthenticated->Increment();
      return task.status();
    }
    *caller = *task;
  }
  return absl::OkStatus();
}

void BulkServer::Serve(Connection* conn) {
  BulkSocket* socket = conn->socket.get();
  if (options_.tls != nullptr) {
    auto tls = options_.tls->Handshake(socket->fd(), absl::Now() + options_.hello_timeout);
    if (!tls.ok()) {
      if (absl::IsUnauthenticated(tls.status())) {
        if (metrics_.auth_unauthenticated) metrics_.auth_unauthenticated->Increment();
        int64_t suppressed = 0;
        if (refused_log_.Allow(clock_->Now(), &suppressed)) {
          Log("ps:", shard_->options().shard_index,
              " refused a bulk connection: ", tls.status().message());
        }
      }
      return;
    }
    socket->UseTls(*std::move(tls));
  }
  TaskId caller;
  if (absl::Status s = Hello(socket, &caller); !s.ok()) {
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) {
      RefuseAndClose(socket, "hello", s);
    }
    return;
  }
  if (!socket->WriteFrame(BulkStatusFrame(absl::OkStatus()), {}, FrameDeadline()).ok()) return;
  v1::BulkFrame frame;
  std::string rows;  // sparse frames' data, reused by every push of the connection
  while (!stopping_.load()) {
    uint64_t data_bytes = 0;
    absl::Status s = socket->ReadFrame(&frame, &data_bytes);  // a connection may idle between calls
    if (!s.ok()) {
      if (absl::IsInvalidArgument(s)) RefuseAndClose(socket, "call", s);
      return;
    }
    if (frame.has_pull() && data_bytes == 0) {
      s = ServePull(socket, frame.pull(), caller);
    } else if (frame.has_push() && frame.push().has_header() && data_bytes == 0) {
      s = ServePush(socket, frame.push(), caller, &rows);
    } else {
      RefuseAndClose(socket, "call",
                     absl::InvalidArgumentError(
                         "bulk: a call must start with a pull or a push's header frame"));
      return;
    }
    if (!s.ok()) return;
    calls_answered_.fetch_add(1, std::memory_order_relaxed);
  }
}

absl::Status BulkServer::ServePull(BulkSocket* socket, const v1::PullRequest& request,
                                   const TaskId& caller) {
  const absl::Time start = clock_->Now();
  absl::StatusOr<TaskId> task = TaskFromWire(request.task_type(), request.worker_index());
  absl::Status admitted = task.status();
  if (admitted.ok() && !options_.job_key.empty()) {
    admitted = AuthorizeCall(PsMethod::kPull, caller, *task, ChiefTask(shard_->options()));
    if (!admitted.ok() && metrics_.auth_permission_denied) {
      metrics_.auth_permission_denied->Increment();
    }
  }
  if (!admitted.ok()) return Refuse(socket, "Pull", admitted);
  const absl::Duration wait = request.wait_timeout_ms() > 0
                                  ? absl::Milliseconds(request.wait_timeout_ms())
                                  : options_.default_pull_wait;
  absl::Notification served;
  absl::StatusOr<Shard::Snapshot> snapshot;
  const uint64_t ticket = shard_->Pull({task->index, request.min_version(), request.worker_clock(),
                                        request.incarnation(), task->role},
                                       start + wait, [&](absl::StatusOr<Shard::Snapshot> s) {
                                         snapshot = std::move(s);
                                         served.Notify();
                                       });
  // Held: let go of the pull if the client goes away (or sends anything,
  // which it may not while a pull is held) or the server stops.
  bool gone = false;
  while (!served.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    if (!gone && (stopping_.load() || socket->PeerGone())) {
      gone = true;
      shard_->CancelPull(ticket);
    }
  }
  if (gone) return absl::UnavailableError("bulk: the client left during a held pull");
  if (!snapshot.ok()) {
    return absl::IsInvalidArgument(snapshot.status())
               ? Refuse(socket, "Pull", snapshot.status())
               : socket->WriteFrame(BulkStatusFrame(snapshot.status()), {}, FrameDeadline());
  }
  v1::BulkFrame frame;
  *frame.mutable_answer()->mutable_header() = PullHeaderOf(*snapshot);
  if (absl::Status s = socket->WriteFrame(frame, {}, FrameDeadline()); !s.ok()) return s;
  frame.mutable_answer()->clear_header();
  v1::TensorChunk* chunk = frame.mutable_answer()->mutable_chunk();
  const uint64_t max_chunk = std::max<uint64_t>(4, options_.max_chunk_bytes & ~uint64_t{3});
  if (absl::Status s = ForEachPulledChunk(
          *shard_, *snapshot, max_chunk,
          [&](const std::string& part, uint64_t offset, const char* data, uint64_t bytes) {
            chunk->set_part(part);
            chunk->set_offset(offset);
            const absl::string_view piece(data, bytes);
            absl::Status w =
                socket->WriteFrame(frame, absl::MakeConstSpan(&piece, 1), FrameDeadline());
            if (w.ok() && metrics_.pull_bytes) {
              metrics_.pull_bytes->Increment(static_cast<double>(bytes));
            }
            return w;
          });
      !s.ok()) {
    return s;
  }
  if (metrics_.pull_seconds) {
    metrics_.pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  }
  return socket->WriteFrame(BulkStatusFrame(absl::OkStatus()), {}, FrameDeadline());
}

absl::Status BulkServer::ServePush(BulkSocket* socket, const v1::PushRequest& first,
                                   const TaskId& caller, std::string* rows) {
  const absl::Time start = clock_->Now();
  const v1::PushRequest::Header header = first.header();
  if (!options_.job_key.empty()) {
    absl::Status s = AuthorizeCall(PsMethod::kPush, caller, caller, ChiefTask(shard_->options()));
    if (s.ok()) {
      s = AuthorizeCall(PsMethod::kPush, caller, {TaskRole::kWorker, header.worker_index()},
                        ChiefTask(shard_->options()));
    }
    if (!s.ok()) {
      if (metrics_.auth_permission_denied) metrics_.auth_permission_denied->Increment();
      RefuseAndClose(socket, "Push", s);
      return s;
    }
  }
  PushAssembler assembler(shard_);
  if (absl::Status s = assembler.Add(first); !s.ok()) {
    RefuseAndClose(socket, "Push", s);
    return s;
  }
  // Frames until `end`; anything wrong ends the connection, nothing applied.
  v1::BulkFrame frame;
  bool fused = false;
  for (;;) {
    uint64_t data_bytes = 0;
    absl::Status s = socket->ReadFrame(&frame, &data_bytes, FrameDeadline());
    if (!s.ok()) {
      assembler.Abandon();
      if (absl::IsInvalidArgument(s)) {
        shard_->RecordRejectedPush();
        RefuseAndClose(socket, "Push", s);
      }
      return s;
    }
    if (frame.has_end() && data_bytes == 0) {
      fused = frame.end().pull();
      break;
    }
    if (frame.has_push() && frame.push().has_chunk() && frame.push().chunk().data().empty() &&
        !frame.push().has_header() && !frame.push().has_sparse()) {
      const v1::TensorChunk& c = frame.push().chunk();
      absl::StatusOr<char*> to = assembler.ReserveChunk(c.part(), c.offset(), data_bytes);
      s = to.status();
      if (s.ok()) s = socket->ReadData(*to, data_bytes, FrameDeadline());
    } else if (frame.push().has_sparse() && frame.push().sparse().data().empty() &&
               !frame.push().has_header() && !frame.push().has_chunk()) {
      const v1::SparseRows& r = frame.push().sparse();
      rows->resize(data_bytes);
      s = socket->ReadData(rows->data(), data_bytes, FrameDeadline());
      if (s.ok()) {
        s = assembler.AddSparse(r.table(), r.ids().data(), static_cast<size_t>(r.ids_size()),
                                *rows);
      }
      if (s.ok() && metrics_.sparse_push_bytes) {
        metrics_.sparse_push_bytes->Increment(static_cast<double>(data_bytes));
      }
    } else {
      shard_->RecordRejectedPush();
      s = absl::InvalidArgumentError(
          "push: malformed bulk frame: expected a chunk, sparse rows or the end");
    }
    if (!s.ok()) {
      assembler.Abandon();
      if (absl::IsInvalidArgument(s)) RefuseAndClose(socket, "Push", s);
      return s;
    }
    if (metrics_.push_bytes) metrics_.push_bytes->Increment(static_cast<double>(data_bytes));
  }
  absl::StatusOr<Shard::PushResult> result = assembler.Finish();
  if (!result.ok()) {
    // The stream is in step: the call fails, the connection stays.
    return absl::IsInvalidArgument(result.status())
               ? Refuse(socket, "Push", result.status())
               : socket->WriteFrame(BulkStatusFrame(result.status()), {}, FrameDeadline());
  }
  if (metrics_.push_seconds) {
    metrics_.push_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  }
  frame.Clear();
  *frame.mutable_answer()->mutable_push() = PushResponseOf(*result, shard_->incarnation());
  if (absl::Status s = socket->WriteFrame(frame, {}, FrameDeadline()); !s.ok()) return s;
  if (!fused) return socket->WriteFrame(BulkStatusFrame(absl::OkStatus()), {}, FrameDeadline());
  v1::PullRequest pull = header.pull();
  pull.set_worker_index(header.worker_index());
  pull.set_task_type(v1::TASK_TYPE_WORKER);
  return ServePull(socket, pull, caller);
}

}  // namespace kubetrain
