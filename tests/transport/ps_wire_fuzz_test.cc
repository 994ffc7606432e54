// Issue 9: a bounded fuzz run over the PS wire format, against a real
// kubetrain-ps process on a loopback socket. Each case takes a valid request
// of one of the PS's RPCs, picked evenly (issue 26, item 5: every RPC) -- a
// push stream (dense chunks and rows of the job's fixed and dynamic
// embedding tables), a Pull, GetInfo, a SparsePull of both tables, a
// ListRows page of the dynamic table, Leave, GetStats or Shutdown, as a
// worker, the chief or a reader would send it at the shard's current
// version -- mutates it (fields set to edge values,
// floats to NaN/Inf/huge, bytes flipped, inserted, deleted, messages dropped,
// repeated, swapped, replaced by noise or made oversized, the push cancelled
// instead of half-closed) and sends the bytes. Checked after every case:
//   - no crash: the PS process is still running;
//   - no hang: every RPC is answered within its deadline (a pull that may
//     legitimately wait for a future version gets a short one instead);
//   - every refusal is a code the PS means (INVALID_ARGUMENT,
//     RESOURCE_EXHAUSTED, CANCELLED, PERMISSION_DENIED for a Shutdown from
//     another task than the chief) with a message, never UNKNOWN, INTERNAL
//     or UNIMPLEMENTED;
// and every 64 cases and at the end: a valid pull returns every part in
// full, a valid SparsePull every row of the fixed table and a valid ListRows
// listing every row of the dynamic table, and every parameter is finite; at
// the end a valid step of both workers still advances the version, GetStats
// answers, and the job ends as designed: the chief's Shutdown and both
// workers' Leave, and the PS exits with code 0.
//
// Leave and Shutdown change the job, so the PS gets a shutdown grace longer
// than any run (an accepted Shutdown only answers held pulls at once), and a
// case that would make worker 0 leave (its bytes parse as such, as the PS
// will parse them) is not sent: with both workers gone after a Shutdown the
// PS would end, as it should, before the run does. Worker 1 may leave (a
// left worker's pushes still count).
//
// Bounded by count and time, never judged on speed: it runs at least
// FUZZ_MIN_CASES cases (default 300) and until FUZZ_SECONDS (default 60) have
// passed, at most FUZZ_MAX_CASES (default 200000). FUZZ_SEED repeats a run
// (the seed is printed first; one thread, so a seed replays the same bytes).
// `make fuzz FUZZ_SECONDS=600` runs longer.
//
// The same run against a PS that checks its callers (--auth_dir with the
// job's key, ps/rpc_auth.h) sends each case with metadata picked at random:
// a worker's own token (most cases), the chief's or the exporter's, another
// job's token, a malformed task, or none; UNAUTHENTICATED and
// PERMISSION_DENIED are then codes the PS means too. It runs for
// FUZZ_AUTH_SECONDS (default 15), at least FUZZ_MIN_CASES / 3 cases.
//
// The open PS is started with --insecure (it refuses to run open without).
//
// To fuzz another RPC, add a Target to Targets(): how to build a valid
// request from the shard's state, which fields to set to edge values, and
// how it is sent (unary, server stream or client stream).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/job_credentials.h"
#include "core/testing/temp_files.h"
#include "proto/ps.pb.h"
#include "tests/transport/ps_process.h"
#include "tests/transport/raw_ps_client.h"

