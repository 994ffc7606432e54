// Framed binary files: a little-endian payload codec, and one file format
// with an atomic writer and a checking reader. Model files and PS
// checkpoints use it; each only defines its own payload layout.
//
// File layout (all integers little-endian):
//   magic        magic.size() bytes (8 for every kubetrain format)
//   version      u32   format version of the payload layout
//   payload_len  u64
//   payload      payload_len bytes
//   crc32        u32   zlib crc32 of the payload
#ifndef KUBETRAIN_CORE_FRAMED_FILE_H_
#define KUBETRAIN_CORE_FRAMED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/file_env.h"

namespace kubetrain {

// Writes `magic`, `version`, the payload length, `payload` and its CRC32 to
// `path` atomically with env->WriteFileAtomically (core/file_env.h): missing
// parent directories are created (mkdir -p), the bytes go to the temp file
// "<path>" kFramedFileTempInfix "<pid>" in the same directory, which is
// fsynced and renamed over `path`, then the directory is fsynced. On failure
// `path` is untouched and the temp file removed. Errors are InternalError,
// name the file or directory that failed and carry the errno (ErrnoOf).
absl::Status WriteFramedFile(const std::string& path, std::string_view magic, uint32_t version,
                             const std::string& payload, FileEnv* env = FileEnv::Default());

class BinaryWriter;
// The same, with the payload written by `encode` straight to the file, so a
// large payload never exists in memory as a whole: `encode` is called twice,
// first on a writer that only counts bytes (for the header's length), then
// on one that passes the bytes on in pieces while the CRC is computed; it
// must write the same fields both times (a part too costly to produce twice
// may be counted with CountBytes). If `encode` calls Fail on either writer,
// that error is returned and the file is not written. Errors as
// WriteFramedFile's.
absl::Status WriteFramedFile(const std::string& path, std::string_view magic, uint32_t version,
                             const std::function<void(BinaryWriter&)>& encode,
                             FileEnv* env = FileEnv::Default());

// Infix of WriteFramedFile's temp file name, for code that cleans up after
// writers that died ("ckpt-1.ktc.tmp.1234").
inline constexpr const char* kFramedFileTempInfix = kTempFileInfix;

// Reads a file written by WriteFramedFile with the same `magic` and `version`
// and returns its payload. Allocates no more than the file's real size,
// whatever its header claims. Every error message starts with "<path>: ":
// - NotFoundError if the file does not exist; InternalError if it cannot be
//   opened or read; InvalidArgumentError if it is not a regular file;
// - DataLossError otherwise, with one of (`what` names the format, e.g.
//   "checkpoint" or "model file"):
//     "not a kubetrain <what> (bad magic)"
//     "unsupported <what> format version V (this build reads version W)"
//     "truncated: expected at least N bytes, found M"   (shorter than a frame)
//     "truncated (or a damaged header): the header promises a payload of ..."
//     "truncated: expected N bytes, found M"
//     "corrupt: expected N bytes, found M (trailing data or a damaged header)"
//     "checksum mismatch (stored xxxxxxxx, computed xxxxxxxx)"
absl::StatusOr<std::string> ReadFramedFile(const std::string& path, std::string_view magic,
                                           uint32_t version, std::string_view what);

class BinaryReader;
// The same checks, with the payload given to `decode` through a reader that
// reads the file about 1 MiB at a time, so a large payload never exists in
// memory as a whole: `decode` reads its fields straight into where they go.
// The checksum is computed as the bytes go by and checked after `decode`
// returns (over the whole payload, whatever `decode` read), so `decode` must
// not act on what it read until this returns OK. A checksum mismatch is
// reported before any error of `decode` (a damaged file reads as one); then
// `decode`'s error, returned as it is.
absl::Status ReadFramedFile(const std::string& path, std::string_view magic, uint32_t version,
                            std::string_view what,
                            const std::function<absl::Status(BinaryReader&)>& decode);

// Appends little-endian fields to a payload: in memory (data()), or passed
// on to a sink in pieces of about 1 MiB, or only counted (size()).
class BinaryWriter {
 public:
  BinaryWriter() = default;
  // Passes the bytes to `sink` (which must outlive the writer); after the
  // first failed sink call nothing more is written and Finish returns it.
  explicit BinaryWriter(const FileEnv::ByteSink* sink) : sink_(sink) {}
  // Counts bytes without keeping them.
  static BinaryWriter Counting() {
    BinaryWriter w;
    w.counting_ = true;
    return w;
  }
  BinaryWriter(BinaryWriter&&) = default;

