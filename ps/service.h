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
#ifndef KUBETRAIN_PS_SERVICE_H_
#define KUBETRAIN_PS_SERVICE_H_

#include <cstdint>
#include <string>

#include "core/log.h"
#include "proto/ps.grpc.pb.h"
#include "ps/shard.h"

namespace prometheus {
class Counter;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

struct PsServiceOptions {
  std::string model_fingerprint;
  uint64_t max_chunk_bytes = 1 << 20;
  // Longest hold of a pull when the request gives no timeout.
  absl::Duration default_pull_wait = absl::Seconds(60);
};

// Any pointer may be null.
struct PsServiceMetrics {
  prometheus::Histogram* pull_seconds = nullptr;
  prometheus::Histogram* push_seconds = nullptr;
  prometheus::Counter* pull_bytes = nullptr;  // sent to workers
  prometheus::Counter* push_bytes = nullptr;  // received from workers
};

namespace internal {
using RawPsService = v1::ParameterServer::WithRawCallbackMethod_GetInfo<
    v1::ParameterServer::WithRawCallbackMethod_Pull<v1::ParameterServer::WithRawCallbackMethod_Push<
        v1::ParameterServer::WithRawCallbackMethod_Leave<
            v1::ParameterServer::WithRawCallbackMethod_Shutdown<
                v1::ParameterServer::WithRawCallbackMethod_GetStats<
                    v1::ParameterServer::CallbackService>>>>>>;
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
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;

 private:
  class PullReactor;
  class PushReactor;
  // Logs a refused request (rate-limited) and returns its gRPC status.
  grpc::Status Refuse(const char* method, grpc::CallbackServerContext* ctx, const absl::Status& s);
  // Finishes a unary call: `resp` serialized on success, else Refuse(status).
  grpc::ServerUnaryReactor* Answer(const char* method, grpc::CallbackServerContext* ctx,
                                   const absl::Status& status,
                                   const google::protobuf::Message& resp, grpc::ByteBuffer* out);

  Shard* const shard_;
  const Clock* const clock_;
  const PsServiceOptions options_;
  const PsServiceMetrics metrics_;
  LogLimiter refused_log_{absl::Seconds(10)};  // thread-safe itself
};

// absl::Status -> grpc::Status, keeping code and message.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SERVICE_H_
