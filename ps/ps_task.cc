#include "ps/ps_task.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "core/job_report.h"
#include "core/log.h"

namespace kubetrain {

PsTask::Metrics PsTask::RegisterMetrics(prometheus::Registry& registry) {
  auto counter = [&](const char* name, const char* help) -> prometheus::Counter* {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
  };
  auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge* {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
  };
  auto& rpc = prometheus::BuildHistogram()
                  .Name("kubetrain_rpc_duration_seconds")
                  .Help("RPC duration by method, measured where the RPC is handled or issued")
                  .Register(registry);
  Metrics m;
  m.shard.staleness = &prometheus::BuildHistogram()
                           .Name("kubetrain_gradient_staleness_steps")
                           .Help(
                               "Global steps between the version a gradient was computed on and "
                               "the version it was applied to (async)")
                           .Register(registry)
                           .Add({}, StalenessBuckets());
  m.shard.stale_dropped =
      counter("kubetrain_stale_gradients_dropped_total",
              "Sync-mode gradients dropped because they were computed on an older version");
  m.shard.applied =
      counter("kubetrain_gradients_applied_total", "Worker gradients applied to this PS shard");
  m.shard.rejected = counter(
      "kubetrain_pushes_rejected_total",
      "Pushes refused as invalid (unknown worker, wrong size, non-finite values, future version)");
  m.shard.version = gauge(kGlobalStepMetric, "Optimizer steps applied (the shard's version)");
  m.shard.hold_seconds =
      &prometheus::BuildHistogram()
           .Name("kubetrain_pull_hold_seconds")
           .Help("How long the PS held pulls for the sync barrier or the staleness bound")
           .Register(registry)
           .Add({}, LatencyBuckets());
  m.shard.barrier_timeouts =
      counter("kubetrain_barrier_timeouts_total",
              "Sync steps applied after barrierTimeoutSeconds without every expected gradient");
  m.shard.nonfinite_updates =
      counter("kubetrain_nonfinite_updates_total",
              "Optimizer updates refused because they would have stored a non-finite value "
              "(parameters and optimizer state unchanged)");
  m.shard.absent_workers = gauge(
      "kubetrain_absent_workers",
      "Sync workers this PS no longer waits for: they missed a barrier (barrierTimeoutSeconds) "
      "and have not pushed since");
  m.service.pull_seconds = &rpc.Add({{"method", "Pull"}, {"side", "server"}}, LatencyBuckets());
  m.service.push_seconds = &rpc.Add({{"method", "Push"}, {"side", "server"}}, LatencyBuckets());
  m.service.pull_bytes = counter("kubetrain_pull_bytes_total", "Tensor bytes sent by pulls");
  m.service.push_bytes = counter("kubetrain_push_bytes_total", "Tensor bytes received by pushes");
  m.service.sparse_pull_bytes = counter("kubetrain_sparse_pull_bytes_total",
                                        "Embedding-table row bytes sent by sparse pulls");
  m.service.sparse_push_bytes = counter("kubetrain_sparse_push_bytes_total",
                                        "Embedding-table gradient row bytes received by pushes");
  m.service.push_streams = gauge("kubetrain_push_streams", "Push streams open on this PS task");
  m.service.push_streams_refused =
      counter("kubetrain_push_streams_refused_total",
              "Push streams refused for the per-PS or per-worker limit, or closed as idle");
  auto& auth_failures = prometheus::BuildCounter()
                            .Name("kubetrain_rpc_auth_failures_total")
                            .Help(
                                "Calls refused by the caller checks: reason unauthenticated (no "
                                "or a wrong token) or permission_denied (not allowed to the "
                                "caller, or naming another task)")
                            .Register(registry);
  m.service.auth_unauthenticated = &auth_failures.Add({{"reason", "unauthenticated"}});
  m.service.auth_permission_denied = &auth_failures.Add({{"reason", "permission_denied"}});
  m.checkpoints_written =
      counter("kubetrain_checkpoints_written_total", "Shard checkpoints written");
  m.checkpoint_failures =
      counter("kubetrain_checkpoint_failures_total",
              "Shard checkpoint writes that failed (full or read-only disk, I/O error); retried");
  m.checkpoint_restores = counter("kubetrain_checkpoint_restores_total",
                                  "Times this PS task started from a checkpoint");
  m.restored_version =
      gauge("kubetrain_restored_version",
            "Version restored from a checkpoint when this PS task started (0: none)");
  m.holding = gauge(kHoldingUnsavedParametersMetric,
                    "1 while this PS task, unable to write its final checkpoint, serves its "
                    "parameters read-only for kubetrain export --from-ps");
  return m;
}

absl::StatusOr<std::unique_ptr<PsTask>> PsTask::Create(
    TaskConfig config, PsTaskOptions options, const Clock* clock,
    std::shared_ptr<prometheus::Registry> registry) {
  if (config.tf.task_type != "ps") {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG task type is \"", config.tf.task_type,
                                                   "\", kubetrain-ps runs \"ps\" tasks"));
  }
  if (options.credentials.job_key.empty() && !options.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:", config.tf.task_index,
        " has no credentials: without a job key it would serve any client that reaches its "
        "port (pushes, pulls, Shutdown); give it the job's auth directory (--auth_dir or $",
        kAuthDirEnv, ", holding ", kJobKeyFile,
        "; `kubetrain run` and the operator do), or pass --insecure (or ", kInsecureEnv,
        "=1) to run it open on a network only the job can reach"));
  }
  if (options.port < 0) {
    auto port = PortOf(config.tf.self_address());
    if (!port.ok()) return port.status();
    options.port = *port;
  }
  if (options.incarnation == 0)
    options.incarnation = std::max<int64_t>(1, absl::ToUnixMicros(clock->Now()));
  Metrics metrics = RegisterMetrics(*registry);
  std::unique_ptr<PsTask> task(
      new PsTask(std::move(config), std::move(options), clock, std::move(registry), metrics));
  const TaskConfig& c = task->config_;
  if (!c.job.training.checkpoint_dir.empty()) {
    // Fail now, not after hours of training, if nothing can be saved there.
    const std::string dir = ShardCheckpointDir(c.job.training.checkpoint_dir, task->index_);
    if (absl::Status s = ProbeWritableDir(task->options_.env, dir); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("spec.training.checkpoint.directory: ", c.job.training.checkpoint_dir,
                       " is not writable: ", s.message()));
    }
  }
  auto shard = Shard::Create(ShardOptions::ForTask(c, task->options_.incarnation), *c.model,
                             c.placement, c.job.training.optimizer, clock, metrics.shard);
  if (!shard.ok()) return shard.status();
  task->shard_ = std::move(*shard);
  if (!c.placement.tables.empty()) {
    auto& rows = prometheus::BuildGauge()
                     .Name("kubetrain_table_rows")
                     .Help(
                         "Rows of each embedding table held by this PS task (row id mod PS "
                         "tasks; dynamic tables: the rows created and not evicted)")
                     .Register(*task->registry_);
    auto& bytes = prometheus::BuildGauge()
                      .Name("kubetrain_table_bytes")
                      .Help(
                          "Bytes of each embedding table's rows and their optimizer slots held "
                          "by this PS task")
                      .Register(*task->registry_);
    auto& created = prometheus::BuildCounter()
                        .Name("kubetrain_table_rows_created_total")
                        .Help("Rows of each dynamic embedding table created on first touch")
                        .Register(*task->registry_);
    auto& evicted = prometheus::BuildCounter()
                        .Name("kubetrain_table_rows_evicted_total")
                        .Help(
                            "Rows of each dynamic embedding table evicted (least recently "
                            "used, past maxRows)")
                        .Register(*task->registry_);
    for (const TablePlacement& t : c.placement.tables) {
      TableMetrics m;
      m.rows = &rows.Add({{"table", t.name}});
      m.bytes = &bytes.Add({{"table", t.name}});
      m.created = &created.Add({{"table", t.name}});
      m.evicted = &evicted.Add({{"table", t.name}});
      task->table_metrics_.push_back(m);
    }
  }
  if (absl::Status s = task->Restore(); !s.ok()) return s;
  if (!task->options_.metrics_address.empty()) {
    auto m = MetricsServer::Start(task->options_.metrics_address, task->registry_);
    if (!m.ok()) return m.status();
    task->metrics_server_ = std::move(*m);
    task->metrics_port_ = task->metrics_server_->port();
  }
  task->saved_version_ = task->shard_->version();
  task->UpdateTableMetrics();
  task->saved_at_ = clock->Now();
  return task;
}

