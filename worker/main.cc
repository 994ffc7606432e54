// kubetrain-worker: one worker task. Reads the TrainingJob file and TF_CONFIG,
// trains its data shard against the PS tasks, serves /metrics, and exits 0
// when the job reached its target. Worker 0 is the chief: it prints progress
// and the final result ("kubetrain-progress {json}" / "kubetrain-result
// {json}" lines on stdout) and ends the job on every PS.
#include <malloc.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "core/dataset.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/metrics.h"
#include "core/task_config.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace kubetrain {
namespace {

struct WorkerFlags {
  std::string config;
  std::string tf_config;
  std::string metrics_address = "0.0.0.0:9090";
  std::string result_file;
  double progress_interval_seconds = 1.0;
  int64_t step_delay_ms = 0;
  std::string export_model;
};

void PrintLine(const std::string& tag, const nlohmann::json& j) {
  std::string line = tag + " " + j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

int Run(const WorkerFlags& flags) {
  auto config = LoadTaskConfig(flags.config, flags.tf_config);
  if (!config.ok()) {
    Log("error: ", config.status().message());
    return 2;
  }
  if (config->tf.task_type != "worker") {
    Log("error: TF_CONFIG task type is \"", config->tf.task_type,
        "\", kubetrain-worker runs \"worker\" tasks");
    return 2;
  }
  const int index = config->tf.task_index;
  const bool chief = index == 0;
  const TrainingSpec& spec = config->job.training;

  auto registry = std::make_shared<prometheus::Registry>();
  auto& rpc = prometheus::BuildHistogram()
                  .Name("kubetrain_rpc_duration_seconds")
                  .Help("RPC duration by method, measured where the RPC is handled or issued")
                  .Register(*registry);
  auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(*registry).Add({});
  };
  auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(*registry).Add({});
  };
  auto histogram = [&](const char* name, const char* help) -> prometheus::Histogram& {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry).Add({}, LatencyBuckets());
  };
  PsClientMetrics client_metrics{
      &rpc.Add({{"method", "Pull"}, {"side", "client"}}, LatencyBuckets()),
      &rpc.Add({{"method", "Push"}, {"side", "client"}}, LatencyBuckets()),
      &counter("kubetrain_pull_bytes_total", "Tensor bytes received by pulls"),
      &counter("kubetrain_push_bytes_total", "Tensor bytes sent by pushes")};
  TrainerMetrics trainer_metrics{
      &histogram("kubetrain_sync_barrier_wait_seconds",
                 "Sync mode: time a worker waited at the step barrier for the other replicas"),
      &histogram("kubetrain_staleness_bound_wait_seconds",
                 "Async mode: time a worker was held back by maxStaleness"),
      &histogram("kubetrain_compute_seconds", "Time to compute one batch's gradients"),
      &counter("kubetrain_worker_steps_total", "Gradients this worker computed and pushed"),
      &counter("kubetrain_worker_examples_total", "Training examples this worker processed"),
      &counter("kubetrain_worker_gradients_dropped_total",
               "This worker's gradients the PS dropped as stale"),
      &gauge("kubetrain_global_step", "Global step (PS version) last seen by this worker"),
      &gauge("kubetrain_training_loss", "Mean training loss over this worker's recent steps"),
      &gauge("kubetrain_eval_accuracy", "Test accuracy at the last evaluation (chief)"),
      &counter("kubetrain_steps_lost_total",
               "Global steps lost because a PS restarted from an older checkpoint")};

  std::unique_ptr<MetricsServer> metrics;
  if (!flags.metrics_address.empty()) {
    auto m = MetricsServer::Start(flags.metrics_address, registry);
    if (!m.ok()) {
      Log("error: ", m.status().message());
      return 2;
    }
    metrics = std::move(*m);
  }

  auto train = LoadFashionMnist(spec.dataset_path, /*train=*/true);
  if (!train.ok()) {
    Log("error: ", train.status().message());
    return 2;
  }
  if (train->size != config->train_examples) {
    Log("error: ", spec.dataset_path, " has ", train->size, " training examples, expected ",
        config->train_examples, " for ", spec.dataset_name);
    return 2;
  }
  std::unique_ptr<Dataset> test;
  if (chief) {
    auto t = LoadFashionMnist(spec.dataset_path, /*train=*/false);
    if (!t.ok()) {
      Log("error: ", t.status().message());
      return 2;
    }
    test = std::make_unique<Dataset>(std::move(*t));
  }

  RealClock clock;
  std::vector<std::unique_ptr<ShardChannel>> channels;
  for (const auto& address : config->tf.tasks("ps")) {
    channels.push_back(NewGrpcShardChannel(address, spec.chunk_bytes));
  }
  PsClient::Options client_options;
  client_options.worker_index = index;
  client_options.fingerprint = config->placement.Fingerprint();
  client_options.chunk_bytes = spec.chunk_bytes;
  client_options.retry_timeout = absl::Seconds(spec.startup_timeout_seconds);
  PsClient client(client_options, &config->placement, &clock, std::move(channels), client_metrics);
  Log("worker:", index, chief ? " (chief)" : "", " connecting to ", config->num_ps,
      " PS tasks; metrics on ", metrics ? absl::StrCat(metrics->port()) : std::string("(off)"));
  if (absl::Status s = client.Connect(); !s.ok()) {
    Log("error: ", s.message());
    return 1;
  }
  Log("worker:", index, " training ", config->job.name, ": ", TrainingModeName(spec.mode), ", ",
      spec.model.type, ", ", config->target_steps, " global steps, shard of ",
      train->size / config->num_workers, " examples");

  std::string export_path = flags.export_model;
  if (export_path.empty() && !spec.checkpoint_dir.empty()) export_path = spec.checkpoint_dir + "/model.ktm";
  TrainerOptions options;
  options.worker_index = index;
  options.is_chief = chief;
  options.progress_interval = absl::Seconds(flags.progress_interval_seconds);
  options.step_delay = absl::Milliseconds(flags.step_delay_ms);
  if (chief) options.export_model = export_path;
  auto on_progress = [](const Progress& p) {
    nlohmann::json j = {{"global_step", p.global_step},
                        {"target_steps", p.target_steps},
                        {"loss", p.loss},
                        {"examples_per_second", p.examples_per_second}};
    if (p.accuracy >= 0) j["accuracy"] = p.accuracy;
    PrintLine("kubetrain-progress", j);
  };
  auto result = Train(*config, options, &client, *train, test.get(), &clock, trainer_metrics, on_progress);
  if (!result.ok()) {
    Log("error: worker:", index, ": ", result.status().message());
    return 1;
  }
  Log("worker:", index, " done: ", result->local_steps, " local steps, global step ",
      result->global_step);
  if (chief) {
    nlohmann::json j = {{"status", "Succeeded"},
                        {"mode", TrainingModeName(spec.mode)},
                        {"global_step", result->global_step},
                        {"target_steps", config->target_steps},
                        {"test_accuracy", result->test_accuracy},
                        {"final_loss", result->final_loss},
                        {"wall_seconds", result->wall_seconds},
                        {"examples_per_second", result->examples_per_second},
                        {"gradients_applied", result->ps_stats.gradients_applied()},
                        {"stale_gradients_dropped", result->ps_stats.stale_gradients_dropped()},
                        {"pushes_rejected", result->ps_stats.pushes_rejected()},
                        {"barrier_timeouts", result->ps_stats.barrier_timeouts()},
                        {"restored_version", result->ps_stats.restored_version()},
                        {"steps_lost", result->steps_lost},
                        {"ps_restarts_seen", result->ps_restarts_seen},
                        {"model_path", result->model_path},
                        {"max_staleness", result->ps_stats.staleness_max()},
                        {"mean_staleness", result->ps_stats.gradients_applied() > 0
                                               ? static_cast<double>(result->ps_stats.staleness_sum()) /
                                                     result->ps_stats.gradients_applied()
                                               : 0.0}};
    PrintLine("kubetrain-result", j);
    if (!flags.result_file.empty()) {
      std::ofstream out(flags.result_file);
      out << j.dump() << "\n";
      if (!out) Log("warning: cannot write ", flags.result_file);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kubetrain

int main(int argc, char** argv) {
  kubetrain::WorkerFlags flags;
  if (const char* tf = std::getenv("TF_CONFIG")) flags.tf_config = tf;
  kubetrain::FlagParser parser("kubetrain-worker --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  parser.String("config", &flags.config, "TrainingJob YAML file");
  parser.String("tf_config", &flags.tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser.String("metrics_address", &flags.metrics_address, "host:port for /metrics; empty = off");
  parser.String("result_file", &flags.result_file,
                "chief: also write the final result JSON here (e.g. /dev/termination-log)");
  parser.Double("progress_interval_seconds", &flags.progress_interval_seconds,
                "how often the chief reports progress");
  parser.String("export_model", &flags.export_model,
                "chief: write the final model here (default: <checkpoint.directory>/model.ktm when checkpoints are on)");
  parser.Int("step_delay_ms", &flags.step_delay_ms,
             "sleep this long before every step: makes this worker a straggler (for experiments and tests)");
  auto st = parser.Parse(argc, argv, 1, nullptr);
  if (!st.ok() || parser.help_requested()) {
    std::fprintf(stderr, "%s%s\n", st.ok() ? "" : ("error: " + std::string(st.message()) + "\n\n").c_str(),
                 parser.Usage().c_str());
    return st.ok() ? 0 : 2;
  }
  if (flags.config.empty()) {
    std::fprintf(stderr, "error: --config is required\n\n%s", parser.Usage().c_str());
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  // Tensor-sized buffers come and go on every RPC: keep freed memory in the
  // process instead of returning it to the kernel and faulting it in again.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  return kubetrain::Run(flags);
}
