#include "core/model_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace kubetrain {
namespace {

// File layout (all integers little-endian):
//   magic        8 bytes  "KTMODEL1"
//   version      u32      kFormatVersion
//   payload_len  u64
//   payload      payload_len bytes
//   crc32        u32      zlib crc32 of the payload
constexpr char kMagic[8] = {'K', 'T', 'M', 'O', 'D', 'E', 'L', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8;
constexpr size_t kTrailerBytes = 4;

constexpr char kTmpInfix[] = ".tmp.";

std::string ErrnoText(int err) { return std::strerror(err); }

// ---------------------------------------------------------------------------
// Little-endian encoding.

class Encoder {
 public:
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Bytes(absl::string_view s) { out_.append(s.data(), s.size()); }
  void String(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Bytes(s);
  }
  void Floats(const std::vector<float>& v) {
    U64(v.size());
    for (float f : v) {
      uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      U32(bits);
    }
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// Bounds-checked reader over a payload: every length is checked against the
// bytes left before anything is allocated.
class Decoder {
 public:
  explicit Decoder(absl::string_view in) : in_(in) {}

  bool U32(uint32_t* v) {
    if (in_.size() - pos_ < 4) return Fail("4-byte integer");
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (in_.size() - pos_ < 8) return Fail("8-byte integer");
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool I32(int32_t* v) {
    uint32_t u = 0;
    if (!U32(&u)) return false;
    *v = static_cast<int32_t>(u);
    return true;
  }
  bool I64(int64_t* v) {
    uint64_t u = 0;
    if (!U64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool String(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n)) return false;
    if (n > in_.size() - pos_) return Fail(absl::StrCat("string of ", n, " bytes"));
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Floats(std::vector<float>* v) {
    uint64_t n = 0;
    if (!U64(&n)) return false;
    if (n > (in_.size() - pos_) / 4) return Fail(absl::StrCat("tensor of ", n, " floats"));
    v->resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      U32(&bits);
      std::memcpy(&(*v)[i], &bits, 4);
    }
    return true;
  }
  // A count of items each taking at least `min_item_bytes` in the payload.
  bool Count(uint32_t* n, size_t min_item_bytes, const char* what) {
    if (!U32(n)) return false;
    if (*n > (in_.size() - pos_) / min_item_bytes) {
      return Fail(absl::StrCat(*n, " ", what));
    }
    return true;
  }
  bool done() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }
  const std::string& error() const { return error_; }

 private:
  bool Fail(const std::string& what) {
    error_ = absl::StrCat("payload ends early at byte ", pos_, " (reading ", what, ")");
    return false;
  }
  absl::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

// ---------------------------------------------------------------------------
// Files.

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::string partial;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    partial = path.substr(0, slash);
    start = slash + 1;
    if (partial.empty()) continue;  // leading '/'
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot create directory ", partial, ": ", ErrnoText(errno)));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InternalError(absl::StrCat("cannot create directory ", path, ": not a directory"));
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ErrnoText(errno)));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Temp file in the same directory, fsync, rename, fsync of the directory.
absl::Status AtomicWriteFile(const std::string& path, const std::string& data) {
  const std::string dir = DirName(path);
  if (absl::Status st = MakeDirs(dir); !st.ok()) return st;
  const std::string tmp = absl::StrCat(path, kTmpInfix, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ErrnoText(errno)));
  }
  absl::Status st = WriteAll(fd, data, tmp);
  if (st.ok() && ::fsync(fd) != 0) {
    st = absl::InternalError(absl::StrCat("cannot fsync ", tmp, ": ", ErrnoText(errno)));
  }
  if (::close(fd) != 0 && st.ok()) {
    st = absl::InternalError(absl::StrCat("cannot close ", tmp, ": ", ErrnoText(errno)));
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ErrnoText(errno)));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    return absl::InternalError(absl::StrCat("cannot open directory ", dir, " to fsync it: ", ErrnoText(errno)));
  }
  if (::fsync(dfd) != 0) {
    int err = errno;
    ::close(dfd);
    return absl::InternalError(absl::StrCat("cannot fsync directory ", dir, ": ", ErrnoText(err)));
  }
  ::close(dfd);
  return absl::OkStatus();
}

// Reads a whole regular file; the allocation is bounded by its real size.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat(path, ": cannot open: ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::read(fd, &data[off], data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": cannot read: ", ErrnoText(err)));
    }
    if (n == 0) break;  // shrank under us
    off += static_cast<size_t>(n);
  }
  data.resize(off);
  ::close(fd);
  return data;
}

// Verifies magic, format version, length and CRC; returns the payload.
absl::StatusOr<absl::string_view> CheckFrame(const std::string& path, absl::string_view data) {
  if (data.size() < sizeof(kMagic) ||
      std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    if (data.size() < sizeof(kMagic) && absl::string_view(kMagic, data.size()) == data) {
      return absl::DataLossError(absl::StrCat(path, ": truncated: expected at least ",
                                              kHeaderBytes + kTrailerBytes, " bytes, found ", data.size()));
    }
    return absl::DataLossError(absl::StrCat(path, ": not a kubetrain model file (bad magic)"));
  }
  if (data.size() < kHeaderBytes + kTrailerBytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: expected at least ",
                                            kHeaderBytes + kTrailerBytes, " bytes, found ", data.size()));
  }
  Decoder header(data.substr(sizeof(kMagic), kHeaderBytes - sizeof(kMagic)));
  uint32_t format = 0;
  uint64_t payload_len = 0;
  header.U32(&format);
  header.U64(&payload_len);
  if (format != kFormatVersion) {
    return absl::DataLossError(absl::StrCat(path, ": unsupported model file format version ", format,
                                            " (this build reads version ", kFormatVersion, ")"));
  }
  if (payload_len > data.size()) {  // also keeps the sum below from overflowing
    return absl::DataLossError(absl::StrCat(path, ": truncated (or a damaged header): the header promises a payload of ",
                                            payload_len, " bytes, the file has ", data.size(), " bytes in all"));
  }
  const uint64_t expected = kHeaderBytes + payload_len + kTrailerBytes;
  if (data.size() < expected) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: expected ", expected, " bytes, found ", data.size()));
  }
  if (data.size() > expected) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: expected ", expected, " bytes, found ", data.size(),
                                            " (trailing data or a damaged header)"));
  }
  absl::string_view payload = data.substr(kHeaderBytes, payload_len);
  Decoder trailer(data.substr(kHeaderBytes + payload_len));
  uint32_t stored_crc = 0;
  trailer.U32(&stored_crc);
  const uint32_t crc = static_cast<uint32_t>(
      ::crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  if (crc != stored_crc) {
    return absl::DataLossError(absl::StrFormat("%s: checksum mismatch (stored %08x, computed %08x)", path,
                                               stored_crc, crc));
  }
  return payload;
}

