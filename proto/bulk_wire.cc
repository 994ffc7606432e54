#include "proto/bulk_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

constexpr char kMagic[4] = {'K', 'T', 'B', '1'};

void PutLe32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
void PutLe64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetLe(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

absl::Status Errno(absl::string_view what, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat("bulk ", what, ": timed out"));
  }
  return absl::UnavailableError(absl::StrCat("bulk ", what, ": ", std::strerror(err)));
}

// A socket timeout from now until `deadline` (0: none; at least 1 ms so a
// past deadline still times out instead of blocking forever).
timeval TimeoutUntil(absl::Time deadline) {
  timeval tv{0, 0};
  if (deadline == absl::InfiniteFuture()) return tv;
  const int64_t us = std::max<int64_t>(1000, absl::ToInt64Microseconds(deadline - absl::Now()));
  tv.tv_sec = us / 1000000;
  tv.tv_usec = us % 1000000;
  return tv;
}

}  // namespace

BulkLimits BulkLimitsFor(uint64_t chunk_bytes) {
  BulkLimits limits;
  // A sparse push's ids go in the meta (up to 10 bytes each as varints, for
  // rows of at least one float: 4 bytes of data each).
  limits.max_meta_bytes = std::max<uint64_t>(1 << 20, chunk_bytes * 3 + 4096);
  limits.max_data_bytes = std::max<uint64_t>(4, chunk_bytes);
  return limits;
}

BulkSocket::BulkSocket(int fd, BulkLimits limits) : fd_(fd), limits_(limits) {}

BulkSocket::~BulkSocket() { ::close(fd_); }

absl::Status BulkSocket::SetTimeout(int option, absl::Time deadline) {
  const timeval tv = TimeoutUntil(deadline);
  if (::setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv)) != 0) {
    return Errno("setsockopt", errno);
  }
  return absl::OkStatus();
}

