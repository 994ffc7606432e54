// PS shard checkpoints: one file per save, written atomically (temp file,
// fsync, rename, fsync of the directory) with a CRC32 over the whole content,
// into <dir>/ps-<shard>/ckpt-<version, 12 digits>.ktc. Restore takes the
// newest file that is valid; a corrupt or truncated file is reported by name
// and skipped in favour of the previous one. A valid file written for a
// different model or placement (fingerprint), shard or optimizer is refused:
// nothing is half-loaded.
#ifndef KUBETRAIN_PS_CHECKPOINT_H_
#define KUBETRAIN_PS_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_env.h"

namespace kubetrain {

struct ShardCheckpoint {
  std::string job_name;
  std::string model_fingerprint;  // Placement::Fingerprint()
  int shard_index = 0;
  std::string optimizer_type;  // "sgd", "adam", ...
  int64_t version = 0;
  std::vector<std::string> part_names;                 // parts of the shard, in order
  std::vector<std::vector<float>> values;              // per part
  std::vector<std::vector<std::vector<float>>> slots;  // per part: optimizer slot buffers
  std::map<int, int64_t> worker_clocks;                // steps done per worker (bounded staleness)
};

// A checkpoint as its writer reads it: the small fields at once, each part's
// floats a range at a time, so a large checkpoint can come straight from a
// live shard (Shard::StartCheckpoint) instead of from a copy of it. Reads of
// one source come from one thread.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // job_name, model_fingerprint, shard_index, optimizer_type, version,
  // part_names and worker_clocks; its values and slots are not read.
  virtual const ShardCheckpoint& fields() const = 0;
  // Part `part`'s number of values (slot < 0) or of optimizer slot `slot`
  // (0 <= slot < NumSlots(part)).
  virtual int64_t NumFloats(size_t part, int slot) const = 0;
  virtual int NumSlots(size_t part) const = 0;
  // Reads may start and end only on multiples of this many floats (and at
  // the end of the array): a table part is read by whole rows.
  virtual int64_t Granule(size_t part) const = 0;
  // Copies floats [begin, begin + n) of part `part`'s values (slot < 0) or
  // of its optimizer slot `slot` to `out`.
  virtual void Read(size_t part, int slot, int64_t begin, int64_t n, float* out) = 0;
};

// A checkpoint held in memory as a CheckpointSource (tests, tools, and
// checkpoints read back from a file). `ckpt` must outlive it.
class InMemoryCheckpointSource : public CheckpointSource {
 public:
  explicit InMemoryCheckpointSource(const ShardCheckpoint& ckpt) : ckpt_(ckpt) {}
  const ShardCheckpoint& fields() const override { return ckpt_; }
  int64_t NumFloats(size_t part, int slot) const override;
  int NumSlots(size_t part) const override;
  int64_t Granule(size_t) const override { return 1; }
  void Read(size_t part, int slot, int64_t begin, int64_t n, float* out) override;

 private:
  const ShardCheckpoint& ckpt_;
};

// Every float of `source` read into memory: the ShardCheckpoint it describes.
ShardCheckpoint ReadAllOf(CheckpointSource& source);

// Writes `ckpt` and then deletes all but the newest `keep` checkpoint files of
// the shard. Errors name the path and carry the errno (core/file_env.h
// ErrnoOf). When the disk is full (ENOSPC) it deletes, one at a time, the
// oldest files a restore would not use — temp files of dead writers, then
// checkpoints older than the newest valid one (never that one) — and tries
// again after each, telling `note` what it deleted; it gives up when only the
// newest valid checkpoint is left.
absl::Status WriteShardCheckpoint(const std::string& dir, const ShardCheckpoint& ckpt, int keep = 3,
                                  FileEnv* env = FileEnv::Default(),
                                  const std::function<void(const std::string&)>& note = nullptr);
// The same, streamed from `source` to the file a range of floats at a time
// (about 1 MiB): the checkpoint never exists in memory as a whole. The
// source may be read more than once (a retry after a full disk).
absl::Status WriteShardCheckpoint(const std::string& dir, CheckpointSource& source, int keep = 3,
                                  FileEnv* env = FileEnv::Default(),
                                  const std::function<void(const std::string&)>& note = nullptr);

// Reads one checkpoint file, verifying magic, length and checksum.
absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path);

// The newest valid checkpoint of shard `shard_index` under `dir`:
// - NotFoundError if there is none (first start);
// - every unreadable/corrupt/truncated file met on the way is passed to `warn`
//   ("<path>: <what is wrong>; skipped") and the next older one is tried;
// - FailedPreconditionError naming the file if the newest valid one belongs to
//   another model/placement (fingerprint), shard or optimizer.
absl::StatusOr<ShardCheckpoint> RestoreShardCheckpoint(
    const std::string& dir, int shard_index, const std::string& expected_fingerprint,
    const std::string& expected_optimizer, const std::function<void(const std::string&)>& warn);

// Path of the directory holding shard `shard_index`'s files.
std::string ShardCheckpointDir(const std::string& dir, int shard_index);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_CHECKPOINT_H_
