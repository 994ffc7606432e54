#include "ps/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/framed_file.h"

namespace kubetrain {
namespace {

// A framed file (core/framed_file.h) with this magic and format version.
constexpr std::string_view kMagic = "KTCKPT01";
constexpr uint32_t kFormatVersion = 1;

constexpr char kFilePrefix[] = "ckpt-";
constexpr char kFileSuffix[] = ".ktc";

#define KT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status kt_status_ = (expr);        \
    if (!kt_status_.ok()) return kt_status_; \
  } while (0)

std::string CheckpointFileName(int64_t version) {
  return absl::StrFormat("%s%012d%s", kFilePrefix, version, kFileSuffix);
}

// Parses "ckpt-<digits>.ktc" (exact) into the version.
bool ParseCheckpointName(absl::string_view name, int64_t* version) {
  if (!absl::ConsumePrefix(&name, kFilePrefix) || !absl::ConsumeSuffix(&name, kFileSuffix))
    return false;
  if (name.empty() ||
      !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return absl::SimpleAtoi(name, version);
}

// Parses "ckpt-<digits>.ktc.tmp.<anything>".
bool ParseTempName(absl::string_view name, int64_t* version) {
  size_t pos = name.find(kFramedFileTempInfix);
  if (pos == absl::string_view::npos) return false;
  return ParseCheckpointName(name.substr(0, pos), version);
}

struct DirListing {
  std::vector<std::pair<int64_t, std::string>> checkpoints;  // (version, name)
  std::vector<std::pair<int64_t, std::string>> temps;
};

// ENOENT → NotFound.
absl::StatusOr<DirListing> ListShardDir(const std::string& dir, FileEnv* env) {
  auto names = env->ListDir(dir);
  if (!names.ok()) {
    std::string msg =
        absl::StrCat("cannot list checkpoint directory ", dir, ": ", names.status().message());
    return absl::IsNotFound(names.status()) ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  DirListing listing;
  for (const std::string& name : *names) {
    int64_t version;
    if (ParseCheckpointName(name, &version)) {
      listing.checkpoints.emplace_back(version, name);
    } else if (ParseTempName(name, &version)) {
      listing.temps.emplace_back(version, name);
    }
  }
  std::sort(listing.checkpoints.begin(), listing.checkpoints.end(),
            [](const auto& a, const auto& b) { return a > b; });  // newest first
  return listing;
}

// Payload layout, in order: job_name, model_fingerprint (strings),
// shard_index (i32), optimizer_type (string), version (i64); part names
// (u32 count, strings); values (u32 count, floats each); slots (u32 count,
// then per part a u32 count and floats each); worker clocks (u32 count, then
// worker i32 and clock i64 each).
//
// Floats are read from the source about 1 MiB at a time, in whole granules.
constexpr int64_t kChunkFloats = (1 << 20) / sizeof(float);

void PutFloatsOf(CheckpointSource& source, size_t part, int slot, std::vector<float>& buffer,
                 BinaryWriter& w) {
  const int64_t n = source.NumFloats(part, slot);
  w.PutU64(static_cast<uint64_t>(n));
  if (w.counting()) {
    w.CountBytes(static_cast<uint64_t>(n) * sizeof(float));
    return;
  }
  const int64_t granule = std::max<int64_t>(1, source.Granule(part));
  const int64_t chunk = std::max<int64_t>(1, kChunkFloats / granule) * granule;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    buffer.resize(static_cast<size_t>(count));
    source.Read(part, slot, begin, count, buffer.data());
    w.PutRawFloats(buffer.data(), buffer.size());
  }
}

void EncodePayload(CheckpointSource& source, BinaryWriter& w) {
  const ShardCheckpoint& c = source.fields();
  const size_t parts = c.part_names.size();
  w.PutString(c.job_name);
  w.PutString(c.model_fingerprint);
  w.PutI32(c.shard_index);
  w.PutString(c.optimizer_type);
  w.PutI64(c.version);
  w.PutU32(static_cast<uint32_t>(parts));
  for (const auto& name : c.part_names) w.PutString(name);
  std::vector<float> buffer;
  w.PutU32(static_cast<uint32_t>(parts));
  for (size_t p = 0; p < parts; ++p) PutFloatsOf(source, p, -1, buffer, w);
  w.PutU32(static_cast<uint32_t>(parts));
  for (size_t p = 0; p < parts; ++p) {
    const int slots = source.NumSlots(p);
    w.PutU32(static_cast<uint32_t>(slots));
    for (int k = 0; k < slots; ++k) PutFloatsOf(source, p, k, buffer, w);
  }
  w.PutU32(static_cast<uint32_t>(c.worker_clocks.size()));
  for (const auto& [worker, clock] : c.worker_clocks) {
    w.PutI32(worker);
    w.PutI64(clock);
  }
}

// Decodes the fields only; the caller checks their consistency.
absl::Status DecodePayload(BinaryReader& r, ShardCheckpoint* c) {
  int32_t shard = 0;
  KT_RETURN_IF_ERROR(r.GetString(&c->job_name));
  KT_RETURN_IF_ERROR(r.GetString(&c->model_fingerprint));
  KT_RETURN_IF_ERROR(r.GetI32(&shard));
  KT_RETURN_IF_ERROR(r.GetString(&c->optimizer_type));
  KT_RETURN_IF_ERROR(r.GetI64(&c->version));
  c->shard_index = shard;
  uint32_t n = 0;
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4, "part names"));
  c->part_names.resize(n);
  for (auto& name : c->part_names) KT_RETURN_IF_ERROR(r.GetString(&name));
  KT_RETURN_IF_ERROR(r.GetCount(&n, 8, "part values"));
  c->values.resize(n);
  for (auto& v : c->values) KT_RETURN_IF_ERROR(r.GetFloats(&v));
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4, "part slot lists"));
  c->slots.resize(n);
  for (auto& part_slots : c->slots) {
    uint32_t m = 0;
    KT_RETURN_IF_ERROR(r.GetCount(&m, 8, "slots"));
    part_slots.resize(m);
    for (auto& s : part_slots) KT_RETURN_IF_ERROR(r.GetFloats(&s));
  }
  KT_RETURN_IF_ERROR(r.GetCount(&n, 12, "worker clocks"));
  for (uint32_t i = 0; i < n; ++i) {
    int32_t worker = 0;
    int64_t clock = 0;
    KT_RETURN_IF_ERROR(r.GetI32(&worker));
    KT_RETURN_IF_ERROR(r.GetI64(&clock));
    c->worker_clocks[worker] = clock;
  }
  return r.ExpectEnd();
}

}  // namespace