PsTask::PsTask(TaskConfig config, PsTaskOptions options, const Clock* clock,
               std::shared_ptr<prometheus::Registry> registry, Metrics metrics)
    : config_(std::move(config)),
      options_(std::move(options)),
      clock_(clock),
      registry_(std::move(registry)),
      metrics_(metrics),
      index_(config_.tf.task_index) {}

PsTask::~PsTask() {
  if (bulk_) bulk_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

absl::Status PsTask::Restore() {
  const std::string& dir = config_.job.training.checkpoint_dir;
  if (dir.empty()) return absl::OkStatus();
  auto ckpt = RestoreShardCheckpoint(dir, index_, config_.placement.Fingerprint(),
                                     config_.job.training.optimizer.type,
                                     [](const std::string& warning) { Log("warning: ", warning); });
  if (absl::IsNotFound(ckpt.status())) {
    Log("ps:", index_, " no checkpoint in ", ShardCheckpointDir(dir, index_), "; starting fresh");
    return absl::OkStatus();
  }
  if (!ckpt.ok()) return ckpt.status();
  const int64_t version = ckpt->version;
  if (absl::Status s = shard_->Restore(std::move(*ckpt)); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("cannot restore checkpoint of ps:", index_, ": ", s.message()));
  }
  metrics_.checkpoint_restores->Increment();
  metrics_.restored_version->Set(static_cast<double>(version));
  Log("ps:", index_, " restored version ", version, " from ", ShardCheckpointDir(dir, index_));
  return absl::OkStatus();
}

