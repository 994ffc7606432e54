// kubetrain-ps: one parameter-server task. Reads the TrainingJob file and
// TF_CONFIG, holds its shard of the model, serves workers over gRPC and
// /metrics over HTTP, and exits 0 once the chief has ended training and every
// worker has left (or a grace period has passed).
#include <malloc.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "core/cluster_spec.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/metrics.h"
#include "core/task_config.h"
#include "ps/checkpoint.h"
#include "ps/service.h"
#include "ps/shard.h"

namespace kubetrain {
namespace {

struct PsFlags {
  std::string config;
  std::string tf_config;
  std::string bind_host = "0.0.0.0";
  std::string metrics_address = "0.0.0.0:9090";
  int64_t shutdown_grace_seconds = 30;
};

int Run(const PsFlags& flags) {
  auto config = LoadTaskConfig(flags.config, flags.tf_config);
  if (!config.ok()) {
    Log("error: ", config.status().message());
    return 2;
  }
  if (config->tf.task_type != "ps") {
    Log("error: TF_CONFIG task type is \"", config->tf.task_type, "\", kubetrain-ps runs \"ps\" tasks");
    return 2;
  }
  const TrainingJob& job = config->job;
  const int index = config->tf.task_index;
  auto port = PortOf(config->tf.self_address());
  if (!port.ok()) {
    Log("error: ", port.status().message());
    return 2;
  }

  auto registry = std::make_shared<prometheus::Registry>();
  auto& staleness = prometheus::BuildHistogram()
                        .Name("kubetrain_gradient_staleness_steps")
                        .Help("Global steps between the version a gradient was computed on and the version it was applied to (async)")
                        .Register(*registry)
                        .Add({}, StalenessBuckets());
  auto& dropped = prometheus::BuildCounter()
                      .Name("kubetrain_stale_gradients_dropped_total")
                      .Help("Sync-mode gradients dropped because they were computed on an older version")
                      .Register(*registry)
                      .Add({});
  auto& applied = prometheus::BuildCounter()
                      .Name("kubetrain_gradients_applied_total")
                      .Help("Worker gradients applied to this PS shard")
                      .Register(*registry)
                      .Add({});
  auto& rejected = prometheus::BuildCounter()
                       .Name("kubetrain_pushes_rejected_total")
                       .Help("Pushes refused as invalid (unknown worker, wrong size, non-finite values, future version)")
                       .Register(*registry)
                       .Add({});
  auto& version = prometheus::BuildGauge()
                      .Name("kubetrain_global_step")
                      .Help("Optimizer steps applied (the shard's version)")
                      .Register(*registry)
                      .Add({});
  auto& hold = prometheus::BuildHistogram()
                   .Name("kubetrain_pull_hold_seconds")
                   .Help("How long the PS held pulls for the sync barrier or the staleness bound")
                   .Register(*registry)
                   .Add({}, LatencyBuckets());
  auto& rpc = prometheus::BuildHistogram()
                  .Name("kubetrain_rpc_duration_seconds")
                  .Help("RPC duration by method, measured where the RPC is handled or issued")
                  .Register(*registry);
  auto& bytes_pulled = prometheus::BuildCounter()
                           .Name("kubetrain_pull_bytes_total")
                           .Help("Tensor bytes sent by pulls")
                           .Register(*registry)
                           .Add({});
  auto& bytes_pushed = prometheus::BuildCounter()
                           .Name("kubetrain_push_bytes_total")
                           .Help("Tensor bytes received by pushes")
                           .Register(*registry)
                           .Add({});
  auto& barrier_timeouts = prometheus::BuildCounter()
                               .Name("kubetrain_barrier_timeouts_total")
                               .Help("Sync steps applied after barrierTimeoutSeconds without every expected gradient")
                               .Register(*registry)
                               .Add({});
  auto& checkpoints_written = prometheus::BuildCounter()
                                  .Name("kubetrain_checkpoints_written_total")
                                  .Help("Shard checkpoints written")
                                  .Register(*registry)
                                  .Add({});
  auto& checkpoint_restores = prometheus::BuildCounter()
                                  .Name("kubetrain_checkpoint_restores_total")
                                  .Help("Times this PS task started from a checkpoint")
                                  .Register(*registry)
                                  .Add({});
  auto& restored_version = prometheus::BuildGauge()
                               .Name("kubetrain_restored_version")
                               .Help("Version restored from a checkpoint when this PS task started (0: none)")
                               .Register(*registry)
                               .Add({});
  auto& pull_seconds = rpc.Add({{"method", "Pull"}, {"side", "server"}}, LatencyBuckets());
  auto& push_seconds = rpc.Add({{"method", "Push"}, {"side", "server"}}, LatencyBuckets());

  RealClock clock;
  ShardOptions options;
  options.shard_index = index;
  options.num_workers = config->num_workers;
  options.mode = job.training.mode;
  options.replicas_to_aggregate = job.effective_replicas_to_aggregate();
  options.max_staleness = job.training.max_staleness;
  options.target_steps = config->target_steps;
  options.seed = job.training.seed;
  options.barrier_timeout = absl::Seconds(job.training.barrier_timeout_seconds);
  options.incarnation = absl::ToUnixMicros(absl::Now());
  options.checkpoint_every_steps =
      job.training.checkpoint_dir.empty() ? 0 : job.training.checkpoint_every_steps;
  options.job_name = job.name;
  options.fingerprint = config->placement.Fingerprint();
  options.optimizer_type = job.training.optimizer.type;
  auto shard = Shard::Create(options, *config->model, config->placement, job.training.optimizer,
                             &clock,
                             ShardMetrics{&staleness, &dropped, &applied, &rejected, &version, &hold,
                                          &barrier_timeouts});
  if (!shard.ok()) {
    Log("error: ", shard.status().message());
    return 2;
  }
  const std::string& ckpt_dir = job.training.checkpoint_dir;
  const std::string fingerprint = config->placement.Fingerprint();
  if (!ckpt_dir.empty()) {
    auto ckpt = RestoreShardCheckpoint(ckpt_dir, index, fingerprint, job.training.optimizer.type,
                                       [](const std::string& warning) { Log("warning: ", warning); });
    if (ckpt.ok()) {
      if (absl::Status s = (*shard)->Restore(*ckpt); !s.ok()) {
        Log("error: cannot restore checkpoint of ps:", index, ": ", s.message());
        return 2;
      }
      checkpoint_restores.Increment();
      restored_version.Set(static_cast<double>(ckpt->version));
      Log("ps:", index, " restored version ", ckpt->version, " from ", ShardCheckpointDir(ckpt_dir, index));
    } else if (absl::IsNotFound(ckpt.status())) {
      Log("ps:", index, " no checkpoint in ", ShardCheckpointDir(ckpt_dir, index), "; starting fresh");
    } else {
      Log("error: ", ckpt.status().message());
      return 2;
    }
  }
  int64_t saved_version = (*shard)->version();
  absl::Time saved_at = absl::Now();
  auto save_checkpoint = [&](const char* why, std::optional<ShardCheckpoint> snapshot = {}) {
    if (ckpt_dir.empty()) return;
    ShardCheckpoint state = snapshot.has_value() ? std::move(*snapshot) : (*shard)->Checkpoint();
    absl::Time t0 = absl::Now();
    if (absl::Status s = WriteShardCheckpoint(ckpt_dir, state); !s.ok()) {
      Log("warning: checkpoint of ps:", index, " at version ", state.version, " failed: ", s.message());
      return;
    }
    checkpoints_written.Increment();
    saved_version = state.version;
    saved_at = absl::Now();
    Log("ps:", index, " checkpoint at version ", state.version, " (", why, ", ",
        absl::FormatDuration(absl::Now() - t0), ")");
  };

  std::unique_ptr<MetricsServer> metrics;
  if (!flags.metrics_address.empty()) {
    auto m = MetricsServer::Start(flags.metrics_address, registry);
    if (!m.ok()) {
      Log("error: ", m.status().message());
      return 2;
    }
    metrics = std::move(*m);
  }

  PsServiceOptions service_options;
  service_options.model_fingerprint = config->placement.Fingerprint();
  service_options.max_chunk_bytes = job.training.chunk_bytes;
  PsService service(shard->get(), &clock, service_options,
                    PsServiceMetrics{&pull_seconds, &push_seconds, &bytes_pulled, &bytes_pushed});
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  std::string listen = absl::StrCat(flags.bind_host, ":", *port);
  int bound_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &bound_port);
  // Both ends agree on the chunk size; leave headroom for the message framing.
  builder.SetMaxReceiveMessageSize(static_cast<int>(job.training.chunk_bytes + (64 << 10)));
  builder.SetMaxSendMessageSize(static_cast<int>(job.training.chunk_bytes + (64 << 10)));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    Log("error: cannot listen on ", listen, " (port in use?)");
    return 1;
  }
  Log("ps:", index, " serving ", job.name, " on ", listen, ", metrics on ",
      metrics ? absl::StrCat(metrics->port()) : std::string("(off)"), "; mode ",
      TrainingModeName(job.training.mode), ", ", config->num_workers, " workers, aggregate ",
      options.replicas_to_aggregate, ", target ", config->target_steps, " steps");
  Log("placement (fingerprint ", config->placement.Fingerprint(), "):\n",
      config->placement.Describe());

