// The gRPC side of ShardChannel (ps/shard_channel.h): a worker, chief or
// evaluator task's connection to one PS task. Everything gRPC on the worker
// side lives here; PsClient and the training loop only see ShardChannel.
#ifndef KUBETRAIN_WORKER_GRPC_SHARD_CHANNEL_H_
#define KUBETRAIN_WORKER_GRPC_SHARD_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/job_credentials.h"
#include "ps/shard_channel.h"

namespace kubetrain {

// A channel to the PS at `address` ("host:port"); messages never exceed
// chunk_bytes plus framing, on both ends. It reconnects quickly (100 ms ..
// 2 s) after a PS restart. Errors name the address.
//
// `caller` (core/job_credentials.h): with a task set, every call carries its
// x-kubetrain-task and "authorization: Bearer <token>" metadata; with TLS
// files the channel speaks TLS, presents the task certificate and accepts
// only a PS certificate that the job's CA signed for kTaskTlsName. The
// default is a plaintext channel without metadata (an open PS).
std::unique_ptr<ShardChannel> NewGrpcShardChannel(const std::string& address, int64_t chunk_bytes,
                                                  const CallerCredentials& caller = {});

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_GRPC_SHARD_CHANNEL_H_
