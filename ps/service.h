// gRPC adapter over a Shard (callback API). It only moves bytes: chunking of
// pulls, reassembly and early validation of pushed chunks, and status
// mapping. All training rules live in ps/shard.h.
//
// Every method is served raw (ByteBuffer) and parses its request itself, so
// that a request that does not parse gets INVALID_ARGUMENT with a message
// saying so (gRPC's generated handlers answer it without one), and so that
// pull chunks go out as slices of the shard's snapshot with no copy. The
// bytes on the wire are the ordinary messages of proto/ps.proto; clients use
// the generated stub.
//
// Pushes: a push is applied only when its stream half-closes cleanly (the
// client's WritesDone) after exactly the gradient's bytes. A stream the
// client cancels, or that carries anything malformed (even after a complete
// gradient), changes nothing. Refused requests are logged at most once per
// 10 s (with the number not logged).
//
// PushPull (a worker's step): a push stream as above until the push is
// handled, then its answer and the pull its header asked for, served as a
// Pull (held, then zero-copy chunks). Once handled, the push's stream slots
// and buffers are freed: a held fused pull is no push stream (neither
// counted in the limits nor closed as idle).
//
// Resources: push streams are limited per PS and per worker (the worker is
// known from the header; an extra stream is RESOURCE_EXHAUSTED); a push
// stream that receives no message for push_idle_timeout is closed
// (UNAVAILABLE, nothing applied) by Tick; a push's buffers are taken as its
// chunks arrive (ps/shard_wire.h), so an idle stream holds none. Every
// stream the PS ends abnormally is counted for Tick's caller, which may give
// the freed memory back to the system.
//
// Callers (with options.job_key; ps/rpc_auth.h): every call is checked from
// its metadata before its request is parsed -- a push stream before anything
// is read or allocated for it, its header's worker index when it arrives --
// and refused with UNAUTHENTICATED or PERMISSION_DENIED (counted in
// PsServiceMetrics, logged like other refusals). TLS is the server's
// (PsServerCredentials), not the service's.
#ifndef KUBETRAIN_PS_SERVICE_H_
#define KUBETRAIN_PS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/job_credentials.h"
#include "core/log.h"
#include "proto/ps.grpc.pb.h"
#include "ps/rpc_auth.h"
#include "ps/shard.h"

namespace grpc {
class ServerBuilder;
class ServerCredentials;
}  // namespace grpc

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

struct PsServiceOptions {
  std::string model_fingerprint;
  uint64_t max_chunk_bytes = 1 << 20;
  // Longest hold of a pull when the request gives no timeout.
  absl::Duration default_pull_wait = absl::Seconds(60);
  // Open push streams at once: on this PS (0: 2 per worker + 16) and from
  // one worker (a worker has one push in flight per PS; one more covers a
  // retry that overlaps a stream the PS has not yet seen end).
  int max_push_streams = 0;
  int max_push_streams_per_worker = 2;
  // A push stream that receives no message this long is closed.
  absl::Duration push_idle_timeout = absl::Seconds(30);
  // The job's key (core/job_credentials.h): every call must carry a token
  // derived from it. Empty: the PS is open to any client.
  std::string job_key;
  // The bulk data plane's port (ps/bulk_server.h) that GetInfo advertises; 0: none.
  int bulk_port = 0;
};

// The server-side transport settings of a PS (message size limits for
// `max_chunk_bytes` and keepalive pings that find dead peers), for
// kubetrain-ps and the tests alike.
void ConfigurePsServer(uint64_t max_chunk_bytes, grpc::ServerBuilder* builder);

// Plaintext without TLS files (creds.tls() false); else TLS with the task
// certificate, requiring a client certificate that the job's CA signed.
std::shared_ptr<grpc::ServerCredentials> PsServerCredentials(const TaskCredentials& creds);

// Any pointer may be null.
struct PsServiceMetrics {
  prometheus::Histogram* pull_seconds = nullptr;
  prometheus::Histogram* push_seconds = nullptr;
  prometheus::Counter* pull_bytes = nullptr;         // sent to workers
  prometheus::Counter* push_bytes = nullptr;         // received from workers (dense and sparse)
  prometheus::Counter* sparse_pull_bytes = nullptr;  // table rows sent (SparsePull, ListRows)
  prometheus::Counter* sparse_push_bytes = nullptr;  // table gradient rows received
  prometheus::Gauge* push_streams = nullptr;         // push streams open now
  // Push streams refused for a limit or closed as idle.
  prometheus::Counter* push_streams_refused = nullptr;
  // Calls refused by the caller checks (ps/rpc_auth.h), by status code.
  prometheus::Counter* auth_unauthenticated = nullptr;
  prometheus::Counter* auth_permission_denied = nullptr;
};

