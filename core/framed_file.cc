#include "core/framed_file.h"

#include <zlib.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kubetrain {
namespace {

constexpr size_t kVersionAndLengthBytes = 4 + 8;
constexpr size_t kTrailerBytes = 4;

}  // namespace

absl::Status WriteFramedFile(const std::string& path, std::string_view magic, uint32_t version,
                             const std::string& payload, FileEnv* env) {
  return WriteFramedFile(
      path, magic, version, [&payload](BinaryWriter& w) { w.PutBytes(payload); }, env);
}

absl::Status WriteFramedFile(const std::string& path, std::string_view magic, uint32_t version,
                             const std::function<void(BinaryWriter&)>& encode, FileEnv* env) {
  BinaryWriter counter = BinaryWriter::Counting();
  encode(counter);
  if (absl::Status st = counter.Finish(); !st.ok()) return st;
  const uint64_t payload_bytes = counter.size();
  return env->WriteFileAtomically(path, [&](const FileEnv::ByteSink& sink) -> absl::Status {
    BinaryWriter header;
    header.PutBytes(magic);
    header.PutU32(version);
    header.PutU64(payload_bytes);
    if (absl::Status st = sink(header.data()); !st.ok()) return st;
    uLong crc = ::crc32_z(0L, Z_NULL, 0);
    const FileEnv::ByteSink payload_sink = [&](std::string_view bytes) {
      crc = ::crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
      return sink(bytes);
    };
    BinaryWriter w(&payload_sink);
    encode(w);
    if (absl::Status st = w.Finish(); !st.ok()) return st;
    if (w.size() != payload_bytes) {
      return absl::InternalError(absl::StrCat("cannot write ", path, ": the payload came out ",
                                              w.size(), " bytes, counted ", payload_bytes));
    }
    BinaryWriter trailer;
    trailer.PutU32(static_cast<uint32_t>(crc));
    return sink(trailer.data());
  });
}

namespace {

// Reads exactly n bytes at the file offset; DataLoss if the file ends first
// (it shrank while it was read).
absl::Status ReadFully(int fd, const std::string& path, char* out, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t got = ::read(fd, out + off, n - off);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::InternalError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: the file shrank while it was read"));
    }
    off += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

absl::Status ReadFramedFile(const std::string& path, std::string_view magic, uint32_t version,
                            std::string_view what,
                            const std::function<absl::Status(BinaryReader&)>& decode) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  FdCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const size_t header_bytes = magic.size() + kVersionAndLengthBytes;
  const size_t min_bytes = header_bytes + kTrailerBytes;
  auto data_loss = [&path](const auto&... parts) {
    return absl::DataLossError(absl::StrCat(path, ": ", parts...));
  };

  std::string head(static_cast<size_t>(std::min<uint64_t>(size, header_bytes)), '\0');
  if (absl::Status read = ReadFully(fd, path, head.data(), head.size()); !read.ok()) return read;
  if (std::string_view(head).substr(0, magic.size()) != magic) {
    if (size < magic.size() && magic.substr(0, head.size()) == head) {
      return data_loss("truncated: expected at least ", min_bytes, " bytes, found ", size);
    }
    return data_loss("not a kubetrain ", std::string(what), " (bad magic)");
  }
  if (size < min_bytes) {
    return data_loss("truncated: expected at least ", min_bytes, " bytes, found ", size);
  }
  BinaryReader header(std::string_view(head).substr(magic.size()));
  uint32_t format = 0;
  uint64_t payload_len = 0;
  header.GetU32(&format).IgnoreError();  // cannot fail: the size is checked above
  header.GetU64(&payload_len).IgnoreError();
  if (format != version) {
    return data_loss("unsupported ", std::string(what), " format version ", format,
                     " (this build reads version ", version, ")");
  }
  if (payload_len > size) {  // also keeps the sum below from overflowing
    return data_loss("truncated (or a damaged header): the header promises a payload of ",
                     payload_len, " bytes, the file has ", size, " bytes in all");
  }
  const uint64_t expected = header_bytes + payload_len + kTrailerBytes;
  if (size < expected) {
    return data_loss("truncated: expected ", expected, " bytes, found ", size);
  }
  if (size > expected) {
    return data_loss("corrupt: expected ", expected, " bytes, found ", size,
                     " (trailing data or a damaged header)");
  }