absl::Status PsTask::Start() {
  if (server_) return absl::OkStatus();
  const TrainingJob& job = config_.job;
  PsServiceOptions service_options;
  service_options.model_fingerprint = config_.fingerprint;
  service_options.max_chunk_bytes = job.training.chunk_bytes;
  service_options.job_key = options_.credentials.job_key;
  if (options_.bulk_port >= 0) {
    BulkServerOptions bulk;
    if (options_.credentials.tls()) {
      auto tls =
          BulkTlsContext::Create({options_.credentials.ca_cert_pem, options_.credentials.cert_pem,
                                  options_.credentials.key_pem, ""},
                                 /*server=*/true);
      if (!tls.ok()) return tls.status();
      bulk.tls = *std::move(tls);
    }
    bulk.bind_host = options_.bind_host;
    bulk.port = options_.bulk_port;
    bulk.max_chunk_bytes = job.training.chunk_bytes;
    bulk.job_key = options_.credentials.job_key;
    auto started = BulkServer::Start(shard_.get(), clock_, bulk, metrics_.service);
    if (!started.ok()) return started.status();
    bulk_ = *std::move(started);
    service_options.bulk_port = bulk_->port();
  }
  service_ = std::make_unique<PsService>(shard_.get(), clock_, service_options, metrics_.service);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string listen = absl::StrCat(options_.bind_host, ":", options_.port);
  builder.AddListeningPort(listen, PsServerCredentials(options_.credentials), &port_);
  ConfigurePsServer(job.training.chunk_bytes, &builder);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    bulk_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " (port in use?)"));
  }
  const ShardOptions& o = shard_->options();
  Log("ps:", index_, " serving ", job.name, " on ", options_.bind_host, ":", port_,
      bulk_ ? absl::StrCat(" (bulk data plane on port ", bulk_->port(), ")") : std::string(),
      ", metrics on ", metrics_server_ ? absl::StrCat(metrics_port_) : std::string("(off)"),
      "; mode ", TrainingModeName(job.training.mode), ", ", config_.num_workers,
      " workers, aggregate ", o.replicas_to_aggregate, ", target ", config_.target_steps, " steps");
  Log("job fingerprint ", config_.fingerprint, "; placement:\n", config_.placement.Describe());
  if (options_.credentials.job_key.empty()) {
    Log("warning: ps:", index_, " runs open (--insecure): no auth directory (--auth_dir, ",
        kAuthDirEnv, "), so any client that reaches its port may push, pull or end the job");
  } else {
    Log("ps:", index_, " admits only ", job.name, "'s tasks: tokens checked",
        options_.credentials.tls() ? ", mutual TLS under the job's CA" : ", no TLS (plaintext)");
  }
  return absl::OkStatus();
}

absl::Status PsTask::Serve() {
  if (absl::Status s = Start(); !s.ok()) return s;
  while (!RunRound(options_.tick)) {
  }
  // Held pulls are answered before the server goes: a worker's step then
  // sees UNAVAILABLE and asks the restarted PS (a rescheduled pod) again,
  // instead of failing with the CANCELLED of a shutdown.
  shard_->StopHolding(absl::UnavailableError(
      absl::StrCat("ps:", index_, " is stopping; a restarted PS answers a pull asked again")));
  if (bulk_) bulk_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return final_status_;
}

