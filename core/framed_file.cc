#include "core/framed_file.h"

#include <zlib.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kubetrain {
namespace {

constexpr size_t kVersionAndLengthBytes = 4 + 8;
constexpr size_t kTrailerBytes = 4;

uint32_t Crc32(std::string_view data) {
  return static_cast<uint32_t>(
      ::crc32_z(0L, reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

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

absl::StatusOr<std::string> ReadFramedFile(const std::string& path, std::string_view magic,
                                           uint32_t version, std::string_view what) {
  absl::StatusOr<std::string> file = ReadWholeFile(path);
  if (!file.ok()) return file.status();
  const std::string_view data = *file;
  const size_t header_bytes = magic.size() + kVersionAndLengthBytes;
  const size_t min_bytes = header_bytes + kTrailerBytes;
  auto data_loss = [&path](const auto&... parts) {
    return absl::DataLossError(absl::StrCat(path, ": ", parts...));
  };

  if (data.substr(0, magic.size()) != magic) {
    if (data.size() < magic.size() && magic.substr(0, data.size()) == data) {
      return data_loss("truncated: expected at least ", min_bytes, " bytes, found ", data.size());
    }
    return data_loss("not a kubetrain ", std::string(what), " (bad magic)");
  }
  if (data.size() < min_bytes) {
    return data_loss("truncated: expected at least ", min_bytes, " bytes, found ", data.size());
  }
  BinaryReader header(data.substr(magic.size(), kVersionAndLengthBytes));
  uint32_t format = 0;
  uint64_t payload_len = 0;
  header.GetU32(&format).IgnoreError();  // cannot fail: the size is checked above
  header.GetU64(&payload_len).IgnoreError();
  if (format != version) {
    return data_loss("unsupported ", std::string(what), " format version ", format,
                     " (this build reads version ", version, ")");
  }
  if (payload_len > data.size()) {  // also keeps the sum below from overflowing
    return data_loss("truncated (or a damaged header): the header promises a payload of ",
                     payload_len, " bytes, the file has ", data.size(), " bytes in all");
  }
  const uint64_t expected = header_bytes + payload_len + kTrailerBytes;
  if (data.size() < expected) {
    return data_loss("truncated: expected ", expected, " bytes, found ", data.size());
  }
  if (data.size() > expected) {
    return data_loss("corrupt: expected ", expected, " bytes, found ", data.size(),
                     " (trailing data or a damaged header)");
  }
  const std::string_view payload = data.substr(header_bytes, payload_len);
  BinaryReader trailer(data.substr(header_bytes + payload_len));
  uint32_t stored_crc = 0;
  trailer.GetU32(&stored_crc).IgnoreError();  // cannot fail: the size is checked above
  const uint32_t crc = Crc32(payload);
  if (crc != stored_crc) {
    return absl::DataLossError(absl::StrFormat("%s: checksum mismatch (stored %08x, computed %08x)",
                                               path, stored_crc, crc));
  }
  file->erase(0, header_bytes);
  file->resize(payload_len);
  return file;
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
  return absl::DataLossError(
      absl::StrCat("payload ends early at byte ", pos_, " (reading ", std::string(what), ")"));
}

absl::Status BinaryReader::GetU32(uint32_t* v) {
  if (remaining() < 4) return EndsEarly("4-byte integer");
  *v = 0;
  for (int i = 0; i < 4; ++i)
    *v |= static_cast<uint32_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
  pos_ += 4;
  return absl::OkStatus();
}

absl::Status BinaryReader::GetU64(uint64_t* v) {
  if (remaining() < 8) return EndsEarly("8-byte integer");
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
  s->assign(in_.data() + pos_, n);
  pos_ += n;
  return absl::OkStatus();
}

absl::Status BinaryReader::GetFloats(std::vector<float>* v) {
  uint64_t n = 0;
  if (absl::Status st = GetU64(&n); !st.ok()) return st;
  if (n > remaining() / 4) return EndsEarly(absl::StrCat("tensor of ", n, " floats"));
  v->resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    GetU32(&bits).IgnoreError();  // cannot fail: checked above
    std::memcpy(&(*v)[i], &bits, 4);
  }
  return absl::OkStatus();
}

absl::Status BinaryReader::GetBytes(uint64_t n, std::string_view* bytes, std::string_view what) {
  if (n > remaining()) return EndsEarly(absl::StrCat(n, " bytes of ", std::string(what)));
  *bytes = in_.substr(pos_, n);
  pos_ += n;
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