namespace kubetrain {
namespace {

constexpr int kWorkers = 2;
constexpr uint64_t kChunkBytes = 4096;
// A deadline no answer of a healthy PS on loopback comes near, even on a
// loaded machine: exceeding it is a hang.
constexpr absl::Duration kHangDeadline = absl::Seconds(60);
// For a pull that may rightly wait (for a version the shard has not reached).
constexpr absl::Duration kHoldDeadline = absl::Milliseconds(200);

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

using Rng = std::mt19937_64;

template <typename T>
T Pick(Rng& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}
bool OneIn(Rng& rng, int n) { return rng() % n == 0; }

int64_t EdgeInt64(Rng& rng, int64_t near) {
  return Pick<int64_t>(
      rng, {0, 1, -1, near, near - 1, near + 1, near + 2, std::numeric_limits<int64_t>::max(),
            std::numeric_limits<int64_t>::min(), int64_t{1} << 32, static_cast<int64_t>(rng())});
}
int32_t EdgeInt32(Rng& rng) {
  return Pick<int32_t>(rng, {0, 1, 2, kWorkers, -1, 3, 99, std::numeric_limits<int32_t>::max(),
                             std::numeric_limits<int32_t>::min()});
}
float EdgeFloat(Rng& rng) {
  return Pick<float>(
      rng, {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity(), 3e38f, -3e38f,
            std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
            std::numeric_limits<float>::denorm_min(), -0.0f, 1e-38f, 1e20f});
}

// What the fuzzer knows of the shard (from its GetInfo).
struct ShardState {
  int64_t version = 0;
  int64_t incarnation = 0;
  std::vector<PartGradient> parts;  // names and sizes; values are a valid gradient
  uint64_t gradient_bytes = 0;
  struct Table {
    std::string name;
    uint64_t rows = 0;  // 0: dynamic
    uint64_t dim = 0;
  };
  std::vector<Table> tables;  // the job's: one fixed, one dynamic
};

// The shard's fixed (rows > 0) or dynamic table.
const ShardState::Table& TableOf(const ShardState& s, bool dynamic) {
  for (const auto& t : s.tables) {
    if ((t.rows == 0) == dynamic) return t;
  }
  return s.tables.front();
}

// A valid id of `t`: a fixed table's row, or a dynamic table's id from a
// small set (so rows are reused, created and evicted past maxRows).
uint64_t ValidId(Rng& rng, const ShardState::Table& t) {
  return t.rows > 0 ? rng() % t.rows : (rng() % 96) * 0x9e3779b97f4a7c1ULL % (uint64_t{1} << 63);
}

uint64_t EdgeId(Rng& rng, const ShardState::Table& t) {
  return Pick<uint64_t>(rng, {t.rows, t.rows + 1, ~uint64_t{0}, uint64_t{1} << 63,
                              (uint64_t{1} << 63) - 1, uint64_t{1} << 32, 0, rng()});
}

// Valid rows of `t`: a few ids and, `with_data` (a push's gradient rows),
// dim small floats per id.
v1::SparseRows ValidRows(Rng& rng, const ShardState::Table& t, bool with_data) {
  v1::SparseRows rows;
  rows.set_table(t.name);
  const int n = 1 + static_cast<int>(rng() % 6);
  std::vector<float> data;
  for (int i = 0; i < n; ++i) {
    rows.add_ids(ValidId(rng, t));
    for (uint64_t k = 0; k < t.dim; ++k) {
      data.push_back(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-4f);
    }
  }
  if (with_data) rows.set_data(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  return rows;
}

// Field-level damage to table rows (a push's or a sparse pull's).
void MutateRows(Rng& rng, const ShardState& s, v1::SparseRows* rows, std::string* what) {
  const ShardState::Table& t = TableOf(s, rows->table() == TableOf(s, true).name);
  switch (rng() % 7) {
    case 0:
      rows->set_table(Pick<std::string>(
          rng, {"", "nope", "embedding.", s.parts[rng() % s.parts.size()].part,
                std::string(5000, 't'), TableOf(s, rows->table() != TableOf(s, true).name).name}));
      absl::StrAppend(what, " table=", rows->table().substr(0, 40));
      break;
    case 1:
      if (rows->ids_size() > 0) rows->set_ids(rng() % rows->ids_size(), EdgeId(rng, t));
      absl::StrAppend(what, " edge id in ", rows->table());
      break;
    case 2:
      if (rows->ids_size() > 0) rows->add_ids(rows->ids(0));  // a repeated id (data one row short)
      absl::StrAppend(what, " repeated id in ", rows->table());
      break;
    case 3: {  // many ids: more than a dynamic table's maxRows
      const int n = Pick<int>(rng, {100, 1000, 20000});
      for (int i = 0; i < n; ++i) rows->add_ids(t.rows > 0 ? rng() % t.rows : rng() >> 1);
      if (!rows->data().empty()) rows->mutable_data()->append(std::string(n * t.dim * 4, '\0'));
      absl::StrAppend(what, " ", n, " more ids in ", rows->table());
      break;
    }
    case 4:
      rows->mutable_data()->resize(
          Pick<size_t>(rng, {0, 1, rows->data().size() + 4, rows->data().size() + 3,
                             rows->data().size() > 4 ? rows->data().size() - 4 : 0}));
      absl::StrAppend(what, " data of ", rows->data().size(), " bytes in ", rows->table());
      break;
    case 5:
      rows->clear_ids();
      absl::StrAppend(what, " no ids in ", rows->table());
      break;
    default:  // edge floats
      for (size_t k = 0; k + 4 <= rows->data().size(); k += 4) {
        if (!OneIn(rng, 3)) continue;
        const float f = EdgeFloat(rng);
        std::memcpy(rows->mutable_data()->data() + k, &f, 4);
      }
      absl::StrAppend(what, " edge floats in ", rows->table());
      break;
  }
}

// One request to send.
struct Case {
  enum class Kind { kUnary, kPull, kPush };
  Kind kind = Kind::kUnary;
  std::string method;
  std::vector<std::string> messages;  // one for unary and pull
  RawPsClient::End end = RawPsClient::End::kHalfClose;
  bool may_hold = false;  // a pull that may wait for a later version
  std::string what;       // the mutations, for the failure message
};

// A valid request of one RPC, with field-level mutations of its own.
struct Target {
  const char* name;
  // A valid request, then (with `mutate`) some fields set to edge values.
  std::function<Case(Rng&, const ShardState&, bool mutate)> make;
  // A refusal this RPC means even from an open PS (Shutdown from another
  // task than the chief: PERMISSION_DENIED); OK otherwise.
  grpc::StatusCode also_meant = grpc::StatusCode::OK;
};

v1::PushRequest::Header ValidPushHeader(Rng& rng, const ShardState& s, int worker) {
  v1::PushRequest::Header h;
  h.set_worker_index(worker);
  h.set_version(s.version);
  h.set_worker_clock(s.version + 1);
  h.set_incarnation(s.incarnation);
  h.set_push_id(rng() | 1);
  h.set_total_bytes(s.gradient_bytes);
  return h;
}

Case MakePush(Rng& rng, const ShardState& s, bool mutate) {
  Case c;
  c.kind = Case::Kind::kPush;
  c.method = "Push";
  v1::PushRequest::Header h = ValidPushHeader(rng, s, static_cast<int>(rng() % kWorkers));
  std::vector<PartGradient> grads = s.parts;
  for (auto& g : grads) {
    for (float& f : g.values) f = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-4f;
  }
  if (mutate) {
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) {
      switch (rng() % 8) {
        case 0:
          h.set_worker_index(EdgeInt32(rng));
          absl::StrAppend(&c.what, " worker_index=", h.worker_index());
          break;
        case 1:
          h.set_version(EdgeInt64(rng, s.version));
          absl::StrAppend(&c.what, " version=", h.version());
          break;
        case 2:
          h.set_worker_clock(EdgeInt64(rng, s.version));
          absl::StrAppend(&c.what, " worker_clock=", h.worker_clock());
          break;
        case 3:
          h.set_incarnation(EdgeInt64(rng, s.incarnation));
          absl::StrAppend(&c.what, " incarnation=", h.incarnation());
          break;
        case 4:
          h.set_push_id(Pick<uint64_t>(rng, {0, 1, rng()}));
          absl::StrAppend(&c.what, " push_id=", h.push_id());
          break;
        case 5:
          h.set_total_bytes(Pick<uint64_t>(rng, {0, s.gradient_bytes - 4, s.gradient_bytes + 4,
                                                 s.gradient_bytes + 1, 1, ~uint64_t{0}, rng()}));
          absl::StrAppend(&c.what, " total_bytes=", h.total_bytes());
          break;
        default: {  // edge floats in the gradient
          auto& g = grads[rng() % grads.size()];
          const int k = 1 + static_cast<int>(rng() % 8);
          for (int j = 0; j < k; ++j) g.values[rng() % g.values.size()] = EdgeFloat(rng);
          absl::StrAppend(&c.what, " edge floats in ", g.part);
          break;
        }
      }
    }
  }
  c.messages = EncodePush(h, grads, kChunkBytes / 4);
  // Gradient rows of the tables (none, one or both), anywhere after the header.
  for (const auto& t : s.tables) {
    if (OneIn(rng, 3)) continue;
    v1::PushRequest m;
    *m.mutable_sparse() = ValidRows(rng, t, true);
    if (mutate && OneIn(rng, 2)) MutateRows(rng, s, m.mutable_sparse(), &c.what);
    c.messages.insert(c.messages.begin() + 1 + rng() % c.messages.size(), m.SerializeAsString());
  }
  if (mutate && OneIn(rng, 3)) {  // a chunk's own fields
    v1::PushRequest m;
    const size_t i = 1 + rng() % (c.messages.size() - 1);
    if (m.ParseFromString(c.messages[i]) && m.has_chunk()) {  // not a table's rows
      auto* chunk = m.mutable_chunk();
      switch (rng() % 4) {
        case 0:
          chunk->set_part(Pick<std::string>(
              rng, {"", "nope", s.parts[rng() % s.parts.size()].part, std::string(5000, 'x')}));
          break;
        case 1:
          chunk->set_offset(Pick<uint64_t>(rng, {chunk->offset() + 1, ~uint64_t{0}, 1u << 31,
                                                 chunk->offset() + kChunkBytes / 4}));
          break;
        case 2:
          chunk->mutable_data()->resize(chunk->data().size() - 1 - rng() % 3);
          break;
        default:
          chunk->mutable_data()->append(std::string(4 * (1 + rng() % 4), '\x7f'));
          break;
      }
      c.messages[i] = m.SerializeAsString();
      absl::StrAppend(&c.what, " chunk ", i, " fields");
    }
  }
  if (mutate && OneIn(rng, 6)) {  // a second header somewhere
    v1::PushRequest m;
    *m.mutable_header() = ValidPushHeader(rng, s, 0);
    c.messages.insert(c.messages.begin() + 1 + rng() % c.messages.size(), m.SerializeAsString());
    c.what += " second header";
  }
  if (mutate && OneIn(rng, 5)) {
    c.end = RawPsClient::End::kCancel;
    c.what += " cancelled";
  }
  return c;
}

Case MakePull(Rng& rng, const ShardState& s, bool mutate) {
  Case c;
  c.kind = Case::Kind::kPull;
  c.method = "Pull";
  v1::PullRequest r;
  r.set_worker_index(static_cast<int>(rng() % kWorkers));
  r.set_min_version(OneIn(rng, 2) ? s.version : 0);
  r.set_worker_clock(s.version);
  r.set_incarnation(s.incarnation);
  r.set_wait_timeout_ms(1000);
  if (mutate) {
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) {
      switch (rng() % 6) {
        case 0:
          r.set_worker_index(EdgeInt32(rng));
          absl::StrAppend(&c.what, " worker_index=", r.worker_index());
          break;
        case 1:
          r.set_min_version(EdgeInt64(rng, s.version));
          absl::StrAppend(&c.what, " min_version=", r.min_version());
          break;
        case 2:
          r.set_worker_clock(EdgeInt64(rng, s.version));
          absl::StrAppend(&c.what, " worker_clock=", r.worker_clock());
          break;
        case 3:
          r.set_wait_timeout_ms(EdgeInt64(rng, 1000));
          absl::StrAppend(&c.what, " wait_timeout_ms=", r.wait_timeout_ms());
          break;
        case 4:
          r.set_incarnation(EdgeInt64(rng, s.incarnation));
          absl::StrAppend(&c.what, " incarnation=", r.incarnation());
          break;
        default:
          r.set_task_type(static_cast<v1::TaskType>(EdgeInt32(rng)));
          absl::StrAppend(&c.what, " task_type=", static_cast<int>(r.task_type()));
          break;
      }
    }
  }
  c.messages = {r.SerializeAsString()};
  return c;
}

Case MakeGetInfo(Rng& rng, const ShardState&, bool mutate) {
  Case c;
  c.method = "GetInfo";
  v1::InfoRequest r;
  r.set_worker_index(static_cast<int>(rng() % kWorkers));
  if (mutate) {
    if (OneIn(rng, 2)) r.set_worker_index(EdgeInt32(rng));
    if (OneIn(rng, 2)) r.set_task_type(static_cast<v1::TaskType>(EdgeInt32(rng)));
    absl::StrAppend(&c.what, " worker_index=", r.worker_index(),
                    " task_type=", static_cast<int>(r.task_type()));
  }
  c.messages = {r.SerializeAsString()};
  return c;
}

// Fields every unary request of a task has: worker_index and task_type.
template <typename Request>
void MutateTask(Rng& rng, Request* r, std::string* what) {
  if (OneIn(rng, 2)) r->set_worker_index(EdgeInt32(rng));
  if (OneIn(rng, 2)) r->set_task_type(static_cast<v1::TaskType>(EdgeInt32(rng)));
  absl::StrAppend(what, " worker_index=", r->worker_index(),
                  " task_type=", static_cast<int>(r->task_type()));
}

Case MakeSparsePull(Rng& rng, const ShardState& s, bool mutate) {
  Case c;
  c.method = "SparsePull";
  v1::SparsePullRequest r;
  r.set_worker_index(static_cast<int>(rng() % kWorkers));
  r.set_read_only(OneIn(rng, 3));
  for (const auto& t : s.tables) {
    if (!OneIn(rng, 4)) *r.add_tables() = ValidRows(rng, t, false);
  }
  if (mutate) {
    switch (rng() % 4) {
      case 0:
        MutateTask(rng, &r, &c.what);
        break;
      case 1: {  // ids and rows: data in a request, many ids, edge ids
        v1::SparseRows rows = ValidRows(rng, s.tables[rng() % s.tables.size()], OneIn(rng, 2));
        MutateRows(rng, s, &rows, &c.what);
        *r.add_tables() = rows;
        break;
      }
      case 2:  // the same table twice
        if (r.tables_size() > 0) *r.add_tables() = r.tables(0);
        c.what += " a table twice";
        break;
      default:
        r.set_read_only(!r.read_only());
        c.what += " read_only flipped";
        break;
    }
  }
  c.messages = {r.SerializeAsString()};
  return c;
}

Case MakeListRows(Rng& rng, const ShardState& s, bool mutate) {
  Case c;
  c.method = "ListRows";
  v1::ListRowsRequest r;
  r.set_worker_index(static_cast<int>(rng() % kWorkers));
  r.set_table(TableOf(s, true).name);
  r.set_cursor(Pick<uint64_t>(rng, {0, 0, 1, 10, 63}));
  r.set_max_rows(Pick<uint64_t>(rng, {0, 1, 16, 100}));
  if (mutate) {
    switch (rng() % 4) {
      case 0:
        MutateTask(rng, &r, &c.what);
        break;
      case 1:
        r.set_table(
            Pick<std::string>(rng, {"", "nope", TableOf(s, false).name,
                                    s.parts[rng() % s.parts.size()].part, std::string(5000, 't')}));
        absl::StrAppend(&c.what, " table=", r.table().substr(0, 40));
        break;
      case 2:
        r.set_cursor(Pick<uint64_t>(rng, {~uint64_t{0}, uint64_t{1} << 63, (uint64_t{1} << 63) - 1,
                                          uint64_t{1} << 32, rng()}));
        absl::StrAppend(&c.what, " cursor=", r.cursor());
        break;
      default:
        r.set_max_rows(Pick<uint64_t>(rng, {~uint64_t{0}, uint64_t{1} << 63,
                                            (uint64_t{1} << 63) - 1, uint64_t{1} << 32, rng()}));
        absl::StrAppend(&c.what, " max_rows=", r.max_rows());
        break;
    }
  }
  c.messages = {r.SerializeAsString()};
  return c;
}

Case MakeLeave(Rng& rng, const ShardState&, bool mutate) {
  Case c;
  c.method = "Leave";
  v1::LeaveRequest r;
  r.set_worker_index(1);  // worker 0 never leaves (see the file comment)
  if (mutate) MutateTask(rng, &r, &c.what);
  c.messages = {r.SerializeAsString()};
  return c;
}

Case MakeGetStats(Rng& rng, const ShardState&, bool mutate) {
  Case c;
  c.method = "GetStats";
  v1::InfoRequest r;
  r.set_worker_index(static_cast<int>(rng() % kWorkers));
  if (mutate) MutateTask(rng, &r, &c.what);
  c.messages = {r.SerializeAsString()};
  return c;
}

Case MakeShutdown(Rng& rng, const ShardState&, bool mutate) {
  Case c;
  c.method = "Shutdown";
  v1::ShutdownRequest r;
  r.set_worker_index(0);  // the chief's duties: worker 0 (the job has no Chief)
  if (mutate) MutateTask(rng, &r, &c.what);
  c.messages = {r.SerializeAsString()};
  return c;
}

// Whether the PS would take `c` as worker 0's Leave (parsed as it will).
bool LeavesWorkerZero(const Case& c) {
  v1::LeaveRequest r;
  // A unary call sends messages[0] (a byte mutation may have repeated it).
  return c.method == "Leave" && !c.messages.empty() && r.ParseFromString(c.messages[0]) &&
         r.task_type() == v1::TASK_TYPE_WORKER && r.worker_index() == 0;
}

std::vector<Target> Targets() {
  return {
      {"push", MakePush},         {"pull", MakePull},
      {"getinfo", MakeGetInfo},   {"sparsepull", MakeSparsePull},
      {"listrows", MakeListRows}, {"leave", MakeLeave},
      {"getstats", MakeGetStats}, {"shutdown", MakeShutdown, grpc::StatusCode::PERMISSION_DENIED}};
}

// Byte-level damage to the encoded messages.
void MutateBytes(Rng& rng, Case* c) {
  auto& msgs = c->messages;
  const size_t i = rng() % msgs.size();
  std::string& m = msgs[i];
  const int op = static_cast<int>(rng() % 12);
  absl::StrAppend(&c->what, " bytes:", op, "@", i);
  switch (op) {
    case 0:
      if (!m.empty()) m[rng() % m.size()] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:
      if (!m.empty()) m[rng() % m.size()] = Pick<char>(rng, {'\0', '\xff', '\x7f', '\x80', '\x0a'});
      break;
    case 2: {
      std::string noise(1 + rng() % 16, '\0');
      for (char& ch : noise) ch = static_cast<char>(rng());
      m.insert(m.empty() ? 0 : rng() % m.size(), noise);
      break;
    }
    case 3:
      if (!m.empty()) {
        const size_t at = rng() % m.size();
        m.erase(at, 1 + rng() % std::min<size_t>(16, m.size() - at));
      }
      break;
    case 4:
      m.resize(m.empty() ? 0 : rng() % m.size());  // truncated
      break;
    case 5: {
      std::string noise(rng() % 64, '\0');
      for (char& ch : noise) ch = static_cast<char>(rng());
      m = noise;  // replaced by noise
      break;
    }
    case 6:
      m.clear();
      break;
    case 7:  // larger than the PS takes in one message
      m.append(std::string(kChunkBytes + (80 << 10), '\x11'));
      break;
    case 8:
      if (msgs.size() > 1) msgs.erase(msgs.begin() + i);  // dropped
      break;
    case 9:
      msgs.insert(msgs.begin() + i, msgs[i]);  // repeated
      break;
    case 10:
      if (msgs.size() > 1) std::swap(msgs[i], msgs[rng() % msgs.size()]);
      break;
    default:
      // A varint length made huge: the field claims more bytes than follow.
      if (m.size() > 2) m[1] = '\xff';
      break;
  }
}

// The metadata a case is sent with against a PS that checks its callers.
RawPsClient::Metadata CallerMetadata(Rng& rng, const std::string& job_key,
                                     const std::string& other_job_key, std::string* what) {
  auto as = [](const std::string& key, const std::string& type, int index) {
    return RawPsClient::Metadata{
        {kTaskMetadataKey, TaskMetadataValue(type, index)},
        {kAuthorizationMetadataKey, kBearerPrefix + TaskToken(key, type, index)}};
  };
  switch (rng() % 10) {
    case 0:
      *what += " as chief/0";
      return as(job_key, "chief", 0);
    case 1:
      *what += " as exporter/0";
      return as(job_key, "exporter", 0);
    case 2:
      *what += " with another job's token";
      return as(other_job_key, "worker", static_cast<int>(rng() % kWorkers));
    case 3: {
      *what += " with a malformed task";
      RawPsClient::Metadata m = as(job_key, "worker", 0);
      m[0].second = Pick<std::string>(
          rng, {"", "worker", "worker/", "worker/-1", "ps/0", "worker/0/0", std::string(300, 'w')});
      return m;
    }
    case 4:
      *what += " without credentials";
      return {};
    default: {
      const int w = static_cast<int>(rng() % kWorkers);
      return as(job_key, "worker", w);  // a worker's own token: the common case
    }
  }
}

class PsWireFuzzTest : public ::testing::Test {
 protected:
  // `authenticated`: the PS gets a job key (--auth_dir) and checks every call.
  void StartPs(bool authenticated) {
    std::vector<std::string> args;
    if (authenticated) {
      auto job = GenerateJobCredentials("wire-fuzz", false);
      auto other = GenerateJobCredentials("wire-fuzz", false);
      ASSERT_TRUE(job.ok() && other.ok());
      job_key_ = job->job_key;
      other_job_key_ = other->job_key;
      const std::string dir = NewTestDir("fuzz-auth");
      ASSERT_TRUE(WriteTaskCredentials(dir, CredentialsForTask(*job, "ps", 0)).ok());
      args.push_back("--auth_dir=" + dir);
    } else {
      args.push_back("--insecure");  // open: any client is served
    }
    // An accepted Shutdown must not end the run (see the file comment).
    args.push_back("--shutdown_grace_seconds=100000000");
    ps_ = std::make_unique<PsProcess>(
        "ps/kubetrain-ps",
        absl::StrCat("apiVersion: kubetrain.io/v1\n"
                     "kind: TrainingJob\n"
                     "metadata:\n  name: wire-fuzz\n"
                     "spec:\n  replicaSpecs:\n    PS:\n      replicas: 1\n"
                     "    Worker:\n      replicas: ",
                     kWorkers,
                     "\n"
                     "  training:\n    mode: sync\n"
                     // A fixed table (8 rows) and a dynamic one (at most 64).
                     "    model:\n"
                     "      embeddings:\n"
                     "        - {column: color, dim: 4}\n"
                     "        - {column: ad, dim: 4, maxRows: 64}\n"
                     "      layers:\n"
                     "        - {type: dense, units: 8, activation: relu}\n"
                     "        - {type: dense, units: 2}\n"
                     // Plain SGD with a large rate: huge gradients reach
                     // huge values fast, the edge a non-finite update is on.
                     "    optimizer:\n      type: sgd\n      learningRate: 0.5\n"
                     "    batchSize: 32\n    steps: 100000000\n"
                     "    transport:\n      chunkBytes: ",
                     kChunkBytes,
                     "\n"
                     "    dataset:\n"
                     "      format: csv\n"
                     "      trainFiles: [/nonexistent/train.csv]\n"  // the PS reads no data
                     "      testFiles: [/nonexistent/test.csv]\n"
                     "      columns:\n"
                     "        - {name: x, type: numeric}\n"
                     "        - {name: color, type: categorical, vocabulary: [a, b, c, d, e, f, g, "
                     "h]}\n"
                     "        - {name: ad, type: categorical, dynamic: true}\n"
                     "        - {name: label, type: label, classes: [\"0\", \"1\"]}\n"),
        kWorkers, args);
    ASSERT_TRUE(ps_->started()) << "cannot start ps/kubetrain-ps";
    channel_ = grpc::CreateChannel(ps_->address(), grpc::InsecureChannelCredentials());
    raw_ = std::make_unique<RawPsClient>(channel_, Worker(0));
    // The PS takes a moment to listen.
    absl::Status st;
    for (int i = 0; i < 600; ++i) {
      st = Refresh();
      if (st.ok() || !ps_->Running()) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_FALSE(state_.parts.empty());
    ASSERT_EQ(state_.tables.size(), 2u);
    ASSERT_NE(TableOf(state_, false).rows, 0u);
    ASSERT_EQ(TableOf(state_, true).rows, 0u);
  }

  // The shard's state from a valid GetInfo.
  absl::Status Refresh() {
    std::string out;
    grpc::Status s =
        raw_->Unary("GetInfo", v1::InfoRequest().SerializeAsString(), &out, absl::Seconds(5));
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("GetInfo: ", s.error_message()));
    v1::ShardInfo info;
    if (!info.ParseFromString(out)) return absl::DataLossError("GetInfo: unparseable answer");
    state_.version = info.version();
    state_.incarnation = info.incarnation();
    if (state_.parts.empty()) {
      for (const auto& p : info.parts()) {
        state_.parts.push_back({p.name(), std::vector<float>(p.rows() * p.cols(), 0.0f)});
        state_.gradient_bytes += p.rows() * p.cols() * 4;
      }
      for (const auto& t : info.tables()) state_.tables.push_back({t.name(), t.rows(), t.dim()});
    }
    return absl::OkStatus();
  }