void PsTask::Stop() { ++stops_; }

int PsTask::StopsAndSignals() const {
  return stops_.load() + (options_.signals != nullptr ? options_.signals->load() : 0);
}

void PsTask::UpdateTableMetrics() {
  if (table_metrics_.empty()) return;
  const std::vector<Shard::TableCounts> counts = shard_->TableRowCounts();
  const std::vector<int64_t> bytes = shard_->TableBytes();
  for (size_t i = 0; i < table_metrics_.size() && i < counts.size(); ++i) {
    TableMetrics& m = table_metrics_[i];
    m.rows->Set(static_cast<double>(counts[i].rows));
    m.bytes->Set(static_cast<double>(bytes[i]));
    m.created->Increment(static_cast<double>(counts[i].created - m.reported.created));
    m.evicted->Increment(static_cast<double>(counts[i].evicted - m.reported.evicted));
    m.reported = counts[i];
  }
}

bool PsTask::RunRound(absl::Duration wait) {
  if (over_) return true;
  if (holding_) {
    over_ = HoldRound(wait);
    return over_;
  }
  // Waits unless a checkpoint boundary is crossed sooner: then it is written
  // at once, so a restart loses at most about everySteps steps.
  auto snapshot = shard_->TakePendingCheckpoint(wait);
  const absl::Time now = clock_->Now();
  shard_->Tick(now);
  UpdateTableMetrics();
  if (service_ && service_->Tick(now) > 0 && now - trimmed_at_ >= absl::Seconds(1)) {
    // Streams ended abnormally (cancelled, refused, idle): give the memory
    // they held back to the system now, whatever malloc's thresholds (the
    // PS keeps tensor-sized buffers in the process on purpose, see
    // InitProcess), so a burst of abusive streams does not stay resident.
    malloc_trim(0);
    trimmed_at_ = now;
  }
  const int64_t every_seconds = config_.job.training.checkpoint_every_seconds;
  if (snapshot) {
    SaveCheckpoint("every checkpoint.everySteps", std::move(snapshot));
  } else if (every_seconds > 0 && shard_->version() != saved_version_ &&
             now - saved_at_ >= absl::Seconds(every_seconds)) {
    SaveCheckpoint("every checkpoint.everySeconds");
  } else if (now >= retry_at_ && shard_->version() != saved_version_) {
    SaveCheckpoint("retry after a failed checkpoint");
  }
  bool over = StopsAndSignals() > 0;
  // The end: the chief's Shutdown, then every worker's (and evaluator's)
  // Leave, bounded by the grace period for tasks that died.
  if (!over && shard_->shutdown_requested()) {
    if (shutdown_at_ == absl::InfiniteFuture()) shutdown_at_ = now;
    if (shard_->all_workers_left() && shard_->all_evaluators_left()) {
      over = true;
    } else if (now - shutdown_at_ > options_.shutdown_grace) {
      Log("ps:", index_, " not every ", shard_->all_workers_left() ? "evaluator" : "worker",
          " left within ", absl::ToInt64Seconds(options_.shutdown_grace),
          " s of the chief's shutdown; exiting anyway");
      over = true;
    }
  }
  if (over) {
    Finish();
    if (!final_status_.ok() &&
        options_.keep_serving_after_checkpoint_failure > absl::ZeroDuration()) {
      StartHolding(clock_->Now());
      return false;
    }
  }
  over_ = over;
  return over;
}

void PsTask::StartHolding(absl::Time now) {
  const std::string& dir = config_.job.training.checkpoint_dir;
  holding_ = true;
  hold_until_ = now + options_.keep_serving_after_checkpoint_failure;
  stops_at_hold_ = StopsAndSignals();
  shard_->SetReadOnly(absl::StrCat(
      "ps:", index_,
      " is read-only: its final checkpoint could not be written to "
      "spec.training.checkpoint.directory ",
      dir, "; it only serves pulls, for `kubetrain export --from-ps`, until it exits"));
  metrics_.holding->Set(1);
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  Log("ps:", index_, " could not write its final checkpoint (version ", shard_->version(), ") to ",
      dir, " (spec.training.checkpoint.directory); ", kHoldingParametersNote,
      server_ ? absl::StrCat(" on ", options_.bind_host, ":", port_) : "", " for ",
      absl::FormatDuration(options_.keep_serving_after_checkpoint_failure),
      ", then exits 1 (SIGTERM again to exit now)");
}