  uLong crc = ::crc32_z(0L, Z_NULL, 0);
  BinaryReader payload(
      [&](char* out, size_t n) {
        absl::Status read = ReadFully(fd, path, out, n);
        if (read.ok()) crc = ::crc32_z(crc, reinterpret_cast<const Bytef*>(out), n);
        return read;
      },
      payload_len);
  const absl::Status decoded = decode(payload);
  // The checksum covers the whole payload, whatever `decode` read of it.
  std::string rest(static_cast<size_t>(std::min<uint64_t>(payload.remaining(), 1 << 20)), '\0');
  while (payload.remaining() > 0) {
    const uint64_t n = std::min<uint64_t>(payload.remaining(), rest.size());
    if (absl::Status read = payload.GetRaw(rest.data(), n, "the payload"); !read.ok()) return read;
  }
  char trailer_bytes[kTrailerBytes];
  if (absl::Status read = ReadFully(fd, path, trailer_bytes, kTrailerBytes); !read.ok()) {
    return read;
  }
  BinaryReader trailer(std::string_view(trailer_bytes, kTrailerBytes));
  uint32_t stored_crc = 0;
  trailer.GetU32(&stored_crc).IgnoreError();  // cannot fail: 4 bytes
  if (static_cast<uint32_t>(crc) != stored_crc) {
    return absl::DataLossError(absl::StrFormat("%s: checksum mismatch (stored %08x, computed %08x)",
                                               path, stored_crc, static_cast<uint32_t>(crc)));
  }
  return decoded;
}

absl::StatusOr<std::string> ReadFramedFile(const std::string& path, std::string_view magic,
                                           uint32_t version, std::string_view what) {
  std::string out;
  absl::Status read = ReadFramedFile(path, magic, version, what, [&out](BinaryReader& r) {
    out.resize(static_cast<size_t>(r.remaining()));
    return r.GetRaw(out.data(), out.size(), "the payload");
  });
  if (!read.ok()) return read;
  return out;
}

// ---------------------------------------------------------------------------
// BinaryWriter.

namespace {
constexpr size_t kWriterPiece = 1 << 20;
}  // namespace

void BinaryWriter::PutBytes(std::string_view bytes) {
  size_ += bytes.size();
  if (counting_ || !sink_status_.ok()) return;
  if (sink_ != nullptr && out_.size() + bytes.size() >= kWriterPiece) {
    // Large pieces go on as they are, without a copy.
    if (!out_.empty()) sink_status_ = (*sink_)(out_);
    out_.clear();
    if (sink_status_.ok() && bytes.size() >= kWriterPiece) {
      sink_status_ = (*sink_)(bytes);
      return;
    }
  }
  out_.append(bytes.data(), bytes.size());
}

void BinaryWriter::Fail(absl::Status status) {
  if (sink_status_.ok()) sink_status_ = std::move(status);
}

absl::Status BinaryWriter::Finish() {
  if (sink_ != nullptr && sink_status_.ok() && !out_.empty()) {
    sink_status_ = (*sink_)(out_);
    out_.clear();
  }
  return sink_status_;
}

void BinaryWriter::PutU32(uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  PutBytes(std::string_view(b, 4));
}

void BinaryWriter::PutU64(uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  PutBytes(std::string_view(b, 8));
}

void BinaryWriter::PutString(std::string_view s) {
  PutU32(static_cast<uint32_t>(s.size()));
  PutBytes(s);
}

void BinaryWriter::PutFloats(const std::vector<float>& v) {
  PutU64(v.size());
  PutRawFloats(v.data(), v.size());
}

void BinaryWriter::PutRawFloats(const float* v, size_t count) {
  if (counting_) {
    size_ += 4 * count;
    return;
  }
  // Little-endian IEEE-754 bits, in pieces of at most 64 KiB.
  char piece[1 << 16];
  size_t n = 0;
  for (size_t k = 0; k < count; ++k) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v[k], 4);
    for (int i = 0; i < 4; ++i) piece[n++] = static_cast<char>((bits >> (8 * i)) & 0xff);
    if (n == sizeof(piece)) {
      PutBytes(std::string_view(piece, n));
      n = 0;
    }
  }
  if (n > 0) PutBytes(std::string_view(piece, n));
}

// ---------------------------------------------------------------------------
// BinaryReader.

absl::Status BinaryReader::EndsEarly(std::string_view what) const {
  return absl::DataLossError(absl::StrCat("payload ends early at byte ", position(), " (reading ",
                                          std::string(what), ")"));
}