std::string Frame(const std::string& payload) {
  Encoder file;
  file.Bytes(absl::string_view(kMagic, sizeof(kMagic)));
  file.U32(kFormatVersion);
  file.U64(payload.size());
  file.Bytes(payload);
  file.U32(static_cast<uint32_t>(
      ::crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size())));
  return std::move(file.out());
}

// Checks that `params` has the layout of `model`'s variables; "" if it does.
std::string LayoutMismatch(const Model& model, const std::vector<std::string>& names,
                           const std::vector<std::pair<int64_t, int64_t>>& shapes, const Params& params) {
  const auto& vars = model.variables();
  if (params.size() != vars.size()) {
    return absl::StrCat("the spec has ", vars.size(), " variables, the parameters have ", params.size());
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!names.empty() && names[i] != vars[i].name) {
      return absl::StrCat("variable ", i, " is \"", names[i], "\", the spec expects \"", vars[i].name, "\"");
    }
    if (!shapes.empty() && (shapes[i].first != vars[i].rows || shapes[i].second != vars[i].cols)) {
      return absl::StrCat("variable ", vars[i].name, " has shape [", shapes[i].first, ", ", shapes[i].second,
                          "], the spec expects [", vars[i].rows, ", ", vars[i].cols, "]");
    }
    if (static_cast<int64_t>(params[i].size()) != vars[i].num_elements()) {
      return absl::StrCat("variable ", vars[i].name, " has ", params[i].size(), " values, the spec expects ",
                          vars[i].num_elements(), " (", vars[i].rows, "x", vars[i].cols, ")");
    }
  }
  return "";
}

}  // namespace

absl::Status WriteModelFile(const std::string& path, const ModelFile& model) {
  auto m = Model::Create(model.spec);
  if (!m.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": ", m.status().message()));
  }
  if (std::string why = LayoutMismatch(*m, {}, {}, model.params); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": parameters do not match the model: ", why));
  }
  Encoder e;
  e.String(model.job_name);
  e.I64(model.global_step);
  e.String(model.spec.type);
  e.U32(static_cast<uint32_t>(model.spec.hidden_units.size()));
  for (int h : model.spec.hidden_units) e.I32(h);
  e.I32(model.spec.input_dim);
  e.I32(model.spec.num_classes);
  const auto& vars = m->variables();
  e.U32(static_cast<uint32_t>(vars.size()));
  for (size_t i = 0; i < vars.size(); ++i) {
    e.String(vars[i].name);
    e.I64(vars[i].rows);
    e.I64(vars[i].cols);
    e.Floats(model.params[i]);
  }
  return AtomicWriteFile(path, Frame(e.out()));
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path) {
  auto data = ReadWholeFile(path);
  if (!data.ok()) return data.status();
  auto payload = CheckFrame(path, *data);
  if (!payload.ok()) return payload.status();
  Decoder d(*payload);
  auto corrupt = [&]() { return absl::DataLossError(absl::StrCat(path, ": corrupt: ", d.error())); };
  ModelFile out;
  uint32_t n = 0;
  if (!d.String(&out.job_name) || !d.I64(&out.global_step) || !d.String(&out.spec.type) ||
      !d.Count(&n, 4, "hidden layer sizes")) {
    return corrupt();
  }
  out.spec.hidden_units.resize(n);
  for (int& h : out.spec.hidden_units) {
    int32_t v = 0;
    if (!d.I32(&v)) return corrupt();
    h = v;
  }
  int32_t input_dim = 0, num_classes = 0;
  if (!d.I32(&input_dim) || !d.I32(&num_classes)) return corrupt();
  out.spec.input_dim = input_dim;
  out.spec.num_classes = num_classes;
  if (!d.Count(&n, 4 + 8 + 8 + 8, "variables")) return corrupt();
  std::vector<std::string> names(n);
  std::vector<std::pair<int64_t, int64_t>> shapes(n);
  out.params.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!d.String(&names[i]) || !d.I64(&shapes[i].first) || !d.I64(&shapes[i].second) ||
        !d.Floats(&out.params[i])) {
      return corrupt();
    }
  }
  if (!d.done()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: ", payload->size() - d.pos(),
                                            " unexpected bytes after the last field"));
  }
  auto m = Model::Create(out.spec);
  if (!m.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": invalid model spec: ", m.status().message()));
  }
  if (std::string why = LayoutMismatch(*m, names, shapes, out.params); !why.empty()) {
    return absl::DataLossError(absl::StrCat(path, ": variables do not match the model spec: ", why));
  }
  if (out.global_step < 0) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: negative global step ", out.global_step));
  }
  return out;
}

}  // namespace kubetrain
