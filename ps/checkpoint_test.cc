#include "ps/checkpoint.h"

#include <sys/stat.h>

#include <errno.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

ShardCheckpoint Sample(int64_t version, int shard = 0) {
  ShardCheckpoint c;
  c.job_name = "fashion-mnist-sync";
  c.model_fingerprint = "1234abcd";
  c.shard_index = shard;
  c.optimizer_type = "adam";
  c.version = version;
  c.part_names = {"dense0/kernel/part0", "dense0/bias", "dense1/kernel"};
  c.values = {{1.5f, -2.25f, 3.0f, static_cast<float>(version)}, {0.0f, -0.0f}, {}};
  c.slots = {
      {{0.1f, 0.2f, 0.3f, 0.4f}, {1.0f, 2.0f, 3.0f, 4.0f}}, {{5.0f, 6.0f}, {7.0f, 8.0f}}, {}};
  c.worker_clocks = {{0, version}, {1, version - 1}, {2, 7}};
  return c;
}

std::string PathFor(const std::string& dir, int shard, int64_t version) {
  return absl::StrCat(dir, "/ps-", shard, "/ckpt-",
                      std::string(12 - std::to_string(version).size(), '0'), version, ".ktc");
}

struct Warnings {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& s) { lines.push_back(s); };
  }
};

void ExpectSame(const ShardCheckpoint& a, const ShardCheckpoint& b) {
  EXPECT_EQ(a.job_name, b.job_name);
  EXPECT_EQ(a.model_fingerprint, b.model_fingerprint);
  EXPECT_EQ(a.shard_index, b.shard_index);
  EXPECT_EQ(a.optimizer_type, b.optimizer_type);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.part_names, b.part_names);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.worker_clocks, b.worker_clocks);
}

TEST(CheckpointTest, RoundTrip) {
  const std::string dir = NewTestDir("ckpt");
  ShardCheckpoint c = Sample(100, 1);
  ASSERT_TRUE(WriteShardCheckpoint(dir, c).ok());
  EXPECT_EQ(ShardCheckpointDir(dir, 1), dir + "/ps-1");
  EXPECT_EQ(ListDir(dir + "/ps-1"), std::vector<std::string>{"ckpt-000000000100.ktc"});
  auto read = ReadShardCheckpoint(PathFor(dir, 1, 100));
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, c);
  EXPECT_TRUE(std::signbit(read->values[1][1]));  // raw float bits survive
}

TEST(CheckpointTest, EmptyCheckpointRoundTrips) {
  const std::string dir = NewTestDir("ckpt");
  ShardCheckpoint c;
  ASSERT_TRUE(WriteShardCheckpoint(dir, c).ok());
  auto read = ReadShardCheckpoint(PathFor(dir, 0, 0));
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, c);
}

TEST(CheckpointTest, KeepPrunesOldest) {
  const std::string dir = NewTestDir("ckpt");
  for (int64_t v : {10, 20, 30, 40})
    ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(v), /*keep=*/2).ok());
  EXPECT_EQ(ListDir(dir + "/ps-0"),
            (std::vector<std::string>{"ckpt-000000000030.ktc", "ckpt-000000000040.ktc"}));
}

TEST(CheckpointTest, PruneLeavesOtherFilesAndRemovesStaleTemps) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1), 1).ok());
  WriteFile(dir + "/ps-0/README", "mine");
  WriteFile(dir + "/ps-0/ckpt-000000000001.ktc.tmp.99999", "half written");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(2), 1).ok());
  EXPECT_EQ(ListDir(dir + "/ps-0"), (std::vector<std::string>{"README", "ckpt-000000000002.ktc"}));
}

TEST(CheckpointTest, NoTempFileLeftBehind) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(5)).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(6)).ok());
  for (const auto& name : ListDir(dir + "/ps-0")) {
    EXPECT_FALSE(absl::StrContains(name, ".tmp")) << name;
  }
  EXPECT_EQ(ListDir(dir + "/ps-0").size(), 2u);
}

TEST(CheckpointTest, WriteErrorNamesPath) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/ps-0", "a file where the directory should be");
  absl::Status st = WriteShardCheckpoint(dir, Sample(1));
  EXPECT_FALSE(st.ok());
  EXPECT_CONTAINS(std::string(st.message()), (dir + "/ps-0"));
}

TEST(CheckpointTest, InconsistentCheckpointIsNotWritten) {
  const std::string dir = NewTestDir("ckpt");
  ShardCheckpoint c = Sample(1);
  c.slots.pop_back();
  absl::Status st = WriteShardCheckpoint(dir, c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(st.message()), ("3 part names, 3 value tensors, 2 slot lists"));
}

TEST(CheckpointTest, RestorePicksNewest) {
  const std::string dir = NewTestDir("ckpt");
  for (int64_t v : {100, 300, 200}) ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(v)).ok());
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->version, 300);
  ExpectSame(*c, Sample(300));
  EXPECT_TRUE(w.lines.empty());
}

TEST(CheckpointTest, RestoreNothingIsNotFound) {
  const std::string dir = NewTestDir("ckpt");
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/ps-0").c_str(), 0755), 0);
  c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(w.lines.empty());
}