  // A valid SparsePull of every row of the fixed table and a valid listing
  // of the dynamic one: every row in full, every value finite.
  absl::Status CheckTables(const std::string& when) {
    auto finite = [](const std::string& d) {
      for (size_t k = 0; k + 4 <= d.size(); k += 4) {
        float f;
        std::memcpy(&f, d.data() + k, 4);
        if (!std::isfinite(f)) return false;
      }
      return true;
    };
    const ShardState::Table& fixed = TableOf(state_, false);
    v1::SparsePullRequest pull;
    pull.set_read_only(true);
    v1::SparseRows* ids = pull.add_tables();
    ids->set_table(fixed.name);
    for (uint64_t id = 0; id < fixed.rows; ++id) ids->add_ids(id);
    std::string out;
    grpc::Status s = raw_->Unary("SparsePull", pull.SerializeAsString(), &out, kHangDeadline);
    v1::SparsePullResponse rows;
    if (!s.ok() || !rows.ParseFromString(out) || rows.tables_size() != 1) {
      return absl::InternalError(absl::StrCat(
          when, ": a valid sparse pull failed: ", s.error_code(), " ", s.error_message()));
    }
    if (rows.tables(0).data().size() != fixed.rows * fixed.dim * 4 ||
        !finite(rows.tables(0).data())) {
      return absl::InternalError(absl::StrCat(when, ": the fixed table's ",
                                              rows.tables(0).data().size(),
                                              " bytes are not its rows, or not finite"));
    }
    const ShardState::Table& dynamic = TableOf(state_, true);
    uint64_t cursor = 0, total = 0, generation = 0, listed_rows = 0;
    for (int page = 0;; ++page) {
      if (page > 1000) return absl::InternalError(absl::StrCat(when, ": endless listing"));
      v1::ListRowsRequest list;
      list.set_table(dynamic.name);
      list.set_cursor(cursor);
      list.set_max_rows(32);
      s = raw_->Unary("ListRows", list.SerializeAsString(), &out, kHangDeadline);
      v1::ListRowsResponse listed;
      if (!s.ok() || !listed.ParseFromString(out)) {
        return absl::InternalError(absl::StrCat(
            when, ": a valid list of rows failed: ", s.error_code(), " ", s.error_message()));
      }
      if (listed.rows().data().size() !=
              static_cast<uint64_t>(listed.rows().ids_size()) * dynamic.dim * 4 ||
          !finite(listed.rows().data())) {
        return absl::InternalError(absl::StrCat(when, ": a page of the dynamic table's rows is ",
                                                listed.rows().data().size(), " bytes for ",
                                                listed.rows().ids_size(), " ids, or not finite"));
      }
      // One listing (nothing else calls meanwhile) holds every row once.
      if (page == 0) {
        total = listed.total_rows();
        generation = listed.generation();
      }
      listed_rows += listed.rows().ids_size();
      if (listed.generation() != generation || listed.total_rows() != total) {
        return absl::InternalError(absl::StrCat(when, ": the dynamic table changed while listed"));
      }
      if (listed.done()) break;
      cursor = listed.next_cursor();
    }
    // Past maxRows only while the last call's own ids hold it there
    // (ps/dynamic_table.h); never more than a few calls' worth.
    if (listed_rows != total || total > 64 + 20000 * 4) {
      return absl::InternalError(absl::StrCat(when, ": listed ", listed_rows,
                                              " rows of the dynamic table, which holds ", total));
    }
    return absl::OkStatus();
  }

