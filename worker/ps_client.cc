#include "worker/ps_client.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/log.h"

namespace kubetrain {

// Runs fn(i) for every i in [0, n) at once: i = 0 on the calling thread, each
// other i on a thread of its own, started once (not per call: a pull and a
// push per step must not pay for thread creation).
class PsClient::Lanes {
 public:
  explicit Lanes(int n) {
    for (int i = 1; i < n; ++i) {
      auto lane = std::make_unique<Lane>();
      lane->index = i;
      lane->thread = std::thread(&Lanes::Loop, lane.get());
      lanes_.push_back(std::move(lane));
    }
  }

  ~Lanes() {
    for (auto& lane : lanes_) {
      absl::MutexLock l(&lane->mu);
      lane->stop = true;
    }
    for (auto& lane : lanes_) lane->thread.join();
  }

  absl::Status Run(const std::function<absl::Status(int)>& fn) {
    for (auto& lane : lanes_) {
      absl::MutexLock l(&lane->mu);
      lane->done = false;
      lane->work = &fn;
    }
    absl::Status first = fn(0);
    for (auto& lane : lanes_) {
      absl::MutexLock l(&lane->mu);
      lane->mu.Await(absl::Condition(&lane->done));
      if (first.ok()) first = lane->result;
    }
    return first;
  }

 private:
  struct Lane {
    int index = 0;
    std::thread thread;
    absl::Mutex mu;
    const std::function<absl::Status(int)>* work ABSL_GUARDED_BY(mu) = nullptr;
    bool done ABSL_GUARDED_BY(mu) = true;
    bool stop ABSL_GUARDED_BY(mu) = false;
    absl::Status result ABSL_GUARDED_BY(mu);
  };

  static void Loop(Lane* lane) {
    while (true) {
      const std::function<absl::Status(int)>* work;
      {
        absl::MutexLock l(&lane->mu);
        lane->mu.Await(absl::Condition(
            +[](Lane* x)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->mu) { return x->work != nullptr || x->stop; },
            lane));
        if (lane->work == nullptr) return;  // stopped
        work = lane->work;
      }
      absl::Status result = (*work)(lane->index);
      absl::MutexLock l(&lane->mu);
      lane->work = nullptr;
      lane->result = std::move(result);
      lane->done = true;
    }
  }

  std::vector<std::unique_ptr<Lane>> lanes_;
};

PsClient::PsClient(Options options, const Placement* placement, const Clock* clock,
                   std::vector<std::unique_ptr<ShardChannel>> channels, PsClientMetrics metrics)
    : options_(std::move(options)),
      placement_(placement),
      clock_(clock),
      channels_(std::move(channels)),
      metrics_(metrics),
      chunk_elements_(static_cast<uint64_t>(std::max<int64_t>(1, options_.chunk_bytes / 4))),
      shard_parts_(channels_.size()),
      parts_by_name_(channels_.size()),
      lanes_(std::make_unique<Lanes>(static_cast<int>(channels_.size()))),
      shards_(channels_.size()),
      // Random per client, so a restarted worker's ids are not its previous life's.
      next_push_id_((static_cast<uint64_t>(std::random_device()()) << 32 | std::random_device()()) |
                    1) {
  for (size_t s = 0; s < channels_.size(); ++s) {
    shard_parts_[s] = placement_->PartsOfShard(static_cast<int>(s));
    for (const PartPlacement* p : shard_parts_[s]) parts_by_name_[s][p->name] = p;
  }
}

PsClient::~PsClient() = default;

std::string PsClient::TaskName() const {
  const char* type = options_.task_type == v1::TASK_TYPE_CHIEF       ? "chief"
                     : options_.task_type == v1::TASK_TYPE_EVALUATOR ? "evaluator"
                     : options_.task_type == v1::TASK_TYPE_EXPORTER  ? "exporter"
                                                                     : "worker";
  return absl::StrCat(type, ":", options_.task_index);
}

