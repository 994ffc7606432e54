#include "ps/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kubetrain {
namespace {

// File layout (all integers little-endian):
//   magic        8 bytes  "KTCKPT01"
//   version      u32      kFormatVersion
//   payload_len  u64
//   payload      payload_len bytes
//   crc32        u32      zlib crc32 of the payload
constexpr char kMagic[8] = {'K', 'T', 'C', 'K', 'P', 'T', '0', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8;
constexpr size_t kTrailerBytes = 4;

constexpr char kFilePrefix[] = "ckpt-";
constexpr char kFileSuffix[] = ".ktc";
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
    return absl::DataLossError(absl::StrCat(path, ": not a kubetrain checkpoint (bad magic)"));
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
    return absl::DataLossError(absl::StrCat(path, ": unsupported checkpoint format version ", format,
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

std::string CheckpointFileName(int64_t version) {
  return absl::StrFormat("%s%012d%s", kFilePrefix, version, kFileSuffix);
}

// Parses "ckpt-<digits>.ktc" (exact) into the version.
bool ParseCheckpointName(absl::string_view name, int64_t* version) {
  if (!absl::ConsumePrefix(&name, kFilePrefix) || !absl::ConsumeSuffix(&name, kFileSuffix)) return false;
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return absl::SimpleAtoi(name, version);
}

// Parses "ckpt-<digits>.ktc.tmp.<anything>".
bool ParseTempName(absl::string_view name, int64_t* version) {
  size_t pos = name.find(kTmpInfix);
  if (pos == absl::string_view::npos) return false;
  return ParseCheckpointName(name.substr(0, pos), version);
}

struct DirListing {
  std::vector<std::pair<int64_t, std::string>> checkpoints;  // (version, name)
  std::vector<std::pair<int64_t, std::string>> temps;
};

// ENOENT → NotFound.
absl::StatusOr<DirListing> ListShardDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    int err = errno;
    std::string msg = absl::StrCat("cannot list checkpoint directory ", dir, ": ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  DirListing listing;
  while (struct dirent* e = ::readdir(d)) {
    int64_t version;
    std::string name = e->d_name;
    if (ParseCheckpointName(name, &version)) {
      listing.checkpoints.emplace_back(version, name);
    } else if (ParseTempName(name, &version)) {
      listing.temps.emplace_back(version, name);
    }
  }
  ::closedir(d);
  std::sort(listing.checkpoints.begin(), listing.checkpoints.end(),
            [](const auto& a, const auto& b) { return a > b; });  // newest first
  return listing;
}

std::string Encode(const ShardCheckpoint& c) {
  Encoder e;
  e.String(c.job_name);
  e.String(c.model_fingerprint);
  e.I32(c.shard_index);
  e.String(c.optimizer_type);
  e.I64(c.version);
  e.U32(static_cast<uint32_t>(c.part_names.size()));
  for (const auto& name : c.part_names) e.String(name);
  e.U32(static_cast<uint32_t>(c.values.size()));
  for (const auto& v : c.values) e.Floats(v);
  e.U32(static_cast<uint32_t>(c.slots.size()));
  for (const auto& part_slots : c.slots) {
    e.U32(static_cast<uint32_t>(part_slots.size()));
    for (const auto& s : part_slots) e.Floats(s);
  }
  e.U32(static_cast<uint32_t>(c.worker_clocks.size()));
  for (const auto& [worker, clock] : c.worker_clocks) {
    e.I32(worker);
    e.I64(clock);
  }
  const std::string& payload = e.out();
  Encoder file;
  file.Bytes(absl::string_view(kMagic, sizeof(kMagic)));
  file.U32(kFormatVersion);
  file.U64(payload.size());
  file.Bytes(payload);
  file.U32(static_cast<uint32_t>(
      ::crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size())));
  return std::move(file.out());
}

absl::Status Decode(const std::string& path, absl::string_view payload, ShardCheckpoint* c) {
  Decoder d(payload);
  auto corrupt = [&]() {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: ", d.error()));
  };
  int32_t shard = 0;
  if (!d.String(&c->job_name) || !d.String(&c->model_fingerprint) || !d.I32(&shard) ||
      !d.String(&c->optimizer_type) || !d.I64(&c->version)) {
    return corrupt();
  }
  c->shard_index = shard;
  uint32_t n = 0;
  if (!d.Count(&n, 4, "part names")) return corrupt();
  c->part_names.resize(n);
  for (auto& name : c->part_names) {
    if (!d.String(&name)) return corrupt();
  }
  if (!d.Count(&n, 8, "part values")) return corrupt();
  c->values.resize(n);
  for (auto& v : c->values) {
    if (!d.Floats(&v)) return corrupt();
  }
  if (!d.Count(&n, 4, "part slot lists")) return corrupt();
  c->slots.resize(n);
  for (auto& part_slots : c->slots) {
    uint32_t m = 0;
    if (!d.Count(&m, 8, "slots")) return corrupt();
    part_slots.resize(m);
    for (auto& s : part_slots) {
      if (!d.Floats(&s)) return corrupt();
    }
  }
  if (!d.Count(&n, 12, "worker clocks")) return corrupt();
  for (uint32_t i = 0; i < n; ++i) {
    int32_t worker = 0;
    int64_t clock = 0;
    if (!d.I32(&worker) || !d.I64(&clock)) return corrupt();
    c->worker_clocks[worker] = clock;
  }
  if (!d.done()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: ", payload.size() - d.pos(),
                                            " unexpected bytes after the last field"));
  }
  if (c->values.size() != c->part_names.size() || c->slots.size() != c->part_names.size()) {
    return absl::DataLossError(absl::StrCat(path, ": inconsistent: ", c->part_names.size(), " part names, ",
                                            c->values.size(), " value tensors, ", c->slots.size(),
                                            " slot lists"));
  }
  if (c->version < 0) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: negative version ", c->version));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShardCheckpointDir(const std::string& dir, int shard_index) {
  return absl::StrCat(dir, "/ps-", shard_index);
}

absl::Status WriteShardCheckpoint(const std::string& dir, const ShardCheckpoint& ckpt, int keep) {
  const std::string shard_dir = ShardCheckpointDir(dir, ckpt.shard_index);
  const std::string path = absl::StrCat(shard_dir, "/", CheckpointFileName(ckpt.version));
  if (ckpt.values.size() != ckpt.part_names.size() || ckpt.slots.size() != ckpt.part_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", path, ": inconsistent checkpoint: ", ckpt.part_names.size(), " part names, ",
        ckpt.values.size(), " value tensors, ", ckpt.slots.size(), " slot lists"));
  }
  if (ckpt.version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": negative version ", ckpt.version));
  }
  if (absl::Status st = AtomicWriteFile(path, Encode(ckpt)); !st.ok()) return st;

  // Prune: keep the newest `keep` checkpoints (always including the new one),
  // and remove temp files left by writers of older versions.
  auto listing = ListShardDir(shard_dir);
  if (!listing.ok()) return listing.status();
  const size_t keep_n = static_cast<size_t>(std::max(keep, 1));
  absl::Status result = absl::OkStatus();
  for (size_t i = 0; i < listing->checkpoints.size(); ++i) {
    const auto& [version, name] = listing->checkpoints[i];
    if (i < keep_n || version >= ckpt.version) continue;
    const std::string old = absl::StrCat(shard_dir, "/", name);
    if (::unlink(old.c_str()) != 0 && errno != ENOENT && result.ok()) {
      result = absl::InternalError(absl::StrCat("cannot delete old checkpoint ", old, ": ", ErrnoText(errno)));
    }
  }
  for (const auto& [version, name] : listing->temps) {
    if (version >= ckpt.version) continue;
    const std::string stale = absl::StrCat(shard_dir, "/", name);
    ::unlink(stale.c_str());  // best effort
  }
  return result;
}

absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path) {
  auto data = ReadWholeFile(path);
  if (!data.ok()) return data.status();
  auto payload = CheckFrame(path, *data);
  if (!payload.ok()) return payload.status();
  ShardCheckpoint ckpt;
  if (absl::Status st = Decode(path, *payload, &ckpt); !st.ok()) return st;
  return ckpt;
}

absl::StatusOr<ShardCheckpoint> RestoreShardCheckpoint(
    const std::string& dir, int shard_index, const std::string& expected_fingerprint,
    const std::string& expected_optimizer, const std::function<void(const std::string&)>& warn) {
  const std::string shard_dir = ShardCheckpointDir(dir, shard_index);
  auto listing = ListShardDir(shard_dir);
  if (!listing.ok()) {
    if (absl::IsNotFound(listing.status())) {
      return absl::NotFoundError(absl::StrCat("no checkpoint in ", shard_dir, " (directory does not exist)"));
    }
    return listing.status();
  }
  if (listing->checkpoints.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", shard_dir));
  }
  for (const auto& [version, name] : listing->checkpoints) {
    const std::string path = absl::StrCat(shard_dir, "/", name);
    auto ckpt = ReadShardCheckpoint(path);
    if (!ckpt.ok()) {
      std::string msg(ckpt.status().message());
      // Messages already start with the path; avoid saying it twice.
      if (!absl::StartsWith(msg, path + ": ")) msg = absl::StrCat(path, ": ", msg);
      if (warn) warn(absl::StrCat(msg, "; skipped"));
      continue;
    }
    if (ckpt->version != version) {
      // Name and content disagree; treat like corruption rather than trust either.
      if (warn) {
        warn(absl::StrCat(path, ": holds version ", ckpt->version, " but is named for version ", version,
                          "; skipped"));
      }
      continue;
    }
    const char* kAdvice =
        ": refusing to load it (delete the checkpoint directory or point checkpoint.directory elsewhere)";
    if (ckpt->model_fingerprint != expected_fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " was written for model/placement ", ckpt->model_fingerprint,
          ", this job has ", expected_fingerprint, kAdvice));
    }
    if (ckpt->shard_index != shard_index) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " was written for PS shard ", ckpt->shard_index, ", this is shard ",
          shard_index, kAdvice));
    }
    if (ckpt->optimizer_type != expected_optimizer) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " was written with optimizer \"", ckpt->optimizer_type,
          "\", this job uses \"", expected_optimizer, "\"", kAdvice));
    }
    return ckpt;
  }
  return absl::NotFoundError(
      absl::StrCat("no valid checkpoint in ", shard_dir, " (all ", listing->checkpoints.size(),
                   " files were corrupt or unreadable)"));
}

}  // namespace kubetrain
