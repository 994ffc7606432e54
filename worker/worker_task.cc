#include "worker/worker_task.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "core/cluster_spec.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace kubetrain {
namespace {

void LogSkipped(int64_t skipped, const char* which) {
  if (skipped > 0) {
    Log("skipped ", skipped, " bad records in the ", which, " files (onBadRecord: skip)");
  }
}

absl::StatusOr<std::shared_ptr<const TrainingSet>> OpenTrain(const TaskConfig& config) {
  const TrainingSpec& spec = config.job.training;
  auto data = OpenTrainingSet(spec);
  if (!data.ok()) return data.status();
  LogSkipped(data->skipped_records, "training");
  if (data->size != config.train_examples) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.dataset_path, " has ", data->size, " training examples, expected ",
                     config.train_examples, " for ", spec.dataset_name));
  }
  return std::make_shared<const TrainingSet>(std::move(*data));
}

absl::StatusOr<std::shared_ptr<const Dataset>> LoadTest(const TaskConfig& config,
                                                        const TrainingSet* train_set) {
  auto data = LoadTestSet(config.job.training, train_set);
  if (!data.ok()) return data.status();
  LogSkipped(data->skipped_records, "test");
  return std::make_shared<const Dataset>(std::move(*data));
}

}  // namespace

absl::Status WorkerTask::ExplainMismatch(const absl::Status& s) const {
  return ExplainFingerprintMismatch(s, config_.fingerprint, "give every task the same job file");
}

absl::StatusOr<std::unique_ptr<WorkerTask>> WorkerTask::Create(
    TaskConfig config, WorkerTaskOptions options, const Clock* clock,
    std::shared_ptr<prometheus::Registry> registry,
    std::vector<std::unique_ptr<ShardChannel>> channels, WorkerData data) {
  const std::string type = config.tf.task_type;
  const int index = config.tf.task_index;
  if (type != "worker" && type != "chief" && type != "evaluator") {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG task type is \"", type,
                     "\", kubetrain-worker runs \"worker\", \"chief\" and \"evaluator\" tasks"));
  }
  if (type == "chief" && !config.job.has_chief_replica()) {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG task type is \"chief\", but ",
                                                   config.job.name, " has no Chief replica"));
  }
  if (options.threads < WorkerTaskOptions::kThreadsFromJob) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads must be >= 1 (or 0: the CPU limit, -1: the job's), got ", options.threads));
  }
  const bool threads_from_cpu_limit = options.threads == 0;
  if (options.threads == WorkerTaskOptions::kThreadsFromJob) {
    auto replica = config.job.replica_specs.find(ReplicaKeyOf(type));
    options.threads = replica == config.job.replica_specs.end() ? 1 : replica->second.threads();
  }
  if (config.model) {
    config.model->SetThreads(threads_from_cpu_limit ? ThreadsFromCpuLimit() : options.threads);
  }
  if (options.export_model.empty() && !config.job.training.checkpoint_dir.empty()) {
    options.export_model = config.job.training.checkpoint_dir + "/model.ktm";
    options.export_policy.field = "spec.training.checkpoint.directory";
  }
  if (!options.export_model.empty() && config.job.IsChiefTask(type, index)) {
    // Fail now, not after training, if the model cannot be saved there.
    const std::string& path = options.export_model;
    const size_t slash = path.rfind('/');
    const std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    if (absl::Status s = ProbeWritableDir(options.export_policy.env, dir); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          options.export_policy.field, ": ",
          options.export_policy.field == "--export_model" ? path
                                                          : config.job.training.checkpoint_dir,
          " is not writable: ", s.message()));
    }
  }
  std::unique_ptr<WorkerTask> task(
      new WorkerTask(std::move(config), std::move(options), clock, std::move(registry)));
  const TaskConfig& c = task->config_;
  task->name_ = absl::StrCat(type, ":", index);
  task->threads_from_cpu_limit_ = threads_from_cpu_limit;
  task->is_chief_ = c.job.IsChiefTask(type, index);
  task->trains_ = type == "worker";
  task->RegisterMetrics();
  if (!task->options_.metrics_address.empty()) {
    auto m = MetricsServer::Start(task->options_.metrics_address, task->registry_);
    if (!m.ok()) return m.status();
    task->metrics_server_ = std::move(*m);
  }
  // A worker trains on the training set; whoever evaluates needs the test
  // set; the chief of a job with a Chief replica reports the loss on a
  // sample of the training set.
  const bool needs_train = task->trains_ || type == "chief";
  const bool needs_test = task->is_chief_ || type == "evaluator";
  task->data_ = std::move(data);
  if (needs_train && task->data_.train == nullptr) {
    auto train = OpenTrain(c);
    if (!train.ok()) return train.status();
    task->data_.train = std::move(*train);
  }
  if (needs_train && !task->trains_) {
    auto sample = ReadRecords(*task->data_.train->source, kLossSampleExamples);
    if (!sample.ok()) return sample.status();
    task->loss_sample_ = std::make_shared<const Dataset>(std::move(*sample));
  }
  if (needs_test && task->data_.test == nullptr) {
    auto test = LoadTest(c, task->data_.train.get());
    if (!test.ok()) return test.status();
    task->data_.test = std::move(*test);
  }
  if (task->trainer_metrics_.records_skipped) {
    const int64_t skipped = (task->data_.train ? task->data_.train->skipped_records : 0) +
                            (task->data_.test ? task->data_.test->skipped_records : 0);
    task->trainer_metrics_.records_skipped->Increment(static_cast<double>(skipped));
  }
  PsClient::Options client_options;
  client_options.task_type = type == "chief"       ? v1::TASK_TYPE_CHIEF
                             : type == "evaluator" ? v1::TASK_TYPE_EVALUATOR
                                                   : v1::TASK_TYPE_WORKER;
  client_options.task_index = index;
  client_options.fingerprint = c.fingerprint;
  client_options.chunk_bytes = c.job.training.chunk_bytes;
  client_options.retry_timeout = absl::Seconds(c.job.training.startup_timeout_seconds);
  task->client_ = std::make_unique<PsClient>(client_options, &c.placement, clock,
                                             std::move(channels), task->client_metrics_);
  return task;
}

