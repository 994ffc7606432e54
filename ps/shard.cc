#include "ps/shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <eigen3/Eigen/Core>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "ps/finite.h"

namespace kubetrain {

const char* TaskTypeName(TaskRole role) {
  return role == TaskRole::kChief       ? "chief"
         : role == TaskRole::kEvaluator ? "evaluator"
         : role == TaskRole::kExporter  ? "exporter"
                                        : "worker";
}

std::string TaskName(const TaskId& task) {
  return absl::StrCat(TaskTypeName(task.role), ":", task.index);
}

TaskId ChiefTask(const ShardOptions& options) {
  return {options.has_chief_task ? TaskRole::kChief : TaskRole::kWorker, 0};
}

ShardOptions ShardOptions::ForTask(const TaskConfig& config, int64_t incarnation) {
  const TrainingJob& job = config.job;
  ShardOptions o;
  o.shard_index = config.tf.task_index;
  o.num_shards = config.placement.num_shards;
  o.num_workers = config.num_workers;
  o.has_chief_task = job.has_chief_replica();
  auto evaluators = job.replica_specs.find("Evaluator");
  o.num_evaluators = evaluators == job.replica_specs.end() ? 0 : evaluators->second.replicas;
  o.mode = job.training.mode;
  o.replicas_to_aggregate = job.effective_replicas_to_aggregate();
  o.max_staleness = job.training.max_staleness;
  o.target_steps = config.target_steps;
  o.seed = job.training.seed;
  o.barrier_timeout = absl::Seconds(job.training.barrier_timeout_seconds);
  o.incarnation = incarnation;
  o.checkpoint_every_steps =
      job.training.checkpoint_dir.empty() ? 0 : job.training.checkpoint_every_steps;
  o.job_name = job.name;
  o.fingerprint = config.placement.Fingerprint();
  o.optimizer_type = job.training.optimizer.type;
  o.wide_optimizer = job.training.wide_optimizer;
  return o;
}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(const ShardOptions& options,
                                                     const Model& model, const Placement& placement,
                                                     const OptimizerSpec& optimizer,
                                                     const Clock* clock, ShardMetrics metrics) {
  if (options.num_workers < 1) return absl::InvalidArgumentError("num_workers must be >= 1");
  if (options.replicas_to_aggregate < 1 || options.replicas_to_aggregate > options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicasToAggregate must be in [1, ", options.num_workers, "]"));
  }
  std::vector<PartPlacement> parts;
  for (const auto* p : placement.PartsOfShard(options.shard_index)) parts.push_back(*p);
  std::vector<int64_t> sizes;
  for (const auto& p : parts) sizes.push_back(p.num_elements());
  auto opt = CreateOptimizer(optimizer, sizes);
  if (!opt.ok()) return opt.status();
  std::vector<std::unique_ptr<RowOptimizer>> row_opts;
  std::vector<std::unique_ptr<DynamicTable>> dynamic;
  for (const TablePlacement& t : placement.tables) {
    const OptimizerSpec& spec =
        t.wide && options.wide_optimizer.has_value() ? *options.wide_optimizer : optimizer;
    const int64_t rows = t.dynamic ? 0 : t.LocalRows(options.shard_index, placement.num_shards);
    auto ro = RowOptimizer::Create(spec, rows, t.dim);
    if (!ro.ok()) return ro.status();
    if (t.dynamic) {
      const VariableSpec var = model.variables()[t.variable];
      const uint64_t seed = options.seed;
      dynamic.push_back(std::make_unique<DynamicTable>(
          t.dim, t.MaxRowsPerShard(placement.num_shards),
          [var, seed](int64_t id, float* out) { InitialTableRow(var, seed, id, out); },
          std::move(*ro)));
      row_opts.emplace_back();
    } else {
      dynamic.emplace_back();
      row_opts.push_back(std::move(*ro));
    }
  }
  ShardOptions with_shards = options;
  with_shards.num_shards = placement.num_shards;
  std::unique_ptr<Shard> shard(new Shard(with_shards, parts, std::move(*opt), placement.tables,
                                         std::move(row_opts), std::move(dynamic), clock, metrics));
  absl::MutexLock l(&shard->mu_);
  for (size_t t = 0; t < placement.tables.size(); ++t) {
    // Row r of the table is local row r / num_shards of shard r % num_shards.
    const TablePlacement& table = placement.tables[t];
    if (table.dynamic) continue;
    const std::vector<float> full = model.InitialValue(table.variable, options.seed);
    std::vector<float>& local = shard->table_values_[t];
    local.resize(shard->table_local_rows_[t] * table.dim);
    for (int64_t i = 0; i < shard->table_local_rows_[t]; ++i) {
      const int64_t row = i * placement.num_shards + options.shard_index;
      std::copy_n(full.data() + row * table.dim, table.dim, local.data() + i * table.dim);
    }
  }
  std::map<int, std::vector<float>> initial;  // one full variable at a time is enough
  std::shared_ptr<std::string> values = shard->NewValuesBuffer();
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& p = parts[i];
    auto it = initial.find(p.variable);
    if (it == initial.end()) {
      it = initial.emplace(p.variable, model.InitialValue(p.variable, options.seed)).first;
    }
    std::copy_n(it->second.data() + p.element_offset(), p.num_elements(),
                shard->PartValues(values.get(), i));
  }
  shard->values_ = std::move(values);
  return shard;
}