  // A valid pull: every part in full, every value finite.
  absl::Status CheckValues(const std::string& when) {
    v1::PullRequest req;
    req.set_incarnation(state_.incarnation);  // min_version 0: answered at once (sync)
    std::vector<std::string> msgs;
    grpc::Status s = raw_->Pull(req.SerializeAsString(), &msgs, kHangDeadline);
    if (!s.ok()) {
      return absl::InternalError(
          absl::StrCat(when, ": a valid pull failed: ", s.error_code(), " ", s.error_message()));
    }
    uint64_t bytes = 0;
    int64_t nonfinite = 0;
    for (size_t i = 1; i < msgs.size(); ++i) {
      v1::PullResponse m;
      if (!m.ParseFromString(msgs[i]) || !m.has_chunk()) {
        return absl::InternalError(absl::StrCat(when, ": pull message ", i, " is not a chunk"));
      }
      const std::string& d = m.chunk().data();
      bytes += d.size();
      for (size_t k = 0; k + 4 <= d.size(); k += 4) {
        float f;
        std::memcpy(&f, d.data() + k, 4);
        if (!std::isfinite(f)) ++nonfinite;
      }
    }
    if (bytes != state_.gradient_bytes) {
      return absl::InternalError(absl::StrCat(when, ": a valid pull carried ", bytes,
                                              " bytes, not ", state_.gradient_bytes));
    }
    if (nonfinite > 0) {
      return absl::InternalError(absl::StrCat(when, ": ", nonfinite, " non-finite parameters"));
    }
    return absl::OkStatus();
  }