absl::Status PsClient::ForEachShard(const std::function<absl::Status(int)>& fn) {
  if (channels_.size() == 1) return fn(0);
  return lanes_->Run(fn);
}

absl::Status PsClient::WithRetry(const std::string& what, int shard,
                                 const std::function<absl::Status()>& fn) {
  absl::Time deadline = clock_->Now() + options_.retry_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  int attempts = 0;
  while (true) {
    if (cancelled_) return absl::CancelledError(absl::StrCat(what, " to ps:", shard, " cancelled"));
    absl::Status s = fn();
    // RESOURCE_EXHAUSTED: the PS's stream limits; an overlapping stream of ours ends soon.
    if (s.code() != absl::StatusCode::kUnavailable &&
        s.code() != absl::StatusCode::kResourceExhausted) {
      return s;
    }
    ++attempts;
    if (clock_->Now() + backoff > deadline) {
      return absl::UnavailableError(absl::StrCat(
          "gave up on ", what, " to ps:", shard, " after ", attempts, " attempts over ",
          absl::FormatDuration(options_.retry_timeout), ": ", s.message()));
    }
    if (attempts == 1 || attempts % 10 == 0) {
      Log(TaskName(), " ", what, " to ps:", shard, " unavailable (", s.message(), "); retrying");
    }
    clock_->SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

PsClient::ShardRestart PsClient::Observe(int s, int64_t incarnation, int64_t version, bool done) {
  ShardState& state = shards_[s];
  ShardRestart restart;
  if (state.incarnation != 0 && incarnation != state.incarnation) {
    restart.restarted = true;
    restart.steps_lost = std::max<int64_t>(0, state.version - version);
    Log(TaskName(), " ps:", s, " restarted: now at version ", version, ", was ", state.version,
        " (", restart.steps_lost, " steps lost)");
  }
  state.incarnation = incarnation;
  state.version = version;
  state.done = done;
  return restart;
}

absl::Status PsClient::Connect() {
  if (static_cast<int>(channels_.size()) != placement_->num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat(channels_.size(), " PS addresses for ", placement_->num_shards, " shards"));
  }
  std::vector<int64_t> clocks(channels_.size(), 0);
  absl::Status st = ForEachShard([&](int s) {
    v1::InfoRequest req;
    req.set_worker_index(options_.task_index);
    req.set_task_type(options_.task_type);
    absl::StatusOr<v1::ShardInfo> info;
    absl::Status st = WithRetry("connect", s, [&] {
      info = channels_[s]->GetInfo(req, absl::Seconds(5));
      // A deadline on the handshake means "not there yet" too.
      if (info.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::UnavailableError(info.status().message());
      }
      return info.status();
    });
    if (!st.ok()) return st;
    if (info->model_fingerprint() != options_.fingerprint || info->shard_index() != s) {
      return absl::FailedPreconditionError(
          absl::StrCat("ps:", s, " holds model/placement ", info->model_fingerprint(), " as shard ",
                       info->shard_index(), ", this task expects ", options_.fingerprint,
                       ": the tasks were started with different TrainingJob specs"));
    }
    shards_[s].incarnation = info->incarnation();
    shards_[s].version = info->version();
    clocks[s] = info->worker_clock();
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  resume_clock_ = *std::max_element(clocks.begin(), clocks.end());
  return absl::OkStatus();
}

absl::StatusOr<PsClient::PullResult> PsClient::Pull(bool next_version, int64_t worker_clock,
                                                    const std::vector<VariableSpec>& variables,
                                                    Params* params) {
  return PullImpl([&](int s) { return next_version ? shards_[s].version + 1 : 0; }, worker_clock,
                  variables, params, options_.hold_timeout, /*reask=*/true);
}

absl::StatusOr<PsClient::PullResult> PsClient::PullAtLeast(
    int64_t version, int64_t worker_clock, const std::vector<VariableSpec>& variables,
    Params* params) {
  return PullImpl([version](int) { return version; }, worker_clock, variables, params,
                  options_.hold_timeout, /*reask=*/true);
}

absl::StatusOr<PsClient::PullResult> PsClient::PullAtLeastWithin(
    int64_t version, absl::Duration hold, const std::vector<VariableSpec>& variables,
    Params* params) {
  return PullImpl([version](int) { return version; }, 0, variables, params,
                  std::max(hold, absl::Milliseconds(1)), /*reask=*/false);
}

v1::PullRequest PsClient::NewPullRequest(int s, int64_t min_version, int64_t worker_clock,
                                         absl::Duration hold) const {
  v1::PullRequest req;
  req.set_worker_index(options_.task_index);
  req.set_task_type(options_.task_type);
  req.set_min_version(min_version);
  if (is_worker()) req.set_worker_clock(worker_clock);
  req.set_incarnation(shards_[s].incarnation);
  req.set_wait_timeout_ms(absl::ToInt64Milliseconds(hold));
  return req;
}

ShardChannel::ChunkSink PsClient::PullSink(int s, Params* params) const {
  return [this, s, params](const PulledChunk& c) -> absl::Status {
    const auto& parts = parts_by_name_[s];
    auto it = parts.find(c.part());
    const uint64_t bytes = c.data_bytes();
    const uint64_t n = bytes / 4;
    const uint64_t elements =
        static_cast<uint64_t>(it == parts.end() ? 0 : it->second->num_elements());
    if (it == parts.end() || bytes % 4 != 0 || c.offset() > elements || n > elements - c.offset()) {
      return absl::DataLossError(absl::StrCat("ps:", s, " sent a bad chunk of \"", c.part(), "\""));
    }
    float* dst = (*params)[it->second->variable].data() + it->second->element_offset() + c.offset();
    c.CopyTo(reinterpret_cast<char*>(dst));
    if (metrics_.pull_bytes) metrics_.pull_bytes->Increment(static_cast<double>(bytes));
    return absl::OkStatus();
  };
}

absl::Status PsClient::PullShard(int s, const v1::PullRequest& req,
                                 const ShardChannel::ChunkSink& sink, bool reask,
                                 v1::PullResponse::Header* header, ShardRestart* restart) {
  while (true) {
    absl::StatusOr<v1::PullResponse::Header> h;
    absl::Status rs = WithRetry("pull", s, [&] {
      h = channels_[s]->Pull(req, sink);
      return h.status();
    });
    if (rs.code() == absl::StatusCode::kDeadlineExceeded) {
      if (cancelled_) return absl::CancelledError(absl::StrCat("pull from ps:", s, " cancelled"));
      if (!reask) return rs;
      Log(TaskName(), " still waiting on ps:", s, " for version ", req.min_version(), " (",
          rs.message(), ")");
      continue;  // the PS let go of a long hold; ask again
    }
    if (!rs.ok()) return rs;
    *header = *h;
    *restart = Observe(s, h->incarnation(), h->version(), h->done());
    return absl::OkStatus();
  }
}

void PsClient::ResizeParams(const std::vector<VariableSpec>& variables, Params* params) {
  params->resize(variables.size());
  for (size_t v = 0; v < variables.size(); ++v) {
    if (!variables[v].table) (*params)[v].resize(variables[v].num_elements());  // tables: PullRows
  }
}

PsClient::PullResult PsClient::SumPulls(const std::vector<v1::PullResponse::Header>& headers,
                                        const std::vector<ShardRestart>& restarts) {
  PullResult r;
  r.version = headers[0].version();
  r.done = true;
  for (size_t s = 0; s < headers.size(); ++s) {
    r.version = std::min<int64_t>(r.version, headers[s].version());
    r.done = r.done && headers[s].done();
    r.waited_seconds = std::max(r.waited_seconds, headers[s].waited_seconds());
    r.absent_workers = std::max(r.absent_workers, headers[s].absent_workers());
    r.steps_lost += restarts[s].steps_lost;
    r.ps_restarts += restarts[s].restarted;
  }
  return r;
}

absl::StatusOr<PsClient::PullResult> PsClient::PullImpl(
    const std::function<int64_t(int)>& min_version, int64_t worker_clock,
    const std::vector<VariableSpec>& variables, Params* params, absl::Duration hold, bool reask) {
  ResizeParams(variables, params);
  std::vector<v1::PullResponse::Header> headers(channels_.size());
  std::vector<ShardRestart> restarts(channels_.size());
  absl::Time start = clock_->Now();
  absl::Status st = ForEachShard([&](int s) {
    return PullShard(s, NewPullRequest(s, min_version(s), worker_clock, hold), PullSink(s, params),
                     reask, &headers[s], &restarts[s]);
  });
  if (!st.ok()) return st;
  if (metrics_.pull_seconds)
    metrics_.pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  return SumPulls(headers, restarts);
}

absl::StatusOr<PsClient::StepResult> PsClient::PollStep() {
  std::vector<v1::ShardInfo> infos(channels_.size());
  std::vector<ShardRestart> restarts(channels_.size());
  absl::Status st = ForEachShard([&](int s) {
    v1::InfoRequest req;
    req.set_worker_index(options_.task_index);
    req.set_task_type(options_.task_type);
    absl::StatusOr<v1::ShardInfo> info;
    absl::Status rs = WithRetry("poll", s, [&] {
      info = channels_[s]->GetInfo(req, absl::Seconds(5));
      if (info.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::UnavailableError(info.status().message());
      }
      return info.status();
    });
    if (!rs.ok()) return rs;
    infos[s] = *info;
    restarts[s] =
        Observe(s, info->incarnation(), info->version(), info->version() >= info->target_steps());
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  StepResult r;
  r.version = infos[0].version();
  r.done = true;
  for (size_t s = 0; s < infos.size(); ++s) {
    r.version = std::min<int64_t>(r.version, infos[s].version());
    r.done = r.done && infos[s].version() >= infos[s].target_steps();
    r.steps_lost += restarts[s].steps_lost;
    r.ps_restarts += restarts[s].restarted;
    r.absent_workers = std::max(r.absent_workers, infos[s].absent_workers());
  }
  return r;
}

absl::StatusOr<PsClient::PushResult> PsClient::Push(const Params& grads, int64_t worker_clock) {
  return Push(grads, worker_clock, TableIds(placement_->tables.size()));
}

absl::Status PsClient::PullRows(const TableIds& ids, Params* params, bool read_only) {
  const auto& tables = placement_->tables;
  const int shards = static_cast<int>(channels_.size());
  if (ids.size() != tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for ", ids.size(), " tables, the model has ", tables.size()));
  }
  // Per shard: per table, the positions (in ids[t]) of the ids it holds.
  std::vector<std::vector<std::vector<size_t>>> where(shards,
                                                      std::vector<std::vector<size_t>>(ids.size()));
  for (size_t t = 0; t < tables.size(); ++t) {
    (*params)[tables[t].variable].resize(ids[t].size() * tables[t].dim);
    for (size_t i = 0; i < ids[t].size(); ++i) {
      where[TableShardOfRow(ids[t][i], shards)][t].push_back(i);
    }
  }
  absl::Time start = clock_->Now();
  absl::Status st = ForEachShard([&](int s) {
    // One request, unless the rows would pass the chunk size: then several.
    std::vector<std::pair<v1::SparsePullRequest, std::vector<size_t>>> requests;  // + table of each
    uint64_t bytes = 0;
    for (size_t t = 0; t < tables.size(); ++t) {
      const auto& pos = where[s][t];
      for (size_t k = 0; k < pos.size(); ++k) {
        const uint64_t row_bytes = tables[t].dim * 4 + 10;
        if (requests.empty() || bytes + row_bytes > static_cast<uint64_t>(options_.chunk_bytes)) {
          requests.emplace_back();
          requests.back().first.set_worker_index(options_.task_index);
          requests.back().first.set_task_type(options_.task_type);
          requests.back().first.set_read_only(read_only);
          bytes = 0;
        }
        auto& [req, table_of] = requests.back();
        if (table_of.empty() || table_of.back() != t || k == 0) {
          req.add_tables()->set_table(tables[t].name);
          table_of.push_back(t);
        }
        req.mutable_tables(req.tables_size() - 1)->add_ids(ids[t][pos[k]]);
        bytes += row_bytes;
      }
    }
    std::vector<size_t> next(tables.size(), 0);  // per table: positions filled so far
    for (const auto& [req, table_of] : requests) {
      absl::StatusOr<v1::SparsePullResponse> resp;
      absl::Status rs = WithRetry("sparse pull", s, [&] {
        resp = channels_[s]->SparsePull(req);
        return resp.status();
      });
      if (!rs.ok()) return rs;
      if (resp->tables_size() != req.tables_size()) {
        return absl::DataLossError(absl::StrCat("ps:", s, " answered a sparse pull of ",
                                                req.tables_size(), " tables with ",
                                                resp->tables_size()));
      }
      for (int j = 0; j < req.tables_size(); ++j) {
        const size_t t = table_of[j];
        const uint64_t dim = tables[t].dim;
        const auto& got = resp->tables(j);
        if (got.data().size() != static_cast<size_t>(req.tables(j).ids_size()) * dim * 4) {
          return absl::DataLossError(absl::StrCat("ps:", s, " sent ", got.data().size(),
                                                  " bytes of rows of ", tables[t].name, " for ",
                                                  req.tables(j).ids_size(), " ids"));
        }
        float* dst = (*params)[tables[t].variable].data();
        const float* src = reinterpret_cast<const float*>(got.data().data());
        for (int k = 0; k < req.tables(j).ids_size(); ++k) {
          std::memcpy(dst + where[s][t][next[t]++] * dim, src + k * dim, dim * 4);
        }
        if (metrics_.sparse_pull_bytes) {
          metrics_.sparse_pull_bytes->Increment(static_cast<double>(got.data().size()));
        }
      }
    }
    return absl::OkStatus();
  });
  if (metrics_.pull_seconds)
    metrics_.pull_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  return st;
}

absl::Status PsClient::PullTables(Params* params) {
  TableIds ids(placement_->tables.size());
  std::vector<std::vector<float>> dynamic(ids.size());  // left as they were
  for (size_t t = 0; t < ids.size(); ++t) {
    const TablePlacement& table = placement_->tables[t];
    if (table.dynamic) {
      dynamic[t] = std::move((*params)[table.variable]);
      continue;
    }
    ids[t].resize(table.rows);
    for (int64_t r = 0; r < table.rows; ++r) ids[t][r] = r;
  }
  absl::Status pulled = PullRows(ids, params, /*read_only=*/true);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (placement_->tables[t].dynamic) {
      (*params)[placement_->tables[t].variable] = std::move(dynamic[t]);
    }
  }
  return pulled;
}

v1::ListRowsRequest PsClient::NewListRowsRequest(int table, uint64_t max_rows) const {
  v1::ListRowsRequest req;
  req.set_worker_index(options_.task_index);
  req.set_task_type(options_.task_type);
  req.set_table(placement_->tables[table].name);
  req.set_max_rows(max_rows);
  return req;
}

absl::StatusOr<int64_t> PsClient::CountRows(int table) {
  int64_t rows = 0;
  const v1::ListRowsRequest req = NewListRowsRequest(table, 0);
  for (int s = 0; s < static_cast<int>(channels_.size()); ++s) {
    absl::StatusOr<v1::ListRowsResponse> resp;
    absl::Status rs = WithRetry("list rows", s, [&] {
      resp = channels_[s]->ListRows(req);
      return resp.status();
    });
    if (!rs.ok()) return rs;
    rows += static_cast<int64_t>(resp->total_rows());
  }
  return rows;
}

absl::Status PsClient::ListRows(int table, const RowsPage& page) {
  const TablePlacement& t = placement_->tables[table];
  const uint64_t dim = static_cast<uint64_t>(t.dim);
  for (int s = 0; s < static_cast<int>(channels_.size()); ++s) {
    // A page's values and ids fit in one message of the chunk size.
    v1::ListRowsRequest req = NewListRowsRequest(
        table, std::max<uint64_t>(1, static_cast<uint64_t>(options_.chunk_bytes) / (dim * 4 + 10)));
    uint64_t generation = 0, listed = 0;
    int64_t incarnation = 0;
    for (bool first = true;; first = false) {
      absl::StatusOr<v1::ListRowsResponse> resp;
      absl::Status rs = WithRetry("list rows", s, [&] {
        resp = channels_[s]->ListRows(req);
        return resp.status();
      });
      if (!rs.ok()) return rs;
      if (!first && (resp->generation() != generation || resp->incarnation() != incarnation)) {
        return absl::AbortedError(
            absl::StrCat("the rows of ", t.name, " on ps:", s, " changed while they were listed"));
      }
      generation = resp->generation();
      incarnation = resp->incarnation();
      const auto& rows = resp->rows();
      if (rows.data().size() != static_cast<size_t>(rows.ids_size()) * dim * 4) {
        return absl::DataLossError(absl::StrCat("ps:", s, " listed ", rows.ids_size(), " rows of ",
                                                t.name, " with ", rows.data().size(),
                                                " bytes of values"));
      }
      const std::vector<int64_t> ids(rows.ids().begin(), rows.ids().end());
      std::vector<float> values(rows.data().size() / 4);  // aligned
      std::memcpy(values.data(), rows.data().data(), rows.data().size());
      page(ids.data(), values.data(), rows.ids_size());
      listed += static_cast<uint64_t>(rows.ids_size());
      if (metrics_.sparse_pull_bytes) {
        metrics_.sparse_pull_bytes->Increment(static_cast<double>(rows.data().size()));
      }
      if (resp->done()) {
        if (listed != resp->total_rows()) {
          return absl::AbortedError(absl::StrCat("ps:", s, " listed ", listed, " rows of ", t.name,
                                                 ", it holds ", resp->total_rows()));
        }
        break;
      }
      req.set_cursor(resp->next_cursor());
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::SplitSparse(const Params& grads, const TableIds& ids,
                                   SparseGradients* out) const {
  if (absl::Status s = PlanSparse(ids, out); !s.ok()) return s;
  for (int s = 0; s < static_cast<int>(channels_.size()); ++s) {
    if (absl::Status st = FillSparse(s, grads, ids, out); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status PsClient::PlanSparse(const TableIds& ids, SparseGradients* out) const {
  const auto& tables = placement_->tables;
  if (ids.size() != tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for ", ids.size(), " tables, the model has ", tables.size()));
  }
  const int shards = static_cast<int>(channels_.size());
  // Per shard and table: the ids it holds and room for their gradient rows,
  // contiguous (one message each), filled by FillSparse.
  out->ids.assign(shards, std::vector<std::vector<uint64_t>>(tables.size()));
  out->rows.assign(shards, std::vector<std::vector<float>>(tables.size()));
  out->positions.assign(shards, std::vector<std::vector<size_t>>(tables.size()));
  for (size_t t = 0; t < tables.size(); ++t) {
    for (size_t i = 0; i < ids[t].size(); ++i) {
      const int s = TableShardOfRow(ids[t][i], shards);
      out->ids[s][t].push_back(static_cast<uint64_t>(ids[t][i]));
      out->positions[s][t].push_back(i);
    }
    for (int s = 0; s < shards; ++s) out->rows[s][t].resize(out->ids[s][t].size() * tables[t].dim);
  }
  out->refs.assign(shards, {});
  for (int s = 0; s < shards; ++s) {
    for (size_t t = 0; t < tables.size(); ++t) {
      // At most ~chunk_bytes of rows per message.
      const uint64_t dim = tables[t].dim;
      const uint64_t per = std::max<uint64_t>(1, options_.chunk_bytes / (dim * 4 + 10));
      for (uint64_t i = 0; i < out->ids[s][t].size(); i += per) {
        const uint64_t n = std::min<uint64_t>(per, out->ids[s][t].size() - i);
        out->refs[s].push_back(
            {&tables[t].name, out->ids[s][t].data() + i, n, out->rows[s][t].data() + i * dim, dim});
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::FillSparse(int s, const Params& grads, const TableIds& ids,
                                  SparseGradients* out) const {
  const auto& tables = placement_->tables;
  for (size_t t = 0; t < tables.size(); ++t) {
    const int64_t dim = tables[t].dim;
    const std::vector<float>& g = grads[tables[t].variable];
    if (g.size() != ids[t].size() * dim) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of table ", tables[t].name, " has ",
                                                     g.size(), " values for ", ids[t].size(),
                                                     " ids of dim ", dim));
    }
    float* to = out->rows[s][t].data();
    for (size_t i : out->positions[s][t]) {
      std::copy(g.begin() + i * dim, g.begin() + (i + 1) * dim, to);
      to += dim;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PsClient::PushResult> PsClient::Push(const Params& grads, int64_t worker_clock,
                                                    const TableIds& ids) {
  SparseGradients sparse;
  if (absl::Status s = SplitSparse(grads, ids, &sparse); !s.ok()) return s;
  return PushImpl(grads, worker_clock, sparse.refs);
}

v1::PushRequest::Header PsClient::NewPushHeader(int s, const Params& grads, int64_t worker_clock,
                                                uint64_t push_id, std::vector<ChunkRef>* chunks,
                                                uint64_t* bytes) const {
  *bytes = 0;
  for (const PartPlacement* p : shard_parts_[s]) {
    const float* base = grads[p->variable].data() + p->element_offset();
    const uint64_t n = p->num_elements();
    for (uint64_t off = 0; off < n; off += chunk_elements_) {
      chunks->push_back({&p->name, off, base + off, std::min(chunk_elements_, n - off)});
    }
    *bytes += n * 4;
  }
  v1::PushRequest::Header h;
  h.set_worker_index(options_.task_index);
  h.set_version(shards_[s].version);
  h.set_worker_clock(worker_clock);
  h.set_incarnation(shards_[s].incarnation);
  h.set_push_id(push_id);  // the same on every retry: applied at most once
  h.set_total_bytes(*bytes);
  return h;
}

void PsClient::CountPushBytes(uint64_t dense_bytes, const std::vector<SparseRef>& sparse) const {
  if (metrics_.push_bytes) metrics_.push_bytes->Increment(static_cast<double>(dense_bytes));
  if (metrics_.sparse_push_bytes) {
    double sparse_bytes = 0;
    for (const SparseRef& ref : sparse) sparse_bytes += ref.count * ref.dim * 4.0;
    metrics_.sparse_push_bytes->Increment(sparse_bytes);
  }
}

PsClient::PushResult PsClient::SumPushes(const std::vector<v1::PushResponse>& responses) {
  PushResult r;
  r.version = responses[0].version();
  for (const auto& resp : responses) {
    r.version = std::min<int64_t>(r.version, resp.version());
    r.dropped = r.dropped || resp.dropped();
    r.done = r.done || resp.done();
    r.staleness = std::max<int64_t>(r.staleness, resp.staleness());
    r.absent_workers = std::max(r.absent_workers, resp.absent_workers());
  }
  return r;
}

absl::Status PsClient::RequireWorker() const {
  if (is_worker()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(TaskName(), " only reads: it cannot push gradients"));
}

absl::StatusOr<PsClient::PushResult> PsClient::PushImpl(
    const Params& grads, int64_t worker_clock, const std::vector<std::vector<SparseRef>>& sparse) {
  if (absl::Status s = RequireWorker(); !s.ok()) return s;
  std::vector<v1::PushResponse> responses(channels_.size());
  const uint64_t push_id = next_push_id_++;
  absl::Time start = clock_->Now();
  absl::Status st = ForEachShard([&](int s) {
    std::vector<ChunkRef> chunks;
    uint64_t bytes = 0;
    const v1::PushRequest::Header h =
        NewPushHeader(s, grads, worker_clock, push_id, &chunks, &bytes);
    absl::StatusOr<v1::PushResponse> r;
    absl::Status rs = WithRetry("push", s, [&] {
      r = channels_[s]->Push(h, chunks, sparse[s]);
      return r.status();
    });
    if (!rs.ok()) return rs;
    responses[s] = *r;
    CountPushBytes(bytes, sparse[s]);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  if (metrics_.push_seconds)
    metrics_.push_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - start));
  return SumPushes(responses);
}

absl::Status PsClient::Leave() {
  v1::LeaveRequest req;
  req.set_worker_index(options_.task_index);
  req.set_task_type(options_.task_type);
  return ForEachShard([&](int s) { return channels_[s]->Leave(req); });
}

absl::StatusOr<v1::ShardStats> PsClient::Shutdown() {
  v1::ShutdownRequest req;
  req.set_worker_index(options_.task_index);
  req.set_task_type(options_.task_type);
  std::vector<v1::ShardStats> stats(channels_.size());
  absl::Status st = ForEachShard([&](int s) {
    auto r = channels_[s]->Shutdown(req);
    if (!r.ok()) return r.status();
    stats[s] = *r;
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return SumShardStats(stats);
}

absl::StatusOr<v1::ShardStats> PsClient::Stats() {
  v1::InfoRequest req;
  req.set_worker_index(options_.task_index);
  req.set_task_type(options_.task_type);
  std::vector<v1::ShardStats> stats(channels_.size());
  absl::Status st = ForEachShard([&](int s) {
    auto r = channels_[s]->GetStats(req);
    if (!r.ok()) return r.status();
    stats[s] = *r;
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return SumShardStats(stats);
}

v1::ShardStats SumShardStats(const std::vector<v1::ShardStats>& stats) {
  v1::ShardStats total;
  if (stats.empty()) return total;
  total.set_version(stats[0].version());
  for (const auto& s : stats) {
    total.set_version(std::min(total.version(), s.version()));
    total.set_gradients_applied(total.gradients_applied() + s.gradients_applied());
    total.set_stale_gradients_dropped(total.stale_gradients_dropped() +
                                      s.stale_gradients_dropped());
    total.set_pushes_rejected(total.pushes_rejected() + s.pushes_rejected());
    total.set_staleness_sum(total.staleness_sum() + s.staleness_sum());
    total.set_staleness_max(std::max(total.staleness_max(), s.staleness_max()));
    total.set_barrier_timeouts(total.barrier_timeouts() + s.barrier_timeouts());
    total.set_restored_version(std::max(total.restored_version(), s.restored_version()));
    total.set_nonfinite_updates(total.nonfinite_updates() + s.nonfinite_updates());
    total.set_duplicate_pushes(total.duplicate_pushes() + s.duplicate_pushes());
    total.set_absent_workers(std::max(total.absent_workers(), s.absent_workers()));
    total.set_checkpoint_failures(total.checkpoint_failures() + s.checkpoint_failures());
    total.set_checkpoints_failing(total.checkpoints_failing() + s.checkpoints_failing());
    total.set_dynamic_rows(total.dynamic_rows() + s.dynamic_rows());
    total.set_dynamic_rows_evicted(total.dynamic_rows_evicted() + s.dynamic_rows_evicted());
  }
  for (bool failing_now : {true, false}) {
    for (const auto& s : stats) {
      if (total.checkpoint_error().empty() && !s.checkpoint_error().empty() &&
          (!failing_now || s.checkpoints_failing() > 0)) {
        total.set_checkpoint_error(s.checkpoint_error());
      }
    }
  }
  return total;
}

}  // namespace kubetrain
