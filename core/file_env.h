// The file-system calls behind kubetrain's durable writes (PS checkpoints, the
// exported model), as leveldb's Env: FileEnv::Default() is POSIX; an
// EnvWrapper forwards every call to another FileEnv, so a test overrides one
// call to inject ENOSPC, EROFS or EIO where the real disk cannot.
//
// Errors are InternalError (NotFound where stated) naming the path and the OS
// error ("cannot create /ckpt/x.tmp.12: No space left on device"); the errno
// rides along as a payload (ErrnoOf) so callers can react to a full disk.
//
// Thread safety: FileEnv::Default() may be used from any thread.
#ifndef KUBETRAIN_CORE_FILE_ENV_H_
#define KUBETRAIN_CORE_FILE_ENV_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kubetrain {

class FileEnv {
 public:
  virtual ~FileEnv() = default;
  // The process-wide POSIX implementation (never deleted).
  static FileEnv* Default();

  // mkdir -p.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  // Writes `data` to `path` atomically: missing parents are created, the
  // bytes go to "<path>" kTempFileInfix "<pid>" beside it, which is fsynced
  // and renamed over `path`, then the directory is fsynced. On failure `path`
  // is untouched and the temp file removed.
  virtual absl::Status WriteFileAtomically(const std::string& path, const std::string& data) = 0;
  // The same, with the bytes made by `produce`, which passes them to the
  // sink it is given in pieces (a large file need not exist in memory as a
  // whole). An error from `produce` (or from a sink call, which `produce`
  // must return) fails the write as above. POSIX writes the pieces as they
  // come (buffered); this default collects them and calls
  // WriteFileAtomically, so a test env that overrides only that sees them.
  using ByteSink = std::function<absl::Status(std::string_view)>;
  virtual absl::Status WriteFileAtomically(
      const std::string& path, const std::function<absl::Status(const ByteSink&)>& produce);
  // NotFoundError if there is no such file.
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Names in `dir` except "." and ".."; NotFoundError if it does not exist.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
};

// Infix of WriteFileAtomically's temp file name ("ckpt-1.ktc.tmp.1234"), for
// code that cleans up after writers that died.
inline constexpr char kTempFileInfix[] = ".tmp.";

// Forwards every call to `target` (not owned); override what a test breaks.
class EnvWrapper : public FileEnv {
 public:
  explicit EnvWrapper(FileEnv* target) : target_(target) {}
  FileEnv* target() const { return target_; }
  absl::Status CreateDirs(const std::string& dir) override { return target_->CreateDirs(dir); }
  absl::Status WriteFileAtomically(const std::string& path, const std::string& data) override {
    return target_->WriteFileAtomically(path, data);
  }
  // The streamed write is not forwarded: FileEnv's default collects the
  // bytes and calls the string version above, which a test may override.
  using FileEnv::WriteFileAtomically;
  absl::Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_->ListDir(dir);
  }

 private:
  FileEnv* const target_;
};

// An InternalError "<what>: <strerror(err)>" carrying `err` (see ErrnoOf).
absl::Status OsError(int err, const std::string& what);
// The errno an OsError carries; 0 if none.
int ErrnoOf(const absl::Status& status);

// The whole regular file at `path`, its allocation bounded by the file's real
// size. NotFoundError "<path>: cannot open: No such file or directory" if it
// does not exist; InvalidArgumentError "<path>: not a regular file"; other
// errors name the path and the OS error.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Checks that `dir` can hold durable files, as a checkpoint writer needs it:
// creates it (mkdir -p), then writes, fsyncs and renames a small probe file
// (WriteFileAtomically) and deletes it. The error names the step and the OS
// error.
absl::Status ProbeWritableDir(FileEnv* env, const std::string& dir);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_FILE_ENV_H_