  // Worker `w`'s own credentials (none against an open PS).
  RawPsClient::Metadata Worker(int w) const {
    if (job_key_.empty()) return {};
    return {{kTaskMetadataKey, TaskMetadataValue("worker", w)},
            {kAuthorizationMetadataKey, kBearerPrefix + TaskToken(job_key_, "worker", w)}};
  }

  // Sends `c`, against a PS that checks callers with metadata picked by
  // `rng` (CallerMetadata; described in c->what).
  grpc::Status Send(Rng& rng, Case* c) {
    RawPsClient::Metadata metadata;
    if (!job_key_.empty()) metadata = CallerMetadata(rng, job_key_, other_job_key_, &c->what);
    RawPsClient client(channel_, metadata);
    const absl::Duration deadline = c->may_hold ? kHoldDeadline : kHangDeadline;
    switch (c->kind) {
      case Case::Kind::kUnary:
        return client.Unary(c->method, c->messages[0], nullptr, deadline);
      case Case::Kind::kPull:
        return client.Pull(c->messages[0], nullptr, deadline);
      case Case::Kind::kPush:
        return client.Push(c->messages, c->end, nullptr, nullptr, deadline);
    }
    return grpc::Status::OK;
  }

  // Whether the pull, as the PS will parse it, may wait for a version.
  bool MayHold(const Case& c) const {
    v1::PullRequest r;
    if (!r.ParseFromString(c.messages[0])) return false;
    return r.min_version() > state_.version;
  }

