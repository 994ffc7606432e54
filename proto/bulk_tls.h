// Mutual TLS for the bulk data plane (proto/bulk_wire.h), with OpenSSL, under
// the same rules as the gRPC channel's TLS (core/job_credentials.h): each end
// presents the task certificate and accepts only a peer whose certificate the
// job's CA signed; a client also checks the name kTaskTlsName. TLS 1.3 only,
// AES-GCM first (the CPU's AES instructions), so a record costs one pass of
// AES over the bytes it carries.
//
// There is no kernel TLS here (the kernel of the test machines has no `tls`
// ULP), so a record is encrypted into OpenSSL's buffer and sent from there:
// one copy more than plain TCP, and no HTTP/2 framing or thread hops.
#ifndef KUBETRAIN_PROTO_BULK_TLS_H_
#define KUBETRAIN_PROTO_BULK_TLS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kubetrain {

struct BulkTlsConfig {
  std::string ca_cert_pem;  // the job's CA
  std::string cert_pem;     // this task's certificate
  std::string key_pem;      // its key
  // A client: the name the server's certificate must carry (kTaskTlsName).
  std::string peer_name;
};

class BulkTlsSession;

// Certificates and settings for every connection of one end. Thread-safe.
class BulkTlsContext {
 public:
  // INVALID_ARGUMENT naming what does not parse (the CA, the certificate, the
  // key, or a key that is not the certificate's).
  static absl::StatusOr<std::shared_ptr<BulkTlsContext>> Create(const BulkTlsConfig& config,
                                                                bool server);
  ~BulkTlsContext();
  BulkTlsContext(const BulkTlsContext&) = delete;
  BulkTlsContext& operator=(const BulkTlsContext&) = delete;

  // The handshake on a connected blocking socket `fd` (not owned) by
  // `deadline`. UNAUTHENTICATED when the peer's certificate is refused (or it
  // refused ours), UNAVAILABLE when the connection broke, DEADLINE_EXCEEDED.
  absl::StatusOr<std::unique_ptr<BulkTlsSession>> Handshake(int fd, absl::Time deadline) const;

 private:
  BulkTlsContext(SSL_CTX* ctx, bool server, std::string peer_name)
      : ctx_(ctx), server_(server), peer_name_(std::move(peer_name)) {}
  SSL_CTX* const ctx_;
  const bool server_;
  const std::string peer_name_;
};

// One connection's TLS. Not thread-safe (as BulkSocket).
class BulkTlsSession {
 public:
  explicit BulkTlsSession(SSL* ssl) : ssl_(ssl) {}
  ~BulkTlsSession();
  BulkTlsSession(const BulkTlsSession&) = delete;
  BulkTlsSession& operator=(const BulkTlsSession&) = delete;

  // All `n` bytes, or an error (the socket's timeouts are the caller's).
  absl::Status Send(const char* data, uint64_t n);
  // Exactly `n` bytes, or an error: UNAVAILABLE once the peer closed.
  absl::Status Recv(char* out, uint64_t n);
  // Bytes received and not yet read, decrypted or not (read ahead).
  bool HasPending() const;

 private:
  SSL* const ssl_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PROTO_BULK_TLS_H_