bool PsTask::HoldRound(absl::Duration wait) {
  // Nothing changes any more: no boundary will come; this only paces the round.
  shard_->TakePendingCheckpoint(wait);
  const absl::Time now = clock_->Now();
  shard_->Tick(now);
  if (service_) service_->Tick(now);
  if (now >= retry_at_ && SaveCheckpoint("final, retried while holding the parameters")) {
    final_status_ = absl::OkStatus();  // the parameters are safe after all
    EndHolding("its final checkpoint was written after all");
    return true;
  }
  if (StopsAndSignals() > stops_at_hold_) {
    EndHolding("stopped (SIGTERM or Stop)");
    return true;
  }
  if (now >= hold_until_) {
    EndHolding(absl::StrCat("the ",
                            absl::FormatDuration(options_.keep_serving_after_checkpoint_failure),
                            " of --keep_serving_after_checkpoint_failure_seconds are over"));
    return true;
  }
  return false;
}

void PsTask::EndHolding(const std::string& why) {
  holding_ = false;
  metrics_.holding->Set(0);
  Log("ps:", index_, " stops serving the parameters: ", why);
}

bool PsTask::SaveCheckpoint(const char* why, std::unique_ptr<CheckpointSource> image) {
  const std::string& dir = config_.job.training.checkpoint_dir;
  if (dir.empty()) return true;
  // This thread closes every checkpoint it takes before the next, so one opens.
  if (!image) image = shard_->StartCheckpoint();
  const ShardCheckpoint& state = image->fields();
  const absl::Time t0 = absl::Now();
  auto note = [this](const std::string& what) { Log("ps:", index_, " ", what); };
  absl::Status s = WriteShardCheckpoint(dir, *image, 3, options_.env, note);
  if (!s.ok()) {
    metrics_.checkpoint_failures->Increment();
    shard_->RecordCheckpointWrite(absl::Status(
        s.code(), absl::StrCat("ps:", index_, " at version ", state.version, ": ", s.message())));
    ++failures_in_a_row_;
    const absl::Duration backoff = std::min(
        absl::Minutes(1), options_.checkpoint_retry * (1 << std::min(failures_in_a_row_ - 1, 6)));
    retry_at_ = clock_->Now() + backoff;
    Log("warning: checkpoint of ps:", index_, " at version ", state.version, " (", why,
        ") failed: ", s.message(),
        finished_ ? "; retrying in " : "; training goes on, retrying in ",
        absl::FormatDuration(backoff), " (spec.training.checkpoint.directory ", dir, ")");
    return false;
  }
  metrics_.checkpoints_written->Increment();
  shard_->RecordCheckpointWrite(absl::OkStatus());
  failures_in_a_row_ = 0;
  retry_at_ = absl::InfiniteFuture();
  saved_version_ = state.version;
  saved_at_ = clock_->Now();
  Log("ps:", index_, " checkpoint at version ", state.version, " (", why, ", ",
      absl::FormatDuration(absl::Now() - t0), ")");
  return true;
}

void PsTask::Finish() {
  if (finished_) return;
  finished_ = true;
  // The parameters outlive the task only on disk: try hard before giving up.
  const std::string& dir = config_.job.training.checkpoint_dir;
  for (int attempt = 1; !dir.empty() && shard_->version() != saved_version_; ++attempt) {
    if (SaveCheckpoint("final")) break;
    if (attempt >= options_.final_checkpoint_attempts) {
      final_status_ = absl::InternalError(
          absl::StrCat("the final checkpoint of ps:", index_, " at version ", shard_->version(),
                       " could not be written to spec.training.checkpoint.directory ", dir,
                       " after ", attempt, " attempts (see the warnings above)"));
      break;
    }
    // Short waits: a stopping task has seconds before it is killed.
    clock_->SleepFor(std::min(absl::Seconds(1), retry_at_ - clock_->Now()));
  }
  const ShardStatsSnapshot stats = shard_->stats();
  Log("ps:", index_, " done at version ", stats.version, ": ", stats.gradients_applied,
      " gradients applied, ", stats.stale_gradients_dropped, " stale dropped, ",
      stats.pushes_rejected, " rejected",
      bulk_ ? absl::StrCat("; ", bulk_->calls_answered(),
                           " pulls and pushes over the bulk data plane")
            : std::string());
}

}  // namespace kubetrain