Shard::Shard(ShardOptions options, std::vector<PartPlacement> parts, std::unique_ptr<Optimizer> opt,
             std::vector<TablePlacement> tables,
             std::vector<std::unique_ptr<RowOptimizer>> row_opts,
             std::vector<std::unique_ptr<DynamicTable>> dynamic, const Clock* clock,
             ShardMetrics metrics)
    : options_(std::move(options)),
      parts_(std::move(parts)),
      tables_(std::move(tables)),
      table_local_rows_([this] {
        std::vector<int64_t> rows;
        const int shards = std::max(1, options_.num_shards);
        for (const auto& t : tables_) {
          rows.push_back(t.dynamic ? 0 : t.LocalRows(options_.shard_index, shards));
        }
        return rows;
      }()),
      table_dims_([this] {
        std::vector<int64_t> dims;
        for (const auto& t : tables_) dims.push_back(t.dim);
        return dims;
      }()),
      gradient_bytes_([this] {
        uint64_t n = 0;
        for (const auto& p : parts_) n += p.num_bytes();
        return n;
      }()),
      clock_(clock),
      metrics_(metrics),
      part_offsets_([this] {
        std::vector<int64_t> offsets;
        int64_t at = 0;
        for (const auto& p : parts_) {
          offsets.push_back(at);
          at += p.num_elements();
        }
        return offsets;
      }()),
      values_bytes_(gradient_bytes_) {
  absl::MutexLock l(&mu_);
  optimizer_ = std::move(opt);
  row_opts_ = std::move(row_opts);
  pending_sparse_.resize(std::max(0, options_.num_workers));
  dynamic_ = std::move(dynamic);
  for (size_t t = 0; t < dynamic_.size(); ++t) {
    if (!dynamic_[t]) continue;
    // Touch runs under mu_: a slab row given to a new id is kept for an open checkpoint first.
    dynamic_[t]->set_before_reuse([this, t](int64_t row) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      SaveRowLocked(static_cast<int>(t), row);
    });
  }
  table_values_.resize(tables_.size());
  values_ = NewValuesBuffer();  // Create fills it
  absl::Time now = clock_->Now();
  for (int w = 0; w < options_.num_workers; ++w) {
    worker_clock_[w] = 0;
    last_seen_[w] = now;
  }
}

int Shard::NeededLocked() const {
  const int present = options_.num_workers - static_cast<int>(absent_.size());
  return std::max(1, std::min(options_.replicas_to_aggregate, present));
}

void Shard::SetAbsentLocked(int worker, bool absent) {
  if (absent) {
    absent_.insert(worker);
  } else {
    absent_.erase(worker);
  }
  stats_.absent_workers = static_cast<int64_t>(absent_.size());
  if (metrics_.absent_workers) metrics_.absent_workers->Set(static_cast<double>(absent_.size()));
}