  // The run; `seconds_var` and `min_cases` bound it (see the file comment).
  void Fuzz(const char* seconds_var, int64_t default_seconds, int64_t min_cases);

  std::unique_ptr<PsProcess> ps_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<RawPsClient> raw_;  // as worker 0
  std::string job_key_;               // empty: an open PS
  std::string other_job_key_;
  ShardState state_;
};

TEST_F(PsWireFuzzTest, MutatedCallsOfEveryRpcNeverCrashHangOrPoisonTheShard) {
  StartPs(false);
  Fuzz("FUZZ_SECONDS", 60, EnvInt("FUZZ_MIN_CASES", 300));
}

TEST_F(PsWireFuzzTest, AnAuthenticatedPsToo) {
  StartPs(true);
  Fuzz("FUZZ_AUTH_SECONDS", 15, EnvInt("FUZZ_MIN_CASES", 300) / 3);
}

void PsWireFuzzTest::Fuzz(const char* seconds_var, int64_t default_seconds, int64_t min_cases) {
  if (HasFatalFailure()) return;
  const uint64_t seed = static_cast<uint64_t>(
      EnvInt("FUZZ_SEED", static_cast<int64_t>(std::random_device()() & 0x7fffffff)));
  const int64_t max_cases = std::max(min_cases, EnvInt("FUZZ_MAX_CASES", 200000));
  const absl::Duration run_for = absl::Seconds(EnvInt(seconds_var, default_seconds));
  std::printf("ps wire fuzz%s: seed %llu (FUZZ_SEED=%llu repeats it), %lld..%lld cases, %s\n",
              job_key_.empty() ? "" : " (authenticated PS)", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed), static_cast<long long>(min_cases),
              static_cast<long long>(max_cases), absl::FormatDuration(run_for).c_str());
  std::fflush(stdout);
  Rng rng(seed);
  const std::vector<Target> targets = Targets();
  std::vector<std::map<int, int64_t>> codes(targets.size());
  int64_t mutated = 0;
  int64_t vetoed = 0;  // worker 0's Leave, not sent
  const absl::Time start = absl::Now();
  int64_t n = 0;
  for (; n < max_cases && (n < min_cases || absl::Now() - start < run_for); ++n) {
    ASSERT_TRUE(Refresh().ok()) << "case " << n << " (seed " << seed << "): GetInfo failed";
    const size_t t = rng() % targets.size();
    const bool mutate = !OneIn(rng, 8);  // some valid requests keep the shard moving
    Case c = targets[t].make(rng, state_, mutate);
    if (mutate && (c.what.empty() || OneIn(rng, 2))) {
      const int k = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < k; ++i) MutateBytes(rng, &c);
    }
    if (LeavesWorkerZero(c)) {  // see the file comment
      ++vetoed;
      continue;
    }
    mutated += !c.what.empty();
    if (c.kind == Case::Kind::kPull) c.may_hold = MayHold(c);
    const grpc::Status s = Send(rng, &c);
    const std::string where = absl::StrCat("case ", n, " (seed ", seed, ") ", targets[t].name, ":",
                                           c.what.empty() ? " valid" : c.what);
    std::string how;
    ASSERT_TRUE(ps_->Running(&how)) << where << ": the PS died (" << how << ")";
    const grpc::StatusCode code = s.error_code();
    ++codes[t][code];
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ASSERT_TRUE(c.may_hold) << where << ": no answer within "
                              << absl::FormatDuration(kHangDeadline) << " (hang)";
    } else if (code != grpc::StatusCode::OK) {
      const bool refused_caller =
          !job_key_.empty() && (code == grpc::StatusCode::UNAUTHENTICATED ||
                                code == grpc::StatusCode::PERMISSION_DENIED);
      ASSERT_TRUE(code == grpc::StatusCode::INVALID_ARGUMENT ||
                  code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                  code == grpc::StatusCode::CANCELLED || code == targets[t].also_meant ||
                  refused_caller)
          << where << ": answered " << code << " " << s.error_message();
      ASSERT_FALSE(s.error_message().empty()) << where << ": " << code << " without a message";
      if (code == grpc::StatusCode::CANCELLED) {
        // Only the client's own cancel (or a deadline it set) ends a call so.
        ASSERT_TRUE(c.end == RawPsClient::End::kCancel || c.may_hold)
            << where << ": CANCELLED " << s.error_message();
      }
    }
    if (n % 64 == 63) {
      absl::Status v = CheckValues(where);
      ASSERT_TRUE(v.ok()) << v;
      v = CheckTables(where);
      ASSERT_TRUE(v.ok()) << v;
    }
  }
  // Still a working shard: a valid pull, and a valid step of both workers
  // advances the version.
  ASSERT_TRUE(Refresh().ok());
  absl::Status v = CheckValues(absl::StrCat("after ", n, " cases (seed ", seed, ")"));
  ASSERT_TRUE(v.ok()) << v;
  const int64_t before = state_.version;
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<PartGradient> grads = state_.parts;
    RawPsClient worker(channel_, Worker(w));
    grpc::Status s =
        worker.Push(EncodePush(ValidPushHeader(rng, state_, w), grads, kChunkBytes / 4),
                    RawPsClient::End::kHalfClose, nullptr, nullptr, kHangDeadline);
    ASSERT_TRUE(s.ok()) << "valid push of worker " << w << ": " << s.error_message();
  }
  ASSERT_TRUE(Refresh().ok());
  EXPECT_GT(state_.version, before);
  v = CheckValues("after the final step");
  ASSERT_TRUE(v.ok()) << v;
  v = CheckTables("after the final step");
  ASSERT_TRUE(v.ok()) << v;
  std::string out;
  v1::ShardStats stats;
  grpc::Status got =
      raw_->Unary("GetStats", v1::InfoRequest().SerializeAsString(), &out, kHangDeadline);
  ASSERT_TRUE(got.ok() && stats.ParseFromString(out)) << "valid GetStats: " << got.error_message();
  EXPECT_EQ(stats.version(), state_.version);
  // The job ends as designed: the chief's Shutdown, both workers leave, and
  // the PS exits by itself with code 0.
  v1::ShutdownRequest shutdown;
  got = raw_->Unary("Shutdown", shutdown.SerializeAsString(), nullptr, kHangDeadline);
  ASSERT_TRUE(got.ok()) << "valid Shutdown: " << got.error_message();
  for (int w = kWorkers - 1; w >= 0; --w) {
    std::string how;
    ASSERT_TRUE(ps_->Running(&how))
        << "the PS ended (" << how << ") before worker " << w << " left";
    v1::LeaveRequest leave;
    leave.set_worker_index(w);
    got = RawPsClient(channel_, Worker(w))
              .Unary("Leave", leave.SerializeAsString(), nullptr, kHangDeadline);
    ASSERT_TRUE(got.ok()) << "valid Leave of worker " << w << ": " << got.error_message();
  }
  std::string how = "exit code 0";
  const absl::Time left = absl::Now();
  while (ps_->Running(&how) && absl::Now() - left < kHangDeadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(how, "exit code 0") << "after the chief's Shutdown and every worker's Leave";
  std::printf(
      "ps wire fuzz%s: %lld cases (%lld mutated, %lld Leaves of worker 0 not sent) in %s, seed "
      "%llu, shard at version %lld\n",
      job_key_.empty() ? "" : " (authenticated PS)", static_cast<long long>(n),
      static_cast<long long>(mutated), static_cast<long long>(vetoed),
      absl::FormatDuration(absl::Now() - start).c_str(), static_cast<unsigned long long>(seed),
      static_cast<long long>(state_.version));
  for (size_t t = 0; t < targets.size(); ++t) {
    std::string line;
    for (const auto& [code, count] : codes[t]) absl::StrAppend(&line, " code", code, "=", count);
    std::printf("  %s:%s\n", targets[t].name, line.c_str());
  }
}

}  // namespace
}  // namespace kubetrain