  void PutU32(uint32_t v);
  void PutU64(uint64_t v);
  void PutI32(int32_t v) { PutU32(static_cast<uint32_t>(v)); }
  void PutI64(int64_t v) { PutU64(static_cast<uint64_t>(v)); }
  void PutBytes(std::string_view bytes);
  // u32 length, then the bytes.
  void PutString(std::string_view s);
  // u64 count, then each float's IEEE-754 bits as a u32 (so -0.0, NaN, ...
  // survive exactly).
  void PutFloats(const std::vector<float>& v);
  // n floats' bits, without a count.
  void PutRawFloats(const float* v, size_t n);

  // Whether this writer only counts (the first pass of WriteFramedFile).
  bool counting() const { return counting_; }
  // Counting writers: counts `bytes` the writing pass will put.
  void CountBytes(uint64_t bytes) { size_ += bytes; }
  // The encoder cannot produce the payload (its source failed): nothing more
  // is written, and Finish returns `status` (the first one given).
  void Fail(absl::Status status);

  // The payload (in-memory writers only).
  const std::string& data() const { return out_; }
  // Bytes written so far.
  uint64_t size() const { return size_; }
  // A sink writer: passes on what is still buffered; the first sink error
  // or Fail status (a counting writer: its Fail status).
  absl::Status Finish();

 private:
  std::string out_;
  uint64_t size_ = 0;
  bool counting_ = false;
  const FileEnv::ByteSink* sink_ = nullptr;
  absl::Status sink_status_;
};

// Reads the fields BinaryWriter writes, in order, from a payload it does not
// own, or from one read a piece at a time (a streaming reader, made by
// ReadFramedFile for its `decode`). Every Get* checks the bytes left before it reads or allocates
// (a count can never make it allocate more than the payload could hold) and on failure returns
// DataLossError("payload ends early at byte P (reading X)") and leaves the output unspecified;
// callers typically stop at the first error and prefix it with "<path>: corrupt: ".
class BinaryReader {
 public:
  explicit BinaryReader(std::string_view in) : in_(in), total_(in.size()) {}
  // A streaming reader of a payload of `total` bytes: `more(out, n)` reads
  // the next n bytes of it (its error is returned by the Get* that needed them).
  BinaryReader(std::function<absl::Status(char* out, size_t n)> more, uint64_t total)
      : more_(std::move(more)), total_(total) {}

  absl::Status GetU32(uint32_t* v);
  absl::Status GetU64(uint64_t* v);
  absl::Status GetI32(int32_t* v);
  absl::Status GetI64(int64_t* v);
  absl::Status GetString(std::string* s);
  absl::Status GetFloats(std::vector<float>* v);
  // The next n bytes, as a view into the payload (a streaming reader's view
  // is valid until its next call).
  absl::Status GetBytes(uint64_t n, std::string_view* bytes, std::string_view what);
  // The next n bytes copied to `out`.
  absl::Status GetRaw(char* out, uint64_t n, std::string_view what);
  // A u32 count of items that each take at least `min_item_bytes` (> 0) of
  // the payload; fails if the rest of the payload cannot hold that many.
  // `what` names the items in the error ("7 part names").
  absl::Status GetCount(uint32_t* n, size_t min_item_bytes, std::string_view what);
  // DataLossError("N unexpected bytes after the last field") unless every
  // byte has been read.
  absl::Status ExpectEnd() const;

  uint64_t position() const { return consumed_ + pos_; }
  uint64_t remaining() const { return total_ - position(); }

 private:
  absl::Status EndsEarly(std::string_view what) const;
  // Makes the next n (<= remaining()) bytes readable in in_; false (and
  // read_status_ says why) if the source failed.
  bool Ensure(size_t n);

  std::string_view in_;  // payload bytes [consumed_, consumed_ + in_.size())
  size_t pos_ = 0;       // into in_
  // Streaming readers: the source, and the bytes read from it not yet used.
  std::function<absl::Status(char*, size_t)> more_;
  std::string window_;
  absl::Status read_status_;
  uint64_t total_ = 0;
  uint64_t consumed_ = 0;  // bytes before in_
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_FRAMED_FILE_H_
