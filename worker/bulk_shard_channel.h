// The worker side of the PS's bulk data plane (proto/ps.proto, BulkFrame;
// ps/bulk_server.h): Pull, Push and PushPull over persistent plain TCP
// connections, everything else through the gRPC channel it wraps.
//
// The data plane is used when the PS advertises one (ShardInfo.bulk_port,
// read from every GetInfo), on the host of the gRPC address. If it cannot be
// reached (a NetworkPolicy that admits only the gRPC port, say), the channel
// logs it once and sends those calls through gRPC, trying the data plane again
// after 5 s, doubling up to a minute (at once if GetInfo advertises another
// port). A call that fails on the data plane fails as its
// gRPC twin would (UNAVAILABLE when the PS went away: PsClient asks again,
// on a new connection); its connection is then closed, never reused.
//
// Floats move once each way: a push's chunks are sent from the gradient
// buffers (sendmsg over the ChunkRefs), a pulled chunk is received straight
// into where the sink copies it (PulledChunk::CopyTo reads the socket).
#ifndef KUBETRAIN_WORKER_BULK_SHARD_CHANNEL_H_
#define KUBETRAIN_WORKER_BULK_SHARD_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/job_credentials.h"
#include "ps/shard_channel.h"

namespace kubetrain {

// Wraps `control` (the channel to the PS at `address`, "host:port"). With TLS
// credentials the data plane speaks mutual TLS as gRPC does (proto/bulk_tls.h).
std::unique_ptr<ShardChannel> NewBulkShardChannel(std::unique_ptr<ShardChannel> control,
                                                  const std::string& address, int64_t chunk_bytes,
                                                  const CallerCredentials& caller = {});

// The channel a task uses for the PS at `address`: gRPC, with the bulk data
// plane beside it (NewBulkShardChannel).
std::unique_ptr<ShardChannel> NewPsChannel(const std::string& address, int64_t chunk_bytes,
                                           const CallerCredentials& caller = {});

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_BULK_SHARD_CHANNEL_H_
