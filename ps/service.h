// gRPC adapter over a Shard (callback API). It only moves bytes: chunking of
// pulls, reassembly and early validation of pushed chunks, and status
// mapping. All training rules live in ps/shard.h.
#ifndef KUBETRAIN_PS_SERVICE_H_
#define KUBETRAIN_PS_SERVICE_H_

#include <cstdint>
#include <string>

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

// Pull is served raw (ByteBuffer): its chunks are encoded by hand so that the
// tensor bytes go to gRPC as slices pointing into the shard's snapshot, with
// no copy into a protobuf message. The bytes on the wire are an ordinary
// PullResponse; clients use the generated stub.
class PsService final
    : public v1::ParameterServer::WithRawCallbackMethod_Pull<v1::ParameterServer::CallbackService> {
 public:
  // `shard` and `clock` must outlive the service.
  PsService(Shard* shard, const Clock* clock, PsServiceOptions options, PsServiceMetrics metrics);

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const v1::InfoRequest* req,
                                    v1::ShardInfo* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req) override;
  grpc::ServerReadReactor<v1::PushRequest>* Push(grpc::CallbackServerContext* ctx,
                                                 v1::PushResponse* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx,
                                     const v1::ShutdownRequest* req, v1::ShardStats* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const v1::InfoRequest* req,
                                     v1::ShardStats* resp) override;

 private:
  Shard* const shard_;
  const Clock* const clock_;
  const PsServiceOptions options_;
  const PsServiceMetrics metrics_;
};

// absl::Status -> grpc::Status, keeping code and message.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_SERVICE_H_