int64_t InMemoryCheckpointSource::NumFloats(size_t part, int slot) const {
  const std::vector<float>& v = slot < 0 ? ckpt_.values[part] : ckpt_.slots[part][slot];
  return static_cast<int64_t>(v.size());
}

int InMemoryCheckpointSource::NumSlots(size_t part) const {
  return static_cast<int>(ckpt_.slots[part].size());
}

void InMemoryCheckpointSource::Read(size_t part, int slot, int64_t begin, int64_t n, float* out) {
  const std::vector<float>& v = slot < 0 ? ckpt_.values[part] : ckpt_.slots[part][slot];
  std::copy_n(v.data() + begin, n, out);
}

ShardCheckpoint ReadAllOf(CheckpointSource& source) {
  ShardCheckpoint c = source.fields();
  const size_t parts = c.part_names.size();
  c.values.assign(parts, {});
  c.slots.assign(parts, {});
  for (size_t p = 0; p < parts; ++p) {
    c.values[p].resize(static_cast<size_t>(source.NumFloats(p, -1)));
    source.Read(p, -1, 0, static_cast<int64_t>(c.values[p].size()), c.values[p].data());
    c.slots[p].resize(static_cast<size_t>(source.NumSlots(p)));
    for (size_t k = 0; k < c.slots[p].size(); ++k) {
      c.slots[p][k].resize(static_cast<size_t>(source.NumFloats(p, static_cast<int>(k))));
      source.Read(p, static_cast<int>(k), 0, static_cast<int64_t>(c.slots[p][k].size()),
                  c.slots[p][k].data());
    }
  }
  return c;
}

std::string ShardCheckpointDir(const std::string& dir, int shard_index) {
  return absl::StrCat(dir, "/ps-", shard_index);
}

namespace {

// A full disk: frees the space of one file that restoring would not use —
// the oldest checkpoint other than the newest valid one (corrupt ones
// count), or a temp file left by a writer that died. Returns what it deleted,
// or "" if there is nothing it may delete.
std::string FreeOneFile(const std::string& shard_dir, FileEnv* env) {
  auto listing = ListShardDir(shard_dir, env);
  if (!listing.ok()) return "";
  std::vector<std::string> candidates;  // oldest first
  for (const auto& [version, name] : listing->temps) candidates.push_back(name);
  bool kept_valid = false;
  std::vector<std::string> older;
  for (const auto& [version, name] : listing->checkpoints) {  // newest first
    if (!kept_valid && ReadShardCheckpoint(absl::StrCat(shard_dir, "/", name)).ok()) {
      kept_valid = true;  // the one a restart would load: never deleted for space
      continue;
    }
    older.push_back(name);
  }
  candidates.insert(candidates.end(), older.rbegin(), older.rend());
  for (const std::string& name : candidates) {
    const std::string path = absl::StrCat(shard_dir, "/", name);
    if (env->DeleteFile(path).ok()) return path;
  }
  return "";
}

}  // namespace

absl::Status WriteShardCheckpoint(const std::string& dir, const ShardCheckpoint& ckpt, int keep,
                                  FileEnv* env,
                                  const std::function<void(const std::string&)>& note) {
  if (ckpt.values.size() != ckpt.part_names.size() || ckpt.slots.size() != ckpt.part_names.size()) {
    const std::string path = absl::StrCat(ShardCheckpointDir(dir, ckpt.shard_index), "/",
                                          CheckpointFileName(ckpt.version));
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", path, ": inconsistent checkpoint: ", ckpt.part_names.size(),
        " part names, ", ckpt.values.size(), " value tensors, ", ckpt.slots.size(), " slot lists"));
  }
  InMemoryCheckpointSource source(ckpt);
  return WriteShardCheckpoint(dir, source, keep, env, note);
}

