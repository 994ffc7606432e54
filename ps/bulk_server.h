// The PS side of the bulk data plane (proto/ps.proto, BulkFrame): Pull, Push
// and PushPull over persistent plain TCP connections, beside the gRPC service
// (ps/service.h) and over the same Shard, under the same rules. It exists for
// speed: a chunk's floats go from the socket straight into the push's pooled
// buffer (PushAssembler::ReserveChunk) and from the snapshot straight into
// the socket, one frame head per chunk, with none of HTTP/2's framing, flow
// control windows and thread hops between.
//
// Rules, as on gRPC: a push is applied only after its `end` frame, and only
// if every frame before was well formed and the gradient complete (else
// INVALID_ARGUMENT, nothing applied); a connection that breaks or idles past
// push_idle_timeout in the middle of a push changes nothing. A held pull is
// let go of when its connection breaks (the shard's CancelPull).
//
// Callers (with options.job_key; ps/rpc_auth.h): the hello frame carries the
// same task and token a gRPC call carries in its metadata. The token is
// checked once per connection, before anything else is read; every call is
// then authorized for the task it names (a push: a worker, itself). A
// connection whose hello fails gets the error and is closed. With `tls`
// (proto/bulk_tls.h) every connection first completes a mutual TLS handshake
// under the job's CA, as gRPC's TLS does, and then carries every frame in TLS.
//
// Threads: one accepting, one per connection (a connection carries one call
// at a time); at most max_connections at once (more are answered
// RESOURCE_EXHAUSTED and closed). Stop wakes and joins them all.
#ifndef KUBETRAIN_PS_BULK_SERVER_H_
#define KUBETRAIN_PS_BULK_SERVER_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/log.h"
#include "proto/bulk_wire.h"
#include "ps/service.h"
#include "ps/shard.h"

namespace kubetrain {

struct BulkServerOptions {
  std::string bind_host = "0.0.0.0";
  int port = 0;  // 0: any free port (BulkServer::port())
  uint64_t max_chunk_bytes = 1 << 20;
  // Longest hold of a pull when the request gives no timeout.
  absl::Duration default_pull_wait = absl::Seconds(60);
  // Within a call, the next frame must arrive (and each answer frame be
  // taken) within this long, else the connection is closed (a push: nothing
  // applied). Between calls a connection may idle (TCP keepalive).
  absl::Duration push_idle_timeout = absl::Seconds(30);
  absl::Duration hello_timeout = absl::Seconds(10);
  int max_connections = 256;
  // The job's key (core/job_credentials.h); empty: any client.
  std::string job_key;
  // Mutual TLS on every connection (a server context); null: plain TCP.
  std::shared_ptr<const BulkTlsContext> tls;
};

class BulkServer {
 public:
  // Listens and starts accepting. `shard` and `clock` must outlive the
  // server. UNAVAILABLE naming the address if it cannot listen.
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(Shard* shard, const Clock* clock,
                                                           BulkServerOptions options,
                                                           PsServiceMetrics metrics);
  ~BulkServer();  // Stop()

  int port() const { return port_; }
  // Stops accepting; every connection's call in progress fails (a push is not
  // applied; a held pull is cancelled); joins every thread. Idempotent.
  void Stop();
  int open_connections() const { return open_.load(); }
  // Pulls and pushes answered (refused ones too) since Start: how much of a
  // job's traffic the data plane carried (the PS's last log line says it).
  int64_t calls_answered() const { return calls_answered_.load(); }

 private:
  struct Connection {
    std::unique_ptr<BulkSocket> socket;
    std::thread thread;
    std::atomic<bool> finished{false};
  };

  BulkServer(Shard* shard, const Clock* clock, BulkServerOptions options, PsServiceMetrics metrics,
             int listen_fd, int port);
  void AcceptLoop();
  // Joins the threads of finished connections.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Serve(Connection* conn);
  // The hello: the caller the token proves (any task without a job key).
  absl::Status Hello(BulkSocket* socket, TaskId* caller);
  // One call each. A non-OK return means the connection is out of step
  // (or gone) and must be closed; a call's own error went out as its status
  // frame and returns OK.
  absl::Status ServePull(BulkSocket* socket, const v1::PullRequest& request, const TaskId& caller);
  // `rows`: the connection's buffer for sparse frames' data, kept between pushes.
  absl::Status ServePush(BulkSocket* socket, const v1::PushRequest& first, const TaskId& caller,
                         std::string* rows);
  // A refused call's status frame, logged (rate-limited).
  absl::Status Refuse(BulkSocket* socket, const char* method, const absl::Status& why);
  // After a refusal that leaves the stream out of step: the status frame,
  // then the rest of what the client sends is read and dropped (so it sees
  // the status instead of a reset), then the connection closes.
  void RefuseAndClose(BulkSocket* socket, const char* method, const absl::Status& why);
  absl::Time FrameDeadline() const { return absl::Now() + options_.push_idle_timeout; }

  Shard* const shard_;
  const Clock* const clock_;
  const BulkServerOptions options_;
  const PsServiceMetrics metrics_;
  const BulkLimits limits_;
  const int listen_fd_;
  const int port_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  std::atomic<int64_t> calls_answered_{0};
  LogLimiter refused_log_{absl::Seconds(10)};  // thread-safe itself

  absl::Mutex mu_;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_BULK_SERVER_H_