WorkerTask::WorkerTask(TaskConfig config, WorkerTaskOptions options, const Clock* clock,
                       std::shared_ptr<prometheus::Registry> registry)
    : config_(std::move(config)),
      options_(std::move(options)),
      clock_(clock),
      registry_(std::move(registry)) {}

void WorkerTask::RegisterMetrics() {
  prometheus::Registry& registry = *registry_;
  auto& rpc = prometheus::BuildHistogram()
                  .Name("kubetrain_rpc_duration_seconds")
                  .Help("RPC duration by method, measured where the RPC is handled or issued")
                  .Register(registry);
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
  };
  auto histogram = [&](const char* name, const char* help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
        {}, LatencyBuckets());
  };
  client_metrics_ =
      PsClientMetrics{&rpc.Add({{"method", "Pull"}, {"side", "client"}}, LatencyBuckets()),
                      &rpc.Add({{"method", "Push"}, {"side", "client"}}, LatencyBuckets()),
                      counter("kubetrain_pull_bytes_total", "Tensor bytes received by pulls"),
                      counter("kubetrain_push_bytes_total", "Tensor bytes sent by pushes"),
                      counter("kubetrain_sparse_pull_bytes_total",
                              "Embedding-table row bytes received by sparse pulls"),
                      counter("kubetrain_sparse_push_bytes_total",
                              "Embedding-table gradient row bytes sent by pushes"),
                      &rpc.Add({{"method", "PushPull"}, {"side", "client"}}, LatencyBuckets())};
  TrainerMetrics& m = trainer_metrics_;
  m.barrier_wait_seconds =
      histogram("kubetrain_sync_barrier_wait_seconds",
                "Sync mode: time a worker waited at the step barrier for the other replicas");
  m.staleness_wait_seconds = histogram("kubetrain_staleness_bound_wait_seconds",
                                       "Async mode: time a worker was held back by maxStaleness");
  m.compute_seconds =
      histogram("kubetrain_compute_seconds", "Time to compute one batch's gradients");
  m.steps = counter("kubetrain_worker_steps_total", "Gradients this worker computed and pushed");
  m.examples =
      counter("kubetrain_worker_examples_total", "Training examples this worker processed");
  m.dropped = counter("kubetrain_worker_gradients_dropped_total",
                      "This worker's gradients the PS dropped as stale");
  m.global_step = gauge(kGlobalStepMetric, "Global step (PS version) last seen by this task");
  m.loss = gauge(
      kTrainingLossMetric,
      "Mean training loss over this worker's recent steps (the chief's: on a training sample)");
  m.accuracy =
      gauge(kEvalAccuracyMetric, "Test accuracy at the last evaluation (chief, evaluator)");
  m.auc = gauge("kubetrain_eval_auc",
                "Test AUC at the last evaluation, binary labels only (chief, evaluator)");
  m.log_loss = gauge("kubetrain_eval_log_loss",
                     "Test log loss at the last evaluation, binary labels only (chief, evaluator)");
  m.rmse = gauge("kubetrain_eval_rmse",
                 "Test RMSE at the last evaluation, regression only (chief, evaluator)");
  m.records_skipped =
      counter("kubetrain_data_records_skipped_total",
              "Bad data records this task dropped while loading (onBadRecord: skip)");
  m.unique_ids =
      &prometheus::BuildHistogram()
           .Name("kubetrain_sparse_unique_ids")
           .Help("Distinct embedding-table ids one batch looks up (all tables)")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{1, 10, 100, 1000, 1e4, 1e5, 1e6});
  m.steps_lost = counter("kubetrain_steps_lost_total",
                         "Global steps lost because a PS restarted from an older checkpoint");
  if (is_chief_) {
    target_steps_ = gauge(kTargetStepsMetric, "Global steps the job trains for (chief)");
    target_steps_->Set(static_cast<double>(config_.target_steps));
    m.examples_per_second = gauge(
        kExamplesPerSecondMetric,
        "Training examples per second over the whole job, at the last progress report (chief)");
    job_absent_workers_ =
        gauge(kAbsentWorkersMetric,
              "Sync workers the PS tasks do not wait for (most over PS tasks), at the last "
              "progress report (chief)");
    job_checkpoint_failures_ =
        gauge(kCheckpointFailuresMetric,
              "Checkpoint writes that failed, summed over the PS tasks since they started, at the "
              "last progress report (chief)");
    job_checkpoints_failing_ =
        &prometheus::BuildGauge()
             .Name(kCheckpointsFailingMetric)
             .Help(
                 "PS tasks whose latest checkpoint write failed, at the last progress report "
                 "(chief); last_error: the latest failure (task, version, OS error)")
             .Register(registry);
  }
}