bool BinaryReader::Ensure(size_t n) {
  if (in_.size() - pos_ >= n) return true;
  if (!more_ || !read_status_.ok()) return false;
  // Keep the bytes not used yet, then read at least n in all (about 1 MiB).
  std::string next(in_.substr(pos_));
  consumed_ += pos_;
  const uint64_t want =
      std::min<uint64_t>(total_ - consumed_, std::max<uint64_t>(n, uint64_t{1} << 20));
  const size_t have = next.size();
  next.resize(static_cast<size_t>(want));
  read_status_ = more_(next.data() + have, next.size() - have);
  window_ = std::move(next);
  in_ = std::string_view(window_.data(), read_status_.ok() ? window_.size() : have);
  pos_ = 0;
  return read_status_.ok() && in_.size() >= n;
}

absl::Status BinaryReader::GetU32(uint32_t* v) {
  if (remaining() < 4) return EndsEarly("4-byte integer");
  if (!Ensure(4)) return read_status_;
  *v = 0;
  for (int i = 0; i < 4; ++i)
    *v |= static_cast<uint32_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
  pos_ += 4;
  return absl::OkStatus();
}

absl::Status BinaryReader::GetU64(uint64_t* v) {
  if (remaining() < 8) return EndsEarly("8-byte integer");
  if (!Ensure(8)) return read_status_;
  *v = 0;
  for (int i = 0; i < 8; ++i)
    *v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
  pos_ += 8;
  return absl::OkStatus();
}

absl::Status BinaryReader::GetI32(int32_t* v) {
  uint32_t u = 0;
  absl::Status st = GetU32(&u);
  *v = static_cast<int32_t>(u);
  return st;
}

absl::Status BinaryReader::GetI64(int64_t* v) {
  uint64_t u = 0;
  absl::Status st = GetU64(&u);
  *v = static_cast<int64_t>(u);
  return st;
}

absl::Status BinaryReader::GetString(std::string* s) {
  uint32_t n = 0;
  if (absl::Status st = GetU32(&n); !st.ok()) return st;
  if (n > remaining()) return EndsEarly(absl::StrCat("string of ", n, " bytes"));
  s->resize(n);
  return GetRaw(s->data(), n, "a string");
}

absl::Status BinaryReader::GetFloats(std::vector<float>* v) {
  uint64_t n = 0;
  if (absl::Status st = GetU64(&n); !st.ok()) return st;
  if (n > remaining() / 4) return EndsEarly(absl::StrCat("tensor of ", n, " floats"));
  v->resize(n);
  // The file holds little-endian IEEE-754 bits: read as they are, then put
  // in host order (nothing to do on a little-endian host).
  if (absl::Status st = GetRaw(reinterpret_cast<char*>(v->data()), 4 * n, "floats"); !st.ok()) {
    return st;
  }
#ifdef ABSL_IS_BIG_ENDIAN
  for (float& f : *v) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    bits = __builtin_bswap32(bits);
    std::memcpy(&f, &bits, 4);
  }
#endif
  return absl::OkStatus();
}

absl::Status BinaryReader::GetBytes(uint64_t n, std::string_view* bytes, std::string_view what) {
  if (n > remaining()) return EndsEarly(absl::StrCat(n, " bytes of ", std::string(what)));
  if (!Ensure(static_cast<size_t>(n))) return read_status_;
  *bytes = in_.substr(pos_, n);
  pos_ += n;
  return absl::OkStatus();
}

absl::Status BinaryReader::GetRaw(char* out, uint64_t n, std::string_view what) {
  if (n > remaining()) return EndsEarly(absl::StrCat(n, " bytes of ", std::string(what)));
  const size_t from_window = static_cast<size_t>(std::min<uint64_t>(n, in_.size() - pos_));
  std::memcpy(out, in_.data() + pos_, from_window);
  pos_ += from_window;
  if (from_window == n) return absl::OkStatus();
  // A streaming reader's window is used up: the rest straight from the source.
  if (!more_ || !read_status_.ok()) return read_status_.ok() ? EndsEarly(what) : read_status_;
  consumed_ += pos_;
  window_.clear();
  in_ = std::string_view();
  pos_ = 0;
  read_status_ = more_(out + from_window, static_cast<size_t>(n - from_window));
  if (!read_status_.ok()) return read_status_;
  consumed_ += n - from_window;
  return absl::OkStatus();
}

absl::Status BinaryReader::GetCount(uint32_t* n, size_t min_item_bytes, std::string_view what) {
  if (absl::Status st = GetU32(n); !st.ok()) return st;
  if (*n > remaining() / min_item_bytes) return EndsEarly(absl::StrCat(*n, " ", std::string(what)));
  return absl::OkStatus();
}

absl::Status BinaryReader::ExpectEnd() const {
  if (remaining() == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(remaining(), " unexpected bytes after the last field"));
}

}  // namespace kubetrain
