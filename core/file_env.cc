#include "core/file_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

constexpr char kErrnoPayload[] = "kubetrain.io/errno";

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return OsError(errno, absl::StrCat("cannot write ", path));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

class PosixFileEnv final : public FileEnv {
 public:
  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) return absl::OkStatus();
    size_t start = 0;
    while (start <= path.size()) {
      size_t slash = path.find('/', start);
      if (slash == std::string::npos) slash = path.size();
      const std::string partial = path.substr(0, slash);
      start = slash + 1;
      if (partial.empty()) continue;  // leading '/'
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return OsError(errno, absl::StrCat("cannot create directory ", partial));
      }
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return OsError(ENOTDIR, absl::StrCat("cannot create directory ", path));
    }
    return absl::OkStatus();
  }

  absl::Status WriteFileAtomically(const std::string& path, const std::string& data) override {
    return WriteFileAtomically(path, [&data](const ByteSink& sink) { return sink(data); });
  }

  absl::Status WriteFileAtomically(
      const std::string& path,
      const std::function<absl::Status(const ByteSink&)>& produce) override {
    const std::string dir = DirName(path);
    if (absl::Status st = CreateDirs(dir); !st.ok()) return st;
    const std::string tmp = absl::StrCat(path, kTempFileInfix, ::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return OsError(errno, absl::StrCat("cannot create ", tmp));
    // Small pieces are gathered into write()s of about kWriteBuffer bytes.
    constexpr size_t kWriteBuffer = 1 << 20;
    std::string buffer;
    auto sink = [&](std::string_view bytes) -> absl::Status {
      if (buffer.size() + bytes.size() < kWriteBuffer) {
        buffer.append(bytes.data(), bytes.size());
        return absl::OkStatus();
      }
      if (absl::Status st = WriteAll(fd, buffer, tmp); !st.ok()) return st;
      buffer.clear();
      if (bytes.size() >= kWriteBuffer) return WriteAll(fd, bytes, tmp);
      buffer.append(bytes.data(), bytes.size());
      return absl::OkStatus();
    };
    absl::Status st = produce(sink);
    if (st.ok()) st = WriteAll(fd, buffer, tmp);
    if (st.ok() && ::fsync(fd) != 0) st = OsError(errno, absl::StrCat("cannot fsync ", tmp));
    if (::close(fd) != 0 && st.ok()) st = OsError(errno, absl::StrCat("cannot close ", tmp));
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
      st = OsError(errno, absl::StrCat("cannot rename ", tmp, " to ", path));
    }
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return OsError(errno, absl::StrCat("cannot open directory ", dir, " to fsync it"));
    if (::fsync(dfd) != 0) {
      const int err = errno;
      ::close(dfd);
      return OsError(err, absl::StrCat("cannot fsync directory ", dir));
    }
    ::close(dfd);
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) == 0) return absl::OkStatus();
    const int err = errno;
    absl::Status st = OsError(err, absl::StrCat("cannot delete ", path));
    return err == ENOENT ? absl::NotFoundError(st.message()) : st;
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      const int err = errno;
      absl::Status st = OsError(err, absl::StrCat("cannot list directory ", dir));
      return err == ENOENT ? absl::NotFoundError(st.message()) : st;
    }
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }
};

}  // namespace

absl::Status FileEnv::WriteFileAtomically(
    const std::string& path, const std::function<absl::Status(const ByteSink&)>& produce) {
  std::string data;
  absl::Status st = produce([&data](std::string_view bytes) {
    data.append(bytes.data(), bytes.size());
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return WriteFileAtomically(path, data);
}

FileEnv* FileEnv::Default() {
  static FileEnv* const env = new PosixFileEnv();
  return env;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
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
      return absl::InternalError(absl::StrCat(path, ": cannot read: ", std::strerror(err)));
    }
    if (n == 0) break;  // shrank under us
    off += static_cast<size_t>(n);
  }
  data.resize(off);
  ::close(fd);
  return data;
}

absl::Status OsError(int err, const std::string& what) {
  absl::Status st = absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
  st.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(err)));
  return st;
}

int ErrnoOf(const absl::Status& status) {
  auto payload = status.GetPayload(kErrnoPayload);
  int err = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &err)) return 0;
  return err;
}

absl::Status ProbeWritableDir(FileEnv* env, const std::string& dir) {
  if (absl::Status st = env->CreateDirs(dir); !st.ok()) return st;
  const std::string probe = absl::StrCat(dir, "/.kubetrain-probe-", ::getpid());
  if (absl::Status st = env->WriteFileAtomically(probe, "kubetrain write probe\n"); !st.ok()) {
    return st;
  }
  return env->DeleteFile(probe);
}

}  // namespace kubetrain