TEST(CheckpointTest, CorruptNewestFallsBackToPrevious) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(2)).ok());
  const std::string newest = PathFor(dir, 0, 2);
  std::string data = ReadFile(newest);
  data[data.size() / 2] ^= 0x01;
  WriteFile(newest, data);

  auto direct = ReadShardCheckpoint(newest);
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_CONTAINS(std::string(direct.status().message()), (newest));
  EXPECT_CONTAINS(std::string(direct.status().message()), ("checksum mismatch"));

  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->version, 1);
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(w.lines[0], newest + ": ")) << w.lines[0];
  EXPECT_CONTAINS(w.lines[0], ("checksum mismatch"));
  EXPECT_TRUE(absl::EndsWith(w.lines[0], "; skipped")) << w.lines[0];
}

TEST(CheckpointTest, EveryFlippedByteIsDetected) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(3)).ok());
  const std::string path = PathFor(dir, 0, 3);
  const std::string good = ReadFile(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x40;
    WriteFile(path, bad);
    auto c = ReadShardCheckpoint(path);
    ASSERT_FALSE(c.ok()) << "flipped byte " << i << " not detected";
    EXPECT_CONTAINS(std::string(c.status().message()), (path));
  }
}

TEST(CheckpointTest, TruncatedNewestFallsBackToPrevious) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(2)).ok());
  const std::string newest = PathFor(dir, 0, 2);
  std::string data = ReadFile(newest);
  const size_t full = data.size();
  WriteFile(newest, data.substr(0, full - 10));

  auto direct = ReadShardCheckpoint(newest);
  ASSERT_FALSE(direct.ok());
  EXPECT_CONTAINS(
      std::string(direct.status().message()),
      absl::StrCat(newest, ": truncated: expected ", full, " bytes, found ", full - 10));

  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->version, 1);
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_CONTAINS(w.lines[0], "truncated");
}

TEST(CheckpointTest, EveryTruncationIsDetected) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(3)).ok());
  const std::string path = PathFor(dir, 0, 3);
  const std::string good = ReadFile(path);
  for (size_t n = 0; n < good.size(); ++n) {
    WriteFile(path, good.substr(0, n));
    auto c = ReadShardCheckpoint(path);
    ASSERT_FALSE(c.ok()) << "truncation to " << n << " bytes not detected";
    EXPECT_CONTAINS(std::string(c.status().message()), ("truncated")) << n;
  }
}

TEST(CheckpointTest, WrongMagic) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  const std::string path = PathFor(dir, 0, 1);
  WriteFile(path, "PK\x03\x04 this is a zip file, not a checkpoint at all");
  auto c = ReadShardCheckpoint(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), path + ": not a kubetrain checkpoint (bad magic)");
}

TEST(CheckpointTest, GarbageWithValidFrameDoesNotAllocateAbsurdly) {
  // Magic and header claim a huge payload: reported as truncated, no allocation.
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  const std::string path = PathFor(dir, 0, 1);
  std::string data = ReadFile(path);
  for (int i = 12; i < 20; ++i) data[i] = '\xff';
  WriteFile(path, data);
  auto c = ReadShardCheckpoint(path);
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(std::string(c.status().message()), path + ": truncated");
}

TEST(CheckpointTest, MissingFile) {
  const std::string dir = NewTestDir("ckpt");
  auto c = ReadShardCheckpoint(dir + "/nope.ktc");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(std::string(c.status().message()), (dir + "/nope.ktc"));
}

TEST(CheckpointTest, AllCorruptIsNotFoundAfterWarnings) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(2)).ok());
  WriteFile(PathFor(dir, 0, 1), "garbage");
  std::string data = ReadFile(PathFor(dir, 0, 2));
  WriteFile(PathFor(dir, 0, 2), data.substr(0, data.size() / 2));
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(w.lines.size(), 2u);
  EXPECT_CONTAINS(w.lines[0], ("ckpt-000000000002.ktc: truncated"));
  EXPECT_CONTAINS(w.lines[1],
                  ("ckpt-000000000001.ktc: not a kubetrain checkpoint (bad magic); skipped"));
}

TEST(CheckpointTest, FingerprintMismatchIsRefused) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(100)).ok());
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "5678ef00", "adam", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      c.status().message(),
      absl::StrCat(
          "checkpoint ", PathFor(dir, 0, 100),
          " was written for model/placement 1234abcd, this job has 5678ef00: refusing to load "
          "it (delete the checkpoint directory or point checkpoint.directory elsewhere)"));
}

TEST(CheckpointTest, FingerprintMismatchOfNewestIsNotSkipped) {
  // An older matching checkpoint must not be silently used instead.
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  ShardCheckpoint other = Sample(2);
  other.model_fingerprint = "ffff0000";
  ASSERT_TRUE(WriteShardCheckpoint(dir, other).ok());
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "adam", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(std::string(c.status().message()), ("ckpt-000000000002.ktc"));
}