bool Shard::Alive(int worker, absl::Time now) const {
  if (options_.barrier_timeout <= absl::ZeroDuration()) return true;
  auto it = last_seen_.find(worker);
  return it != last_seen_.end() && now - it->second <= options_.barrier_timeout;
}

int Shard::PartIndex(absl::string_view name) const {
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// out[e] = (float)(sum over k of (double)grads[k][e], in k order / grads.size())
// for e in [0, n). Block by block, so the double sums stay in L1; the loops
// are vectorised with "omp simd" (-fopenmp-simd: no OpenMP runtime), which
// GCC's -O2 does not do for the float -> double conversions (Eigen's cast
// did not either: 3-4x slower). out may be grads[0].
void MeanInDouble(const std::vector<const float*>& grads, int64_t n, float* out) {
  constexpr int64_t kBlock = 2048;
  double sum[kBlock];
  const double count = static_cast<double>(grads.size());
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = std::min(kBlock, n - b);
    const float* g0 = grads[0] + b;
    const float* g1 = grads[1] + b;
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) sum[e] = static_cast<double>(g0[e]) + g1[e];
    for (size_t k = 2; k < grads.size(); ++k) {
      const float* g = grads[k] + b;
#pragma omp simd
      for (int64_t e = 0; e < len; ++e) sum[e] += g[e];
    }
    float* o = out + b;
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) o[e] = static_cast<float>(sum[e] / count);
  }
}

}  // namespace

bool Shard::Done() const { return version_ >= options_.target_steps; }

bool Shard::CanServe(const PullWait& w, absl::Time now) const {
  if (Done() || shutdown_ || !read_only_reason_.empty()) return true;
  if (w.incarnation != 0 && w.incarnation != options_.incarnation) return true;
  if (version_ < w.min_version) return false;
  if (w.role == TaskRole::kWorker && options_.mode == TrainingMode::kAsync &&
      options_.max_staleness.has_value()) {
    int64_t slowest = w.worker_clock;
    for (const auto& [worker, c] : worker_clock_) {
      if (worker == w.worker || Alive(worker, now)) slowest = std::min(slowest, c);
    }
    if (w.worker_clock - slowest > *options_.max_staleness) return false;
  }
  return true;
}

std::shared_ptr<std::string> Shard::NewValuesBuffer() {
  std::unique_ptr<std::string> buffer;
  {
    absl::MutexLock l(&snapshot_pool_->mu);
    if (!snapshot_pool_->spares.empty()) {
      buffer = std::move(snapshot_pool_->spares.back());
      snapshot_pool_->spares.pop_back();
    }
  }
  if (buffer == nullptr) buffer = std::make_unique<std::string>();
  static_assert(sizeof(float) == 4, "float32 wire format");  // little-endian host (x86/arm64)
  buffer->resize(values_bytes_);
  std::weak_ptr<SnapshotBufferPool> pool = snapshot_pool_;
  return std::shared_ptr<std::string>(
      buffer.release(),
      [pool](std::string* released) {
        std::unique_ptr<std::string> owned(released);
        if (auto p = pool.lock()) {
          absl::MutexLock l(&p->mu);
          if (p->spares.size() < SnapshotBufferPool::kMaxSpares) {
            p->spares.push_back(std::move(owned));
          }
        }
      },
      BlockAllocator<char>(snapshot_pool_));
}

Shard::Snapshot Shard::MakeSnapshot(absl::Time start, absl::Time now) {
  Snapshot s;
  s.version = version_;
  s.incarnation = options_.incarnation;
  s.done = Done();
  s.waited_seconds = absl::ToDoubleSeconds(now - start);
  s.absent_workers = static_cast<int>(absent_.size());
  s.bytes = values_;  // never written again (see values_): no copy
  return s;
}

std::vector<std::vector<float>> Shard::TakePooledGradientBuffers() {
  absl::MutexLock l(&pool_mu_);
  if (gradient_pool_.empty()) return {};
  auto buffers = std::move(gradient_pool_.back());
  gradient_pool_.pop_back();
  return buffers;
}

