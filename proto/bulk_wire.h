// Frames of the bulk data plane (proto/ps.proto, BulkFrame) on a TCP socket:
// what both ends (ps/bulk_server.h, worker/bulk_shard_channel.h) share.
//
// A frame is a 16-byte head -- magic "KTB1", the meta's bytes (uint32) and
// the data's bytes (uint64), little-endian -- then the meta (a serialized
// BulkFrame), then the data (raw bytes: a chunk's floats, a push's sparse
// rows). A reader takes the head and meta first (ReadFrame) and then the data
// straight into where it belongs (ReadData), so the floats are copied once,
// by the kernel; a writer sends head, meta and data pieces in one sendmsg.
//
// Errors: UNAVAILABLE when the peer closed or reset the connection (or it
// was shut down locally); DEADLINE_EXCEEDED when a read or write did not
// finish by its deadline; INVALID_ARGUMENT for a frame that is not one (bad
// magic, over the limits, meta that does not parse). After any error the
// stream's position is lost: the connection must be closed.
#ifndef KUBETRAIN_PROTO_BULK_WIRE_H_
#define KUBETRAIN_PROTO_BULK_WIRE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/bulk_tls.h"
#include "proto/ps.pb.h"

namespace kubetrain {

// What ReadFrame accepts; a larger frame is INVALID_ARGUMENT.
struct BulkLimits {
  uint64_t max_meta_bytes = 1 << 20;
  uint64_t max_data_bytes = 64 << 20;
};

// Limits for a job whose messages carry at most `chunk_bytes` of data: a
// chunk's data, or a sparse push's rows with its ids in the meta.
BulkLimits BulkLimitsFor(uint64_t chunk_bytes);

// One connected socket. Not thread-safe, except ShutdownBoth.
class BulkSocket {
 public:
  static constexpr size_t kHeadBytes = 16;

  // Takes ownership of `fd` (a connected, blocking TCP socket).
  BulkSocket(int fd, BulkLimits limits);
  ~BulkSocket();
  BulkSocket(const BulkSocket&) = delete;
  BulkSocket& operator=(const BulkSocket&) = delete;

  // Head + meta + every piece of `data` (their sizes summed), by `deadline`.
  absl::Status WriteFrame(const v1::BulkFrame& meta, absl::Span<const absl::string_view> data = {},
                          absl::Time deadline = absl::InfiniteFuture());
  // The next frame's meta; *data_bytes of data follow, which the caller reads
  // (ReadData) or skips (SkipData) before the next ReadFrame.
  absl::Status ReadFrame(v1::BulkFrame* meta, uint64_t* data_bytes,
                         absl::Time deadline = absl::InfiniteFuture());
  absl::Status ReadData(char* out, uint64_t n, absl::Time deadline = absl::InfiniteFuture());
  absl::Status SkipData(uint64_t n, absl::Time deadline = absl::InfiniteFuture());
  // True once the peer closed or reset the connection (or data arrived that
  // nobody asked for). Never blocks.
  bool PeerGone() const;
  // Wakes any read or write blocked on this socket (they fail UNAVAILABLE);
  // for another thread stopping a server.
  void ShutdownBoth();
  int fd() const { return fd_; }
  // From now on every byte goes through `tls`, whose handshake ran on fd().
  void UseTls(std::unique_ptr<BulkTlsSession> tls) { tls_ = std::move(tls); }
  bool tls() const { return tls_ != nullptr; }

 private:
  absl::Status SetTimeout(int option, absl::Time deadline);
  absl::Status Recv(char* out, uint64_t n, absl::Time deadline);

  const int fd_;
  const BulkLimits limits_;
  std::string meta_;                     // reused between frames
  std::unique_ptr<BulkTlsSession> tls_;  // null: plain TCP
};

// A frame holding only `status` (a call's last frame).
v1::BulkFrame BulkStatusFrame(const absl::Status& status);
absl::Status FromBulkStatus(const v1::BulkStatus& status);

// A connection to host:port within `timeout`; UNAVAILABLE naming both.
absl::StatusOr<std::unique_ptr<BulkSocket>> ConnectBulk(const std::string& host, int port,
                                                        absl::Duration timeout, BulkLimits limits);

// A listening TCP socket on bind_host:port (0: any free port); sets
// *bound_port. UNAVAILABLE naming the address if it cannot listen.
absl::StatusOr<int> ListenBulk(const std::string& bind_host, int port, int* bound_port);

// "host" of "host:port" or "[v6]:port" (the gRPC target forms the tasks use).
std::string HostOfAddress(absl::string_view address);

}  // namespace kubetrain

#endif  // KUBETRAIN_PROTO_BULK_WIRE_H_