namespace internal {
// Every method raw, over the plain Service (not CallbackService, whose typed
// PushPull has the raw one's signature with another return type).
using RawPsService = v1::ParameterServer::WithRawCallbackMethod_GetInfo<
    v1::ParameterServer::WithRawCallbackMethod_Pull<v1::ParameterServer::WithRawCallbackMethod_Push<
        v1::ParameterServer::WithRawCallbackMethod_PushPull<
            v1::ParameterServer::WithRawCallbackMethod_Leave<
                v1::ParameterServer::WithRawCallbackMethod_Shutdown<
                    v1::ParameterServer::WithRawCallbackMethod_GetStats<
                        v1::ParameterServer::WithRawCallbackMethod_SparsePull<
                            v1::ParameterServer::WithRawCallbackMethod_ListRows<
                                v1::ParameterServer::Service>>>>>>>>>;
}  // namespace internal

class PsService final : public internal::RawPsService {
 public:
  // `shard` and `clock` must outlive the service.
  PsService(Shard* shard, const Clock* clock, PsServiceOptions options, PsServiceMetrics metrics);

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext* ctx,
                                                  grpc::ByteBuffer* resp) override;
  // A Push, then a Pull, on one stream (proto/ps.proto): the push under
  // Push's rules and limits (a push stream until it is handled), the pull
  // under Pull's.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushPull(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* SparsePull(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ListRows(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;

  // Closes push streams idle for longer than options.push_idle_timeout (on
  // the service's clock). Returns how many streams ended abnormally
  // (cancelled, refused, closed as idle) since the last call.
  int64_t Tick(absl::Time now);
  int open_push_streams() const { return open_pushes_.load(); }

 private:
  class SnapshotWriter;
  class PullReactor;
  // A push stream, as Tick sees it.
  class PushStream {
   public:
    virtual ~PushStream() = default;
    virtual void ExpireIfIdle(absl::Time now, absl::Duration timeout) = 0;
  };
  template <bool kFused>  // PushPull, else Push
  class PushReactor;
  // Logs a refused request (rate-limited) and returns its gRPC status.
  grpc::Status Refuse(const char* method, grpc::CallbackServerContext* ctx, const absl::Status& s);
  // With a job key, the caller the call's metadata proves (UNAUTHENTICATED
  // otherwise, counted); without one, OK and *caller untouched.
  absl::Status Authenticate(PsMethod method, grpc::CallbackServerContext* ctx, TaskId* caller);
  // With a job key, AuthorizeCall (PERMISSION_DENIED counted); else OK.
  absl::Status Authorize(PsMethod method, const TaskId& caller, const TaskId& named);
  // Authenticate, parse `raw` into *req (INVALID_ARGUMENT), Authorize for
  // the task the request names: what a call does before serving.
  template <typename Request>
  absl::Status Admit(PsMethod method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                     Request* req);
  // Finishes a unary call: `resp` serialized on success, else Refuse(status).
  grpc::ServerUnaryReactor* Answer(const char* method, grpc::CallbackServerContext* ctx,
                                   const absl::Status& status,
                                   const google::protobuf::Message& resp, grpc::ByteBuffer* out);

  // Every push stream, for Tick, from its start to its OnDone.
  void RegisterPush(PushStream* push);
  void RemovePush(PushStream* push);
  // Counts a push stream in (false: over the PS's limit) and, when it ends, out.
  bool AdmitPush();
  void ReleasePush();
  // Counts a worker's push stream in (false: over its limit); the reactor
  // calls ReleaseWorker once, when it ends.
  bool AdmitWorker(int worker);
  void ReleaseWorker(int worker);

  Shard* const shard_;
  const Clock* const clock_;
  const PsServiceOptions options_;
  const PsServiceMetrics metrics_;
  const int max_push_streams_;
  LogLimiter refused_log_{absl::Seconds(10)};  // thread-safe itself

  // Lock order: pushes_mu_ before a PushReactor's own mutex.
  absl::Mutex pushes_mu_;
  std::set<PushStream*> pushes_ ABSL_GUARDED_BY(pushes_mu_);
  std::atomic<int> open_pushes_{0};                          // admitted and not ended
  const std::unique_ptr<std::atomic<int>[]> worker_pushes_;  // per worker index
  std::atomic<int64_t> abnormal_ends_{0};
};

// absl::Status -> grpc::Status, keeping code and message.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SERVICE_H_