TEST(CheckpointTest, OptimizerMismatchIsRefused) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(7)).ok());
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 0, "1234abcd", "sgd", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(std::string(c.status().message()), (PathFor(dir, 0, 7)));
  EXPECT_CONTAINS(std::string(c.status().message()), ("optimizer \"adam\", this job uses \"sgd\""));
}

TEST(CheckpointTest, ShardMismatchIsRefused) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(7, /*shard=*/0)).ok());
  // Someone copied shard 0's files into shard 1's directory.
  ASSERT_EQ(::mkdir((dir + "/ps-1").c_str(), 0755), 0);
  WriteFile(PathFor(dir, 1, 7), ReadFile(PathFor(dir, 0, 7)));
  Warnings w;
  auto c = RestoreShardCheckpoint(dir, 1, "1234abcd", "adam", w.fn());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(std::string(c.status().message()), (PathFor(dir, 1, 7)));
  EXPECT_CONTAINS(std::string(c.status().message()), ("PS shard 0, this is shard 1"));
}

// A disk of `capacity` bytes over the real one: a write that would not fit
// fails with ENOSPC, as on a full tmpfs; deletes give the space back.
class QuotaEnv : public EnvWrapper {
 public:
  QuotaEnv(int64_t capacity) : EnvWrapper(FileEnv::Default()), capacity_(capacity) {}
  absl::Status WriteFileAtomically(const std::string& path, const std::string& data) override {
    if (Used() + static_cast<int64_t>(data.size()) > capacity_) {
      return OsError(ENOSPC, "cannot write " + path);
    }
    return target()->WriteFileAtomically(path, data);
  }
  void Watch(const std::string& dir) { dir_ = dir; }

 private:
  int64_t Used() const {
    int64_t used = 0;
    for (const std::string& name : ::kubetrain::ListDir(dir_)) {
      struct stat st;
      if (::stat((dir_ + "/" + name).c_str(), &st) == 0) used += st.st_size;
    }
    return used;
  }
  const int64_t capacity_;
  std::string dir_;
};

TEST(CheckpointTest, AFullDiskDeletesOlderCheckpointsButNeverTheNewestValidOne) {
  const std::string dir = NewTestDir("ckpt");
  const ShardCheckpoint big = Sample(1);
  ASSERT_TRUE(WriteShardCheckpoint(dir, big).ok());
  const int64_t size = static_cast<int64_t>(ReadFile(PathFor(dir, 0, 1)).size());
  // Room for three checkpoints, which `keep` = 3 fills.
  QuotaEnv env(3 * size + size / 2);
  env.Watch(ShardCheckpointDir(dir, 0));
  std::vector<std::string> notes;
  auto note = [&](const std::string& n) { notes.push_back(n); };
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(2), 3, &env, note).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(3), 3, &env, note).ok());
  EXPECT_TRUE(notes.empty());
  // The fourth does not fit until the oldest (version 1) is deleted.
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(4), 5, &env, note).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_CONTAINS(notes[0], "out of space: deleted " + PathFor(dir, 0, 1));
  EXPECT_EQ(ListDir(ShardCheckpointDir(dir, 0)),
            (std::vector<std::string>{"ckpt-000000000002.ktc", "ckpt-000000000003.ktc",
                                      "ckpt-000000000004.ktc"}));
  // With the newest one corrupt, the newest valid (3) is what is kept.
  FlipByte(PathFor(dir, 0, 4), 20, 0xff);
  QuotaEnv tiny(size / 2);
  tiny.Watch(ShardCheckpointDir(dir, 0));
  notes.clear();
  absl::Status st = WriteShardCheckpoint(dir, Sample(5), 5, &tiny, note);
  EXPECT_EQ(ErrnoOf(st), ENOSPC) << st;
  EXPECT_CONTAINS(std::string(st.message()), "No space left on device");
  EXPECT_EQ(ListDir(ShardCheckpointDir(dir, 0)),
            (std::vector<std::string>{"ckpt-000000000003.ktc"}));
  auto restored =
      RestoreShardCheckpoint(dir, 0, big.model_fingerprint, big.optimizer_type, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->version, 3);
}

TEST(CheckpointTest, OtherWriteErrorsDeleteNothing) {
  const std::string dir = NewTestDir("ckpt");
  ASSERT_TRUE(WriteShardCheckpoint(dir, Sample(1)).ok());
  for (int err : {EROFS, EIO}) {
    class Failing : public EnvWrapper {
     public:
      Failing(int err) : EnvWrapper(FileEnv::Default()), err_(err) {}
      absl::Status WriteFileAtomically(const std::string& path, const std::string&) override {
        return OsError(err_, "cannot create " + path);
      }
      const int err_;
    } env(err);
    absl::Status st = WriteShardCheckpoint(dir, Sample(2), 3, &env);
    EXPECT_EQ(ErrnoOf(st), err);
    EXPECT_CONTAINS(std::string(st.message()), "ckpt-000000000002.ktc");
    EXPECT_EQ(ListDir(ShardCheckpointDir(dir, 0)),
              (std::vector<std::string>{"ckpt-000000000001.ktc"}));
  }
}

}  // namespace
}  // namespace kubetrain
