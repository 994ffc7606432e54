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