  // Expire held pulls and wait for the end: the chief's Shutdown, then every
  // worker's Leave (bounded by the grace period, for workers that died).
  absl::Time shutdown_at = absl::InfiniteFuture();
  while (true) {
    // Sleeps 50 ms unless a checkpoint boundary is crossed sooner: then it is
    // written at once, so a restart loses at most about everySteps steps.
    auto snapshot = (*shard)->TakePendingCheckpoint(absl::Milliseconds(50));
    (*shard)->Tick(clock.Now());
    if (snapshot) {
      save_checkpoint("every checkpoint.everySteps", std::move(snapshot));
    } else if (job.training.checkpoint_every_seconds > 0 && (*shard)->version() != saved_version &&
               absl::Now() - saved_at >= absl::Seconds(job.training.checkpoint_every_seconds)) {
      save_checkpoint("every checkpoint.everySeconds");
    }
    if ((*shard)->shutdown_requested()) {
      if (shutdown_at == absl::InfiniteFuture()) shutdown_at = clock.Now();
      if ((*shard)->all_workers_left()) break;
      if (clock.Now() - shutdown_at > absl::Seconds(flags.shutdown_grace_seconds)) {
        Log("ps:", index, " not every worker left within ", flags.shutdown_grace_seconds,
            " s of the chief's shutdown; exiting anyway");
        break;
      }
    }
  }
  if ((*shard)->version() != saved_version) save_checkpoint("final");
  auto stats = (*shard)->stats();
  Log("ps:", index, " done at version ", stats.version, ": ", stats.gradients_applied,
      " gradients applied, ", stats.stale_gradients_dropped, " stale dropped, ",
      stats.pushes_rejected, " rejected");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace
}  // namespace kubetrain

int main(int argc, char** argv) {
  kubetrain::PsFlags flags;
  if (const char* tf = std::getenv("TF_CONFIG")) flags.tf_config = tf;
  kubetrain::FlagParser parser("kubetrain-ps --config=trainingjob.yaml  (TF_CONFIG in the environment)");
  parser.String("config", &flags.config, "TrainingJob YAML file");
  parser.String("tf_config", &flags.tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser.String("bind_host", &flags.bind_host, "address to listen on; the port comes from TF_CONFIG");
  parser.String("metrics_address", &flags.metrics_address, "host:port for /metrics; empty = off");
  parser.Int("shutdown_grace_seconds", &flags.shutdown_grace_seconds,
             "after the chief's shutdown, how long to wait for workers to leave");
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