absl::Status BulkSocket::WriteFrame(const v1::BulkFrame& meta,
                                    absl::Span<const absl::string_view> data, absl::Time deadline) {
  if (absl::Status s = SetTimeout(SO_SNDTIMEO, deadline); !s.ok()) return s;
  meta_.clear();
  meta.AppendToString(&meta_);
  uint64_t data_bytes = 0;
  for (absl::string_view d : data) data_bytes += d.size();
  char head[kHeadBytes];
  std::memcpy(head, kMagic, 4);
  PutLe32(static_cast<uint32_t>(meta_.size()), head + 4);
  PutLe64(data_bytes, head + 8);
  if (tls_ != nullptr) {
    // Head and meta in one record, then the data pieces as they are.
    meta_.insert(0, head, kHeadBytes);
    if (absl::Status s = tls_->Send(meta_.data(), meta_.size()); !s.ok()) return s;
    for (absl::string_view d : data) {
      if (absl::Status s = tls_->Send(d.data(), d.size()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // Inline: a frame is head, meta and a piece or two; no allocation per frame.
  absl::InlinedVector<iovec, 4> iov;
  iov.push_back({head, kHeadBytes});
  if (!meta_.empty()) iov.push_back({meta_.data(), meta_.size()});
  for (absl::string_view d : data) {
    if (!d.empty()) iov.push_back({const_cast<char*>(d.data()), d.size()});
  }
  size_t first = 0;
  bool started = false;
  while (first < iov.size()) {
    // The socket's timeout is per call: each call gets what is left until
    // the deadline, so a slow reader cannot stretch the write past it.
    if (started) {
      if (deadline != absl::InfiniteFuture() && absl::Now() >= deadline) {
        return absl::DeadlineExceededError("bulk send: timed out");
      }
      if (absl::Status s = SetTimeout(SO_SNDTIMEO, deadline); !s.ok()) return s;
    }
    started = true;
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("send", errno);
    }
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status BulkSocket::Recv(char* out, uint64_t n, absl::Time deadline) {
  if (tls_ != nullptr) {
    // The session reads all `n` bytes under one socket timeout (so a peer
    // that trickles TLS records can still stretch it; see the plain path).
    if (absl::Status s = SetTimeout(SO_RCVTIMEO, deadline); !s.ok()) return s;
    return tls_->Recv(out, n);
  }
  bool started = false;
  while (n > 0) {
    // The socket's timeout restarts with every call, and a call that timed
    // out with part of the bytes returns them: the timeout is set again to
    // what is left, so a peer that trickles bytes cannot keep a read alive
    // past its deadline.
    if (started && deadline != absl::InfiniteFuture() && absl::Now() >= deadline) {
      return absl::DeadlineExceededError("bulk receive: timed out");
    }
    if (absl::Status s = SetTimeout(SO_RCVTIMEO, deadline); !s.ok()) return s;
    started = true;
    const ssize_t got = ::recv(fd_, out, n, MSG_WAITALL);
    if (got == 0) return absl::UnavailableError("bulk receive: the connection was closed");
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("receive", errno);
    }
    out += got;
    n -= static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status BulkSocket::ReadFrame(v1::BulkFrame* meta, uint64_t* data_bytes, absl::Time deadline) {
  char head[kHeadBytes];
  if (absl::Status s = Recv(head, kHeadBytes, deadline); !s.ok()) return s;
  if (std::memcmp(head, kMagic, 4) != 0) {
    return absl::InvalidArgumentError("bulk frame: bad magic (not a kubetrain bulk connection)");
  }
  const uint64_t meta_bytes = GetLe(head + 4, 4);
  *data_bytes = GetLe(head + 8, 8);
  if (meta_bytes > limits_.max_meta_bytes || *data_bytes > limits_.max_data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bulk frame: ", meta_bytes, " meta and ", *data_bytes, " data bytes, over the limits (",
        limits_.max_meta_bytes, " and ", limits_.max_data_bytes, ")"));
  }
  meta_.resize(meta_bytes);
  if (absl::Status s = Recv(meta_.data(), meta_bytes, deadline); !s.ok()) return s;
  if (!meta->ParseFromString(meta_)) {
    return absl::InvalidArgumentError("bulk frame: the meta is not a valid BulkFrame");
  }
  return absl::OkStatus();
}

absl::Status BulkSocket::ReadData(char* out, uint64_t n, absl::Time deadline) {
  return Recv(out, n, deadline);
}

absl::Status BulkSocket::SkipData(uint64_t n, absl::Time deadline) {
  char scratch[64 << 10];
  while (n > 0) {
    const uint64_t take = std::min<uint64_t>(n, sizeof(scratch));
    if (absl::Status s = Recv(scratch, take, deadline); !s.ok()) return s;
    n -= take;
  }
  return absl::OkStatus();
}

bool BulkSocket::PeerGone() const {
  if (tls_ != nullptr && tls_->HasPending()) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void BulkSocket::ShutdownBoth() { ::shutdown(fd_, SHUT_RDWR); }

v1::BulkFrame BulkStatusFrame(const absl::Status& status) {
  v1::BulkFrame frame;
  frame.mutable_status()->set_code(static_cast<int>(status.code()));
  frame.mutable_status()->set_message(std::string(status.message()));
  return frame;
}

absl::Status FromBulkStatus(const v1::BulkStatus& status) {
  const int code = status.code();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(absl::StrCat("bulk status code ", code, ": ", status.message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.message());
}

absl::StatusOr<std::unique_ptr<BulkSocket>> ConnectBulk(const std::string& host, int port,
                                                        absl::Duration timeout, BulkLimits limits) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk connect to ", where, ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
  std::string why = "no address";
  const absl::Time deadline = absl::Now() + timeout;
  for (addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ms =
          static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      const int ready = ::poll(&p, 1, ms);
      if (ready == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        if (ready == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    if (rc != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    return std::make_unique<BulkSocket>(fd, limits);
  }
  return absl::UnavailableError(absl::StrCat("bulk connect to ", where, ": ", why));
}

absl::StatusOr<int> ListenBulk(const std::string& bind_host, int port, int* bound_port) {
  const std::string where = absl::StrCat(bind_host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const char* node = bind_host.empty() ? nullptr : bind_host.c_str();
  if (int rc = ::getaddrinfo(node, std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("bulk listen on ", where, ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
  std::string why = "no address";
  for (addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    *bound_port = addr.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return fd;
  }
  return absl::UnavailableError(absl::StrCat("bulk listen on ", where, ": ", why));
}

std::string HostOfAddress(absl::string_view address) {
  if (!address.empty() && address.front() == '[') {
    const size_t end = address.find(']');
    if (end != absl::string_view::npos) return std::string(address.substr(1, end - 1));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return std::string(address);
  return std::string(address.substr(0, colon));
}

}  // namespace kubetrain