void Shard::RecordRejectedPush() {
  absl::MutexLock l(&mu_);
  ++stats_.pushes_rejected;
  if (metrics_.rejected) metrics_.rejected->Increment();
}

void Shard::ReleaseGradientBuffers(std::vector<std::vector<float>> buffers) {
  PoolGradientBuffers(&buffers);
}

bool Shard::PoolGradientBuffers(std::vector<std::vector<float>>* buffers) {
  if (buffers->size() != parts_.size()) return false;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (static_cast<int64_t>((*buffers)[i].size()) != parts_[i].num_elements()) return false;
  }
  absl::MutexLock l(&pool_mu_);
  // One set per worker in flight is enough; more would only hold memory.
  if (static_cast<int>(gradient_pool_.size()) >= options_.num_workers + 1) return false;
  gradient_pool_.push_back(std::move(*buffers));
  return true;
}

absl::Status Shard::CheckTask(const TaskId& task) const {
  switch (task.role) {
    case TaskRole::kWorker:
      if (task.index >= 0 && task.index < options_.num_workers) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("unknown worker index ", task.index,
                                                     " (job has ", options_.num_workers, ")"));
    case TaskRole::kChief:
      if (options_.has_chief_task && task.index == 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("unknown task ", TaskName(task),
                                                     options_.has_chief_task
                                                         ? " (the job has one chief)"
                                                         : " (the job has no Chief replica)"));
    case TaskRole::kExporter:
      if (task.index == 0) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("unknown task ", TaskName(task), " (the exporter is exporter:0)"));
    case TaskRole::kEvaluator:
      if (task.index >= 0 && task.index < options_.num_evaluators) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("unknown task ", TaskName(task), " (job has ",
                                                     options_.num_evaluators, " evaluators)"));
  }
  return absl::InvalidArgumentError("unknown task role");
}

uint64_t Shard::Pull(const PullWait& wait, absl::Time deadline, PullCallback done) {
  absl::Time now = clock_->Now();
  if (absl::Status valid = CheckTask({wait.role, wait.worker}); !valid.ok()) {
    done(valid);
    return 0;
  }
  std::optional<Snapshot> snap;
  absl::Status stopping;
  uint64_t ticket = 0;
  {
    absl::MutexLock l(&mu_);
    if (wait.role == TaskRole::kWorker) last_seen_[wait.worker] = now;
    if (CanServe(wait, now)) {
      snap = MakeSnapshot(now, now);
    } else if (!stop_holding_.ok()) {
      stopping = stop_holding_;
    } else {
      ticket = next_ticket_++;
      waiters_[ticket] = Waiter{wait, now, deadline, std::move(done)};
    }
  }
  if (snap.has_value()) {
    if (metrics_.hold_seconds) metrics_.hold_seconds->Observe(0);
    done(std::move(*snap));
  } else if (!stopping.ok()) {
    done(stopping);
  }
  return ticket;
}

void Shard::StopHolding(absl::Status why) {
  std::map<uint64_t, Waiter> held;
  {
    absl::MutexLock l(&mu_);
    stop_holding_ = why;
    held.swap(waiters_);
  }
  for (auto& [ticket, waiter] : held) waiter.done(why);
}

void Shard::CancelPull(uint64_t ticket) {
  PullCallback cb;
  {
    absl::MutexLock l(&mu_);
    auto it = waiters_.find(ticket);
    if (it == waiters_.end()) return;
    cb = std::move(it->second.done);
    waiters_.erase(it);
  }
  cb(absl::CancelledError("pull cancelled"));
}