void WorkerTask::Report(const std::string& line) const {
  if (options_.report_sink) {
    options_.report_sink(line);
    return;
  }
  const std::string out = line + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

void WorkerTask::ReportProgress(const Progress& trainer) {
  Progress p = trainer;
  if (auto stats = client_->Stats(); stats.ok()) {
    ps_stats_ = *stats;
  } else {
    Log("warning: ", name_,
        " cannot read the PS tasks' stats for its report: ", stats.status().message());
  }
  p.absent_workers = std::max<int64_t>(p.absent_workers, ps_stats_.absent_workers());
  p.checkpoint_failures = ps_stats_.checkpoint_failures();
  p.checkpoints_failing = ps_stats_.checkpoints_failing();
  p.checkpoint_error = ps_stats_.checkpoint_error();
  job_absent_workers_->Set(static_cast<double>(p.absent_workers));
  job_checkpoint_failures_->Set(static_cast<double>(p.checkpoint_failures));
  if (!p.checkpoint_error.empty()) {
    // One series, labelled with the latest failure (bounded: the message is
    // the task, version, path and OS error).
    if (failing_series_ == nullptr || failing_label_ != p.checkpoint_error) {
      if (failing_series_ != nullptr) job_checkpoints_failing_->Remove(failing_series_);
      failing_label_ = p.checkpoint_error;
      failing_series_ = &job_checkpoints_failing_->Add({{kCheckpointErrorLabel, failing_label_}});
    }
    failing_series_->Set(static_cast<double>(p.checkpoints_failing));
  }
  Report(FormatReportLine(p));
}

JobResult WorkerTask::MakeResult(const TrainResult& t) const {
  JobResult r;
  r.status = "Succeeded";
  r.mode = TrainingModeName(config_.job.training.mode);
  r.global_step = t.global_step;
  r.target_steps = config_.target_steps;
  r.test_accuracy = t.test_accuracy;
  r.test_auc = t.test_metrics.auc;
  if (t.test_metrics.auc) r.test_log_loss = t.test_metrics.log_loss;
  r.test_rmse = t.test_metrics.rmse;
  r.records_skipped = (data_.train ? data_.train->skipped_records : 0) +
                      (data_.test ? data_.test->skipped_records : 0);
  r.final_loss = t.final_loss;
  r.wall_seconds = t.wall_seconds;
  r.examples_per_second = t.examples_per_second;
  r.gradients_applied = t.ps_stats.gradients_applied();
  r.stale_gradients_dropped = t.ps_stats.stale_gradients_dropped();
  r.pushes_rejected = t.ps_stats.pushes_rejected();
  r.barrier_timeouts = t.ps_stats.barrier_timeouts();
  r.restored_version = t.ps_stats.restored_version();
  r.steps_lost = t.steps_lost;
  r.ps_restarts_seen = t.ps_restarts_seen;
  r.model_path = t.model_path;
  r.export_failures = t.export_failures;
  r.max_staleness = t.ps_stats.staleness_max();
  r.absent_workers = t.ps_stats.absent_workers();
  r.checkpoint_failures = t.ps_stats.checkpoint_failures();
  r.checkpoints_failing = t.ps_stats.checkpoints_failing();
  r.checkpoint_error = t.ps_stats.checkpoint_error();
  r.dynamic_rows = t.ps_stats.dynamic_rows();
  r.dynamic_rows_evicted = t.ps_stats.dynamic_rows_evicted();
  r.mean_staleness =
      t.ps_stats.gradients_applied() > 0
          ? static_cast<double>(t.ps_stats.staleness_sum()) / t.ps_stats.gradients_applied()
          : 0.0;
  return r;
}

absl::Status WorkerTask::Run() {
  const TrainingSpec& spec = config_.job.training;
  const int index = config_.tf.task_index;
  Log(name_, is_chief_ && trains_ ? " (chief)" : "", " connecting to ", config_.num_ps,
      " PS tasks; metrics on ",
      metrics_server_ ? absl::StrCat(metrics_server_->port()) : std::string("(off)"),
      "; computing on ", threads(), threads() == 1 ? " thread" : " threads",
      threads_from_cpu_limit_ ? " (the CPU limit)" : "");
  if (absl::Status s = client_->Connect(); !s.ok()) return ExplainMismatch(s);
  auto on_progress = [this](const Progress& p) { ReportProgress(p); };
  absl::StatusOr<TrainResult> result;
  if (trains_) {
    Log(name_, " training ", config_.job.name, ": ", TrainingModeName(spec.mode), ", ",
        spec.model.type, ", ", config_.target_steps, " global steps, shard of ",
        ShardedBatcher::ShardSize(data_.train->size, index, config_.num_workers, spec.seed),
        " examples (shuffle buffer ", spec.shuffle_buffer, " records)");
    TrainerOptions options;
    options.worker_index = index;
    options.is_chief = is_chief_;
    options.progress_interval = options_.progress_interval;
    options.step_delay = options_.step_delay;
    options.overlap_layers = options_.overlap_layers;
    if (is_chief_) {
      options.export_model = options_.export_model;
      options.export_policy = options_.export_policy;
    }
    result = Train(config_, options, client_.get(), *data_.train->source, data_.test.get(), clock_,
                   trainer_metrics_, on_progress);
  } else {
    Log(name_, " following ", config_.job.name, ": ", TrainingModeName(spec.mode), ", ",
        spec.model.type, ", ", config_.target_steps, " global steps, evaluating every ",
        spec.eval_every_steps > 0 ? absl::StrCat(spec.eval_every_steps, " steps and ") : "",
        "at the end");
    FollowOptions options;
    options.is_chief = is_chief_;
    options.progress_interval = options_.progress_interval;
    if (is_chief_) {
      options.export_model = options_.export_model;
      options.export_policy = options_.export_policy;
    }
    result = Follow(config_, options, client_.get(), *data_.test, loss_sample_.get(), clock_,
                    trainer_metrics_, on_progress);
  }
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        absl::StrCat(name_, ": ", result.status().message()));
  }
  if (trains_) {
    Log(name_, " done: ", result->local_steps, " local steps, global step ", result->global_step);
  } else {
    Log(name_, " done: global step ", result->global_step, ", test accuracy ",
        result->test_accuracy);
  }
  if (!is_chief_) return absl::OkStatus();
  result_ = MakeResult(*result);
  Report(FormatReportLine(*result_));
  if (!options_.result_file.empty()) {
    std::ofstream out(options_.result_file);
    out << ToJson(*result_).dump() << "\n";
    if (!out) Log("warning: cannot write ", options_.result_file);
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