absl::Status WriteShardCheckpoint(const std::string& dir, CheckpointSource& source, int keep,
                                  FileEnv* env,
                                  const std::function<void(const std::string&)>& note) {
  const ShardCheckpoint& ckpt = source.fields();
  const std::string shard_dir = ShardCheckpointDir(dir, ckpt.shard_index);
  const std::string path = absl::StrCat(shard_dir, "/", CheckpointFileName(ckpt.version));
  if (ckpt.version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": negative version ", ckpt.version));
  }
  // Streamed from `source` to the file: no second copy of the values in memory.
  const auto encode = [&source](BinaryWriter& w) { EncodePayload(source, w); };
  absl::Status written = WriteFramedFile(path, kMagic, kFormatVersion, encode, env);
  // Out of space: make room from older checkpoints, one file at a time, and
  // try again; the newest valid checkpoint is kept whatever happens.
  while (!written.ok() && ErrnoOf(written) == ENOSPC) {
    const std::string freed = FreeOneFile(shard_dir, env);
    if (freed.empty()) break;
    if (note) note(absl::StrCat("out of space: deleted ", freed, " to make room for ", path));
    written = WriteFramedFile(path, kMagic, kFormatVersion, encode, env);
  }
  if (!written.ok()) return written;

  // Prune: keep the newest `keep` checkpoints (always including the new one),
  // and remove temp files left by writers of older versions.
  auto listing = ListShardDir(shard_dir, env);
  if (!listing.ok()) return listing.status();
  const size_t keep_n = static_cast<size_t>(std::max(keep, 1));
  absl::Status result = absl::OkStatus();
  for (size_t i = 0; i < listing->checkpoints.size(); ++i) {
    const auto& [version, name] = listing->checkpoints[i];
    if (i < keep_n || version >= ckpt.version) continue;
    const std::string old = absl::StrCat(shard_dir, "/", name);
    absl::Status deleted = env->DeleteFile(old);
    if (!deleted.ok() && !absl::IsNotFound(deleted) && result.ok()) {
      result = absl::InternalError(
          absl::StrCat("cannot delete old checkpoint ", old, ": ", deleted.message()));
    }
  }
  for (const auto& [version, name] : listing->temps) {
    if (version >= ckpt.version) continue;
    env->DeleteFile(absl::StrCat(shard_dir, "/", name)).IgnoreError();  // best effort
  }
  return result;
}

absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path) {
  // Decoded straight from the file into the vectors: no copy of the file in memory.
  ShardCheckpoint c;
  absl::Status read = ReadFramedFile(
      path, kMagic, kFormatVersion, "checkpoint", [&c, &path](BinaryReader& r) -> absl::Status {
        absl::Status st = DecodePayload(r, &c);
        if (st.ok() || !absl::IsDataLoss(st) || absl::StartsWith(st.message(), path)) {
          return st;
        }
        return absl::DataLossError(absl::StrCat(path, ": corrupt: ", st.message()));
      });
  if (!read.ok()) return read;
  if (c.values.size() != c.part_names.size() || c.slots.size() != c.part_names.size()) {
    return absl::DataLossError(absl::StrCat(path, ": inconsistent: ", c.part_names.size(),
                                            " part names, ", c.values.size(), " value tensors, ",
                                            c.slots.size(), " slot lists"));
  }
  if (c.version < 0) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: negative version ", c.version));
  }
  return c;
}

absl::StatusOr<ShardCheckpoint> RestoreShardCheckpoint(
    const std::string& dir, int shard_index, const std::string& expected_fingerprint,
    const std::string& expected_optimizer, const std::function<void(const std::string&)>& warn) {
  const std::string shard_dir = ShardCheckpointDir(dir, shard_index);
  auto listing = ListShardDir(shard_dir, FileEnv::Default());
  if (!listing.ok()) {
    if (absl::IsNotFound(listing.status())) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint in ", shard_dir, " (directory does not exist)"));
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
        warn(absl::StrCat(path, ": holds version ", ckpt->version, " but is named for version ",
                          version, "; skipped"));
      }
      continue;
    }
    const char* kAdvice =
        ": refusing to load it (delete the checkpoint directory or point checkpoint.directory "
        "elsewhere)";
    if (ckpt->model_fingerprint != expected_fingerprint) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", path, " was written for model/placement ",
                       ckpt->model_fingerprint, ", this job has ", expected_fingerprint, kAdvice));
    }
    if (ckpt->shard_index != shard_index) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", path, " was written for PS shard ", ckpt->shard_index,
                       ", this is shard ", shard_index, kAdvice));
    }
    if (ckpt->optimizer_type != expected_optimizer) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", path, " was written with optimizer \"", ckpt->optimizer_type,
                       "\", this job uses \"", expected_optimizer, "\"", kAdvice));
    }
    return ckpt;
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint in ", shard_dir, " (all ",
                                          listing->checkpoints.size(),
                                          " files were corrupt or unreadable)"));
}

}  // namespace kubetrain