void Shard::Tick(absl::Time now) {
  std::vector<Waiter> expired;
  std::vector<std::pair<Waiter, Snapshot>> ready;
  std::vector<std::vector<std::vector<float>>> freed;
  {
    absl::MutexLock l(&mu_);
    if (options_.mode == TrainingMode::kSync && options_.barrier_timeout > absl::ZeroDuration() &&
        !pending_.empty() && !Done() && now - accum_started_ >= options_.barrier_timeout) {
      ++stats_.barrier_timeouts;
      if (metrics_.barrier_timeouts) metrics_.barrier_timeouts->Increment();
      for (int w = 0; w < options_.num_workers; ++w) {
        if (!pending_.count(w) && !left_.count(w) && !absent_.count(w)) {
          Log("ps:", options_.shard_index, " worker:", w, " missed the barrier of step ",
              version_ + 1, " (", absl::FormatDuration(options_.barrier_timeout),
              "): absent, later steps go on without it until it pushes again");
          SetAbsentLocked(w, true);
        }
      }
      ApplyPendingLocked(&freed);
    }
    // A worker may just have been declared dead: its clock no longer holds anyone.
    ready = TakeReadyWaiters(now);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline <= now) {
        expired.push_back(std::move(it->second));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& buffers : freed) ReleaseGradientBuffers(std::move(buffers));
  RunReady(std::move(ready));
  for (auto& w : expired) {
    w.done(
        absl::DeadlineExceededError(absl::StrCat("still waiting for version ", w.wait.min_version,
                                                 " after ", absl::FormatDuration(now - w.start))));
  }
}

std::vector<std::pair<Shard::Waiter, Shard::Snapshot>> Shard::TakeReadyWaiters(absl::Time now) {
  std::vector<std::pair<Waiter, Snapshot>> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (CanServe(it->second.wait, now)) {
      Snapshot s = MakeSnapshot(it->second.start, now);
      ready.emplace_back(std::move(it->second), std::move(s));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

void Shard::RunReady(std::vector<std::pair<Waiter, Snapshot>> ready) {
  for (auto& [w, s] : ready) w.done(std::move(s));
}

absl::Status Shard::GradsFinite(const std::vector<std::vector<float>>& grads,
                                size_t from_part) const {
  for (size_t i = from_part; i < parts_.size(); ++i) {
    if (!AllFinite(grads[i].data(), static_cast<int64_t>(grads[i].size()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient of ", parts_[i].name, " has a non-finite value"));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::ValidatePush(const PushHeader& h, const std::vector<std::vector<float>>& grads,
                                 bool check_finite) const {
  if (h.worker < 0 || h.worker >= options_.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker index ", h.worker, " (job has ", options_.num_workers, ")"));
  }
  if (h.version > version_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient for version ", h.version, " is from the future (shard is at ", version_, ")"));
  }
  if (h.version < 0) return absl::InvalidArgumentError("negative version");
  if (grads.size() != parts_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push has ", grads.size(), " parts, shard holds ", parts_.size()));
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (static_cast<int64_t>(grads[i].size()) != parts_[i].num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of ", parts_[i].name, " has ",
                                                     grads[i].size(), " elements, expected ",
                                                     parts_[i].num_elements()));
    }
  }
  return check_finite ? GradsFinite(grads) : absl::OkStatus();
}

bool Shard::ApplyLocked(const std::vector<std::vector<float>>& grads,
                        absl::Span<const SparseGrad> sparse) {
  std::shared_ptr<std::string> next;
  bool staged = false;
  StageDenseLocked(grads, /*check_grads=*/false, &next, &staged).IgnoreError();  // not checked
  return FinishApplyLocked(std::move(next), staged, sparse);
}

absl::Status Shard::StageDenseLocked(const std::vector<std::vector<float>>& grads, bool check_grads,
                                     std::shared_ptr<std::string>* next, bool* staged) {
  const int64_t step = version_ + 1;
  // The new values go straight into the next version's buffer, which pulls
  // then share as it is (values_): no copy of the model per version.
  *next = NewValuesBuffer();
  bool grad_finite = true;
  *staged = true;
  for (size_t i = 0; i < parts_.size() && *staged; ++i) {
    *staged = optimizer_->Stage(static_cast<int>(i), PartValues(*values_, i), grads[i].data(),
                                parts_[i].num_elements(), step, PartValues(next->get(), i),
                                check_grads ? &grad_finite : nullptr);
    if (!grad_finite) {
      next->reset();
      return GradsFinite(grads, i);  // names part i
    }
    if (!*staged && check_grads) {
      // ValidatePush refuses a non-finite gradient before any update, so the
      // rest of the gradient (not checked past the refused block) decides.
      if (absl::Status s = GradsFinite(grads, i); !s.ok()) {
        next->reset();
        return s;
      }
    }
  }
  return absl::OkStatus();
}

bool Shard::FinishApplyLocked(std::shared_ptr<std::string> next, bool staged,
                              absl::Span<const SparseGrad> sparse) {
  const int64_t step = version_ + 1;
  bool finite = staged;
  if (finite) finite = StageSparseLocked(sparse, step);
  if (!finite) {
    // Nothing was committed: values and optimizer state are as they were.
    ++stats_.nonfinite_updates;
    if (metrics_.nonfinite_updates) metrics_.nonfinite_updates->Increment();
    int64_t suppressed = 0;
    if (nonfinite_log_.Allow(clock_->Now(), &suppressed)) {
      Log("warning: ps:", options_.shard_index, " refused the update of step ", step,
          ": it would store a non-finite value (parameters and optimizer state unchanged; ",
          stats_.nonfinite_updates, " refused so far, ", suppressed,
          " not logged since the last message)");
    }
    return false;
  }
  // The old buffer goes back to the pool once the last pull reading it ends.
  values_ = std::move(next);
  for (size_t i = 0; i < parts_.size(); ++i) optimizer_->Commit(static_cast<int>(i));
  CommitSparseLocked(sparse);
  return true;
}

void Shard::StepLocked() {
  SetVersionLocked(version_ + 1);
  if (options_.checkpoint_every_steps > 0 && version_ % options_.checkpoint_every_steps == 0) {
    // Exactly at the boundary, even while the previous one is being written
    // (a newer boundary replaces one not handed out yet).
    pending_checkpoint_ = OpenCheckpointLocked();
  }
}

void Shard::ApplyPendingLocked(std::vector<std::vector<std::vector<float>>>* freed) {
  const auto n = static_cast<int64_t>(pending_.size());
  // The mean goes into the first (lowest-index) worker's buffers, element
  // block by element block, summed in double in worker order: no overflow for
  // finite float32 inputs, and the same bits whatever the arrival order. One
  // gradient is its own mean (float -> double -> / 1 -> float is exact).
  std::vector<std::vector<float>>& mean = pending_.begin()->second;
  if (n > 1) {
    mean_inputs_.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < parts_.size(); ++i) {
      size_t w = 0;
      for (const auto& [worker, g] : pending_) mean_inputs_[w++] = g[i].data();
      MeanInDouble(mean_inputs_, parts_[i].num_elements(), mean[i].data());
    }
  }
  sparse_inputs_.clear();
  for (const std::vector<SparseGrad>& g : pending_sparse_) {
    if (!g.empty()) sparse_inputs_.push_back(&g);  // worker order
  }
  absl::Span<const SparseGrad> sparse_mean;
  if (!sparse_inputs_.empty()) {
    sparse_mean = AggregateSparseLocked(sparse_inputs_, static_cast<double>(n));
  }
  if (ApplyLocked(mean, sparse_mean)) {
    stats_.gradients_applied += n;
    if (metrics_.applied) metrics_.applied->Increment(static_cast<double>(n));
  }
  StepLocked();
  // The rows' buffers serve later pushes (pool_mu_ is taken inside mu_).
  for (std::vector<SparseGrad>& g : pending_sparse_) {
    if (!g.empty()) ReleaseSparse(std::move(g));
    g.clear();
  }
  while (!pending_.empty()) {
    PendingMap::node_type node = pending_.extract(pending_.begin());
    if (!PoolGradientBuffers(&node.mapped())) freed->push_back(std::move(node.mapped()));
    node.mapped().clear();
    spare_pending_.push_back(std::move(node));
  }
}

void Shard::SetVersionLocked(int64_t v) {
  version_ = v;
  stats_.version = v;
  if (metrics_.version) metrics_.version->Set(static_cast<double>(v));
}

absl::StatusOr<Shard::PushResult> Shard::Push(const PushHeader& header,
                                              std::vector<std::vector<float>> grads,
                                              std::vector<SparseGrad> sparse) {
  std::vector<std::vector<std::vector<float>>> freed;
  auto result = PushImpl(header, &grads, &sparse, &freed);
  ReleaseSparse(std::move(sparse));  // unless the step keeps it (sync)
  if (!grads.empty()) ReleaseGradientBuffers(std::move(grads));
  for (auto& buffers : freed) ReleaseGradientBuffers(std::move(buffers));
  return result;
}

absl::StatusOr<Shard::PushResult> Shard::PushImpl(
    const PushHeader& header, std::vector<std::vector<float>>* grads_in,
    std::vector<SparseGrad>* sparse, std::vector<std::vector<std::vector<float>>>* freed) {
  const std::vector<std::vector<float>>& grads = *grads_in;
  std::vector<std::pair<Waiter, Snapshot>> ready;
  PushResult result;
  {
    absl::MutexLock l(&mu_);
    if (!read_only_reason_.empty()) return absl::FailedPreconditionError(read_only_reason_);
    result.done = Done();
    if (result.done) {
      result.version = version_;
      return result;  // training is over; late gradients are irrelevant
    }
    const absl::Time now = clock_->Now();
    if (header.worker >= 0 && header.worker < options_.num_workers) last_seen_[header.worker] = now;
    if (header.incarnation != 0 && header.incarnation != options_.incarnation) {
      // Computed against a previous life of this shard: stale by definition.
      result.dropped = true;
      result.version = version_;
      ++stats_.stale_gradients_dropped;
      if (metrics_.stale_dropped) metrics_.stale_dropped->Increment();
      return result;
    }
    if (header.push_id != 0) {
      auto last = last_push_.find(header.worker);
      if (last != last_push_.end() && last->second.first == header.push_id) {
        // A retry of a push already handled (its answer was lost).
        ++stats_.duplicate_pushes;
        result = last->second.second;
        result.version = version_;
        result.done = Done();
        return result;
      }
    }
    // Async: the gradient's finiteness is checked while the update is staged,
    // in the same pass over it (StageDenseLocked), before anything changes.
    const bool async = options_.mode == TrainingMode::kAsync;
    absl::Status valid = ValidatePush(header, grads, /*check_finite=*/!async);
    if (valid.ok()) {
      valid = ValidateSparse(*sparse);
      // As in ValidatePush's order: a non-finite dense gradient is named first.
      if (!valid.ok() && async) {
        if (absl::Status f = GradsFinite(grads); !f.ok()) valid = f;
      }
    }
    std::shared_ptr<std::string> next;
    bool staged = false;
    if (valid.ok() && async) valid = StageDenseLocked(grads, /*check_grads=*/true, &next, &staged);
    if (!valid.ok()) {
      ++stats_.pushes_rejected;
      if (metrics_.rejected) metrics_.rejected->Increment();
      return valid;
    }
    if (!left_.count(header.worker)) {
      auto& c = worker_clock_[header.worker];
      c = std::max(c, header.worker_clock);
    }
    if (absent_.count(header.worker)) {
      Log("ps:", options_.shard_index, " worker:", header.worker,
          " pushes again: expected from the next step on");
      SetAbsentLocked(header.worker, false);
    }
    if (options_.mode == TrainingMode::kSync) {
      if (header.version < version_ || pending_.count(header.worker)) {
        result.dropped = true;
        ++stats_.stale_gradients_dropped;
        if (metrics_.stale_dropped) metrics_.stale_dropped->Increment();
      } else {
        if (pending_.empty()) accum_started_ = now;
        // Kept until the step is applied, in a map node of an earlier step.
        if (spare_pending_.empty()) {
          pending_[header.worker] = std::move(*grads_in);
        } else {
          PendingMap::node_type node = std::move(spare_pending_.back());
          spare_pending_.pop_back();
          node.key() = header.worker;
          node.mapped() = std::move(*grads_in);
          pending_.insert(std::move(node));
        }
        grads_in->clear();
        if (!sparse->empty()) {
          std::swap(pending_sparse_[header.worker], *sparse);
          sparse->clear();
        }
        if (static_cast<int>(pending_.size()) >= NeededLocked()) {
          const int64_t refused = stats_.nonfinite_updates;
          ApplyPendingLocked(freed);
          result.dropped = stats_.nonfinite_updates != refused;
        }
      }
    } else {
      result.staleness = version_ - header.version;
      if (metrics_.staleness) metrics_.staleness->Observe(static_cast<double>(result.staleness));
      stats_.staleness_sum += result.staleness;
      stats_.staleness_max = std::max(stats_.staleness_max, result.staleness);
      absl::Span<const SparseGrad> rows;
      if (!sparse->empty()) {
        const std::vector<SparseGrad>* one = sparse;
        rows = AggregateSparseLocked(absl::MakeConstSpan(&one, 1), 1.0);
      }
      if (FinishApplyLocked(std::move(next), staged, rows)) {
        StepLocked();
        ++stats_.gradients_applied;
        if (metrics_.applied) metrics_.applied->Increment();
      } else {
        result.dropped = true;
      }
    }
    result.version = version_;
    result.done = Done();
    result.absent_workers = static_cast<int>(absent_.size());
    if (header.push_id != 0) last_push_[header.worker] = {header.push_id, result};
    ready = TakeReadyWaiters(now);
  }
  for (auto& [w, s] : ready) {
    if (metrics_.hold_seconds) metrics_.hold_seconds->Observe(s.waited_seconds);
  }
  RunReady(std::move(ready));
  return result;
}

absl::Status Shard::Leave(const TaskId& task) {
  if (absl::Status valid = CheckTask(task); !valid.ok()) return valid;
  if (task.role == TaskRole::kChief || task.role == TaskRole::kExporter) return absl::OkStatus();
  std::vector<std::pair<Waiter, Snapshot>> ready;
  {
    absl::MutexLock l(&mu_);
    if (task.role == TaskRole::kEvaluator) {
      evaluators_left_.insert(task.index);
      return absl::OkStatus();
    }
    left_.insert(task.index);
    worker_clock_.erase(task.index);
    ready = TakeReadyWaiters(clock_->Now());
  }
  RunReady(std::move(ready));
  return absl::OkStatus();
}

absl::Status Shard::RequestShutdown(const TaskId& from) {
  const TaskId chief = ChiefTask(options_);
  if (from.role != chief.role || from.index != chief.index) {
    return absl::PermissionDeniedError(absl::StrCat("only the chief (", TaskName(chief),
                                                    ") may end the job, not ", TaskName(from)));
  }
  std::vector<std::pair<Waiter, Snapshot>> ready;
  {
    absl::MutexLock l(&mu_);
    shutdown_ = true;
    ready = TakeReadyWaiters(clock_->Now());
  }
  RunReady(std::move(ready));
  return absl::OkStatus();
}

void Shard::SetReadOnly(const std::string& reason) {
  std::vector<std::pair<Waiter, Snapshot>> ready;
  {
    absl::MutexLock l(&mu_);
    read_only_reason_ = reason.empty() ? "this PS is read-only" : reason;
    ready = TakeReadyWaiters(clock_->Now());
  }
  RunReady(std::move(ready));
}

bool Shard::read_only() const {
  absl::MutexLock l(&mu_);
  return !read_only_reason_.empty();
}

bool Shard::shutdown_requested() const {
  absl::MutexLock l(&mu_);
  return shutdown_;
}

bool Shard::all_workers_left() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(left_.size()) >= options_.num_workers;
}

bool Shard::all_evaluators_left() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(evaluators_left_.size()) >= options_.num_evaluators;
}

int64_t Shard::version() const {
  absl::MutexLock l(&mu_);
  return version_;
}

ShardStatsSnapshot Shard::stats() const {
  absl::MutexLock l(&mu_);
  ShardStatsSnapshot s = stats_;
  for (const auto& d : dynamic_) {
    if (d == nullptr) continue;
    s.dynamic_rows += d->size();
    s.dynamic_rows_evicted += d->rows_evicted();
  }
  return s;
}

int64_t Shard::WorkerClock(int worker) {
  absl::MutexLock l(&mu_);
  if (worker < 0 || worker >= options_.num_workers) return 0;
  last_seen_[worker] = clock_->Now();
  auto it = worker_clock_.find(worker);
  return it == worker_clock_.end() ? 0 : it->second;
}

}  // namespace kubetrain
