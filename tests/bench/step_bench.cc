// Step-time benchmark: a sync training step through a real PS versus the same
// step in one process with no RPC.
//
//   local:       batch -> Model::LossAndGradients -> Optimizer::Apply on every
//                variable (what one PS + one worker compute, minus transport);
//   distributed: a real kubetrain-ps child (sync, 1 PS, 1 worker) and a
//                PsClient over gRPC, the worker's loop: a first Pull, then
//                per step batch -> LossAndGradients -> PushPull(grad, v: the
//                push, then the pull held until version v + 1), one RPC.
//                pull_ms is 0 (no pull of its own) and push_ms the PushPull.
//                With --overlap_layers, the PushPull is started before the
//                step computes and sends each variable's gradient as backprop
//                finishes it (PsClient::StartPushPull): compute_ms is then the
//                step's computation with the push going out, push_ms the wait
//                for the rest of the round trip after it.
// Same model (mlp 784-256-128-10, or with --model_mib=N an mlp 784-h-h-10
// whose h makes the dense parameters ~N MiB), optimizer (adam), batch (128),
// real Fashion-MNIST, same initial values. Medians over --steps steps after
// --warmup steps. A tiny gRPC round trip (ShardChannel::GetInfo) measured in
// the same run shows the fixed cost of one RPC, and raw TCP over loopback
// moving the bytes of one step (push + pull = 2 x model bytes; TcpRound,
// shared with transport_bench) the bound any transport has for them. The
// last line is key=value pairs. Never fails on a time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/flags.h"
#include "core/task_config.h"
#include "ps/optimizer.h"
#include "tests/bench/bench_util.h"
#include "worker/bulk_shard_channel.h"
#include "worker/grpc_shard_channel.h"
#include "worker/ps_client.h"

namespace kubetrain {
namespace bench {
namespace {

struct Flags {
  std::string ps_binary = DefaultPsBinary();
  std::string dataset = "/usr/share/datasets/fashion-mnist";
  int64_t steps = -1;       // 300; with --model_mib, fewer (StepsFor)
  int64_t warmup = -1;      // 20; with --model_mib, fewer (WarmupFor)
  int64_t model_mib = 0;    // 0: the default mlp 784-256-128-10
  int64_t tcp_rounds = -1;  // TcpRoundsFor
  int64_t batch = 128;
  int64_t rtt_calls = 200;
  int64_t ps = 1;
  bool keep_temp = false;
  bool overlap_layers = false;
  bool bulk = true;  // the PS tasks' bulk data plane, as `kubetrain run` uses it
};

// Floats of an mlp 784-h-h-10: 784h + h + h*h + h + 10h + 10.
int64_t MlpFloats(int64_t h) { return h * h + 796 * h + 10; }

// The hidden width h of an mlp 784-h-h-10 whose parameters are closest to
// `mib` MiB of float32 (two equal hidden layers: the largest a single
// `hiddenUnits` entry may be, 65536, is 199 MiB in one layer).
int64_t HiddenForMib(int64_t mib) {
  const double floats = mib * 1048576.0 / 4;
  int64_t h = static_cast<int64_t>(std::llround((-796 + std::sqrt(796.0 * 796 + 4 * floats)) / 2));
  h = std::max<int64_t>(1, h);
  // The nearest of h and its neighbours (the root is rounded).
  for (int64_t c : {h - 1, h + 1}) {
    if (c >= 1 && std::llabs(MlpFloats(c) * 4 - mib * 1048576) <
                      std::llabs(MlpFloats(h) * 4 - mib * 1048576)) {
      h = c;
    }
  }
  return h;
}

std::vector<int64_t> HiddenUnits(const Flags& f) {
  if (f.model_mib <= 0) return {256, 128};
  const int64_t h = HiddenForMib(f.model_mib);
  return {h, h};
}

// Unless given: 300 timed steps and 20 warm-up ones; with --model_mib=N
// (compute and traffic grow with N) 300 / N timed steps, at least 10, and 2
// warm-up ones.
int64_t StepsFor(const Flags& f) {
  if (f.steps >= 0) return f.steps;
  return f.model_mib > 0 ? std::max<int64_t>(10, 300 / f.model_mib) : 300;
}
int64_t WarmupFor(const Flags& f) {
  if (f.warmup >= 0) return f.warmup;
  return f.model_mib > 0 ? 2 : 20;
}

// Unless given: enough rounds to move 256 MiB in all (a small transfer is
// noisy: one late wake-up of the receiver doubles it), at least 10, at most
// 200.
int TcpRoundsFor(const Flags& f, uint64_t bytes) {
  if (f.tcp_rounds > 0) return static_cast<int>(f.tcp_rounds);
  const uint64_t rounds = (uint64_t{256} << 20) / std::max<uint64_t>(1, bytes);
  return static_cast<int>(std::clamp<uint64_t>(rounds, 10, 200));
}

std::string JobYaml(const Flags& f) {
  const std::vector<int64_t> hidden = HiddenUnits(f);
  return absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: bench-step
spec:
  replicaSpecs:
    PS: {replicas: )",
                      f.ps, R"(}
    Worker: {replicas: 1}
  training:
    mode: sync
    model:
      type: mlp
      hiddenUnits: [)",
                      absl::StrJoin(hidden, ", "), R"(]
    dataset:
      name: fashion-mnist
      path: )",
                      f.dataset, R"(
    optimizer:
      type: adam
      learningRate: 0.001
    batchSize: )",
                      f.batch, R"(
    steps: 1000000
    seed: 7
    startupTimeoutSeconds: 30
)");
}

double Ms(double seconds) { return seconds * 1e3; }

void PrintRow(const char* name, const std::vector<double>& seconds) {
  Summary s = Summarize(seconds);
  std::printf("  %-26s min %7.3f  median %7.3f  max %7.3f ms\n", name, Ms(s.min), Ms(s.median),
              Ms(s.max));
}

double MeanTail(const std::vector<float>& v, size_t n) {
  if (v.empty()) return 0;
  n = std::min(n, v.size());
  return std::accumulate(v.end() - n, v.end(), 0.0) / n;
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "error: %s%s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

int Run(const Flags& f) {
  const int steps = static_cast<int>(std::max<int64_t>(1, StepsFor(f)));
  const int warmup = static_cast<int>(std::max<int64_t>(0, WarmupFor(f)));
  const int total = warmup + steps;

  auto dir = MakeTempDir("kubetrain-bench-step-");
  if (!dir.ok()) return Fail("", dir.status());
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      if (!keep) RemoveTree(dir);
    }
  } cleanup{*dir, f.keep_temp};
  const int num_ps = static_cast<int>(std::max<int64_t>(1, f.ps));
  std::vector<int> ps_ports;
  for (int i = 0; i < num_ps; ++i) {
    auto port = FreeLoopbackPort();
    if (!port.ok()) return Fail("", port.status());
    ps_ports.push_back(*port);
  }
  auto worker_port = FreeLoopbackPort();
  if (!worker_port.ok()) return Fail("", worker_port.status());
  const std::string job_file = *dir + "/job.yaml";
  if (auto s = WriteFile(job_file, JobYaml(f)); !s.ok()) return Fail("", s);
  auto config = LoadTaskConfig(job_file, TfConfigJson(ps_ports, *worker_port, "worker", 0));
  if (!config.ok()) return Fail("", config.status());
  const TrainingSpec& spec = config->job.training;
  const Model& model = *config->model;
  const int batch = spec.batch_size;

  // Fork the PS tasks before any thread exists; they initialise while we load data.
  std::vector<PsProcess> ps(num_ps);
  for (int i = 0; i < num_ps; ++i) {
    if (auto s = ps[i].Start(f.ps_binary, job_file, TfConfigJson(ps_ports, *worker_port, "ps", i),
                             absl::StrCat(*dir, "/ps-", i, ".log"),
                             f.bulk ? std::vector<std::string>{"--insecure", "--bulk_port=0"}
                                    : std::vector<std::string>{"--insecure"});
        !s.ok()) {
      return Fail("", s);
    }
  }
  auto train = LoadFashionMnist(spec.dataset_path, true);
  if (!train.ok()) return Fail("", train.status());
  int64_t model_bytes = 0;
  for (const auto& v : model.variables()) model_bytes += v.num_bytes();
  const std::string shape = absl::StrCat("784-", absl::StrJoin(HiddenUnits(f), "-"), "-10");
  std::printf(
      "step benchmark: mlp %s (%lld bytes = %.3f MiB), adam, batch %d, sync, %d PS + 1 "
      "worker; %d steps after %d warm-up%s\n",
      shape.c_str(), static_cast<long long>(model_bytes), model_bytes / 1048576.0, batch, num_ps,
      steps, warmup, f.overlap_layers ? "; push-pull overlapped by layer" : "");
  std::fflush(stdout);

  // Local: one process, no RPC.
  std::vector<double> local_step, local_compute, local_apply;
  std::vector<float> local_loss;
  {
    ShardedBatcher batcher(*train, 0, 1, spec.seed);
    Params params = model.InitialParams(spec.seed);
    Params grads;
    std::vector<int64_t> sizes;
    for (const auto& v : model.variables()) sizes.push_back(v.num_elements());
    auto opt = CreateOptimizer(spec.optimizer, sizes);
    if (!opt.ok()) return Fail("optimizer: ", opt.status());
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int i = 0; i < total; ++i) {
      const double t0 = NowSeconds();
      if (auto s = batcher.Next(batch, &x, &y); !s.ok()) return Fail("data: ", s);
      float loss = model.LossAndGradients(params, x.data(), y.data(), batch, &grads);
      const double t2 = NowSeconds();
      for (size_t v = 0; v < params.size(); ++v) {
        (*opt)->Apply(static_cast<int>(v), params[v].data(), grads[v].data(),
                      static_cast<int64_t>(params[v].size()), i + 1);
      }
      const double t3 = NowSeconds();
      local_loss.push_back(loss);
      if (i < warmup) continue;
      local_step.push_back(t3 - t0);
      local_compute.push_back(t2 - t0);
      local_apply.push_back(t3 - t2);
    }
  }

  // Distributed: the worker's sync loop against the real PS.
  for (int i = 0; i < num_ps; ++i) {
    if (auto s = ps[i].WaitReady(ps_ports[i], 60); !s.ok()) return Fail("", s);
  }
  const std::string address = absl::StrCat("127.0.0.1:", ps_ports[0]);
  RealClock clock;
  std::vector<std::unique_ptr<ShardChannel>> channels;
  for (int port : ps_ports) {
    channels.push_back(NewPsChannel(absl::StrCat("127.0.0.1:", port), spec.chunk_bytes));
  }
  PsClient::Options options;
  options.task_index = 0;
  options.fingerprint = config->fingerprint;
  options.chunk_bytes = spec.chunk_bytes;
  options.retry_timeout = absl::Seconds(30);
  PsClient client(options, &config->placement, &clock, std::move(channels), PsClientMetrics{});
  if (auto s = client.Connect(); !s.ok()) return Fail("connect: ", s);
  std::vector<double> dist_step, dist_pull, dist_compute, dist_push, dist_wait;
  std::vector<float> dist_loss;
  {
    ShardedBatcher batcher(*train, 0, 1, spec.seed);
    Params params, grads;
    std::vector<float> x;
    std::vector<int32_t> y;
    const TableIds no_tables(config->placement.tables.size());
    auto first = client.Pull(/*next_version=*/false, 0, model.variables(), &params);
    if (!first.ok()) return Fail("pull: ", first.status());
    const std::vector<int> backprop_order = model.BackpropOrder();
    LayerHooks hooks;
    hooks.gradient_ready = [&client](int v) { client.GradientReady(v); };
    for (int i = 0; i < total; ++i) {
      const double t1 = NowSeconds();
      if (auto s = batcher.Next(batch, &x, &y); !s.ok()) return Fail("data: ", s);
      float loss = 0;
      if (f.overlap_layers) {
        grads.resize(params.size());
        for (size_t v = 0; v < params.size(); ++v) grads[v].resize(params[v].size());
        if (auto s = client.StartPushPull(grads, i + 1, no_tables, /*next_version=*/true,
                                          model.variables(), &params, backprop_order);
            !s.ok()) {
          return Fail("push-pull: ", s);
        }
        Batch b;
        b.x = x.data();
        b.labels = y.data();
        b.size = batch;
        loss = model.LossAndGradients(params, b, 0, &grads, &hooks);
      } else {
        loss = model.LossAndGradients(params, x.data(), y.data(), batch, &grads);
      }
      const double t2 = NowSeconds();
      // The push, then the sync barrier: the pull is held until the version
      // passes the one last pulled.
      auto step = f.overlap_layers ? client.FinishPushPull()
                                   : client.PushPull(grads, i + 1, no_tables, /*next_version=*/true,
                                                     model.variables(), &params);
      if (!step.ok()) return Fail("push-pull: ", step.status());
      const double t3 = NowSeconds();
      if (step->push.dropped) {
        std::fprintf(stderr, "warning: step %d: gradient dropped as stale\n", i);
      }
      dist_loss.push_back(loss);
      if (i < warmup) continue;
      dist_step.push_back(t3 - t1);
      dist_pull.push_back(0);
      dist_compute.push_back(t2 - t1);
      dist_push.push_back(t3 - t2);
      dist_wait.push_back(step->pull.waited_seconds);
    }
  }

  // A tiny RPC on its own channel: GetInfo (a few hundred bytes each way).
  std::vector<double> rtt;
  {
    auto channel = NewGrpcShardChannel(address, spec.chunk_bytes);
    const int calls = static_cast<int>(std::max<int64_t>(1, f.rtt_calls));
    for (int i = 0; i < calls + 10; ++i) {
      const double t0 = NowSeconds();
      auto info = channel->GetInfo(v1::InfoRequest(), absl::Seconds(5));
      const double t1 = NowSeconds();
      if (!info.ok()) return Fail("GetInfo: ", info.status());
      if (i >= 10) rtt.push_back(t1 - t0);
    }
  }

  // Raw TCP over loopback moving one step's bytes (push + pull), the PS idle.
  const uint64_t step_bytes = 2 * static_cast<uint64_t>(model_bytes);
  auto tcp = MeasureTcpBound(step_bytes, TcpRoundsFor(f, step_bytes));
  if (!tcp.ok()) return Fail("raw tcp: ", tcp.status());

  absl::Status left = client.Leave();
  auto stats = client.Shutdown();
  int exit_code = 0;
  for (auto& p : ps) {
    const int code = p.WaitOrKill(10);
    if (code != 0) {
      std::fprintf(stderr,
                   "warning: kubetrain-ps exit code %d (-1: killed after 10 s); its log:\n%s\n",
                   code, ReadFileOrEmpty(p.log_path()).c_str());
      exit_code = code;
    }
  }
  if (!left.ok()) std::fprintf(stderr, "warning: leave: %s\n", std::string(left.message()).c_str());
  if (!stats.ok()) {
    std::fprintf(stderr, "warning: shutdown: %s\n", std::string(stats.status().message()).c_str());
  }

  std::printf("local (one process, no RPC):\n");
  PrintRow("step", local_step);
  PrintRow("batch + loss/gradients", local_compute);
  PrintRow("optimizer apply", local_apply);
  std::printf("distributed (sync, real PS over gRPC):\n");
  PrintRow("step", dist_step);
  PrintRow("batch + loss/gradients", dist_compute);
  PrintRow("push-pull (push, barrier, pull)", dist_push);
  PrintRow("  of which PS hold", dist_wait);
  std::printf("tiny gRPC round trip (GetInfo):\n");
  PrintRow("rtt", rtt);
  std::printf("raw TCP over 127.0.0.1, one step's bytes (push + pull: %llu bytes), %zu rounds:\n",
              static_cast<unsigned long long>(step_bytes), tcp->gbps.size());
  PrintRow("tcp bound", tcp->Seconds());
  std::printf("mean loss over the last 50 steps: local %.4f, distributed %.4f\n",
              MeanTail(local_loss, 50), MeanTail(dist_loss, 50));
  if (stats.ok()) {
    std::printf("ps: version %lld, %lld gradients applied, %lld stale dropped; exit code %d\n",
                static_cast<long long>(stats->version()),
                static_cast<long long>(stats->gradients_applied()),
                static_cast<long long>(stats->stale_gradients_dropped()), exit_code);
  }

  const double local_ms = Ms(Summarize(local_step).median);
  const double dist_ms = Ms(Summarize(dist_step).median);
  const double pull_ms = Ms(Summarize(dist_pull).median);
  const double push_ms = Ms(Summarize(dist_push).median);
  const double tcp_ms = Ms(Summarize(tcp->Seconds()).median);
  const double tcp_gbps = Summarize(tcp->gbps).median;
  std::printf(
      "step vs raw TCP for its %.1f MB: step %.3f ms = %.1fx, pull + push %.3f ms = %.1fx the "
      "%.3f ms raw TCP needs (%.2f GB/s)\n",
      step_bytes / 1e6, dist_ms, tcp_ms > 0 ? dist_ms / tcp_ms : 0.0, pull_ms + push_ms,
      tcp_ms > 0 ? (pull_ms + push_ms) / tcp_ms : 0.0, tcp_ms, tcp_gbps);
  std::printf(
      "local_ms=%.3f distributed_ms=%.3f ratio=%.2f pull_ms=%.3f push_ms=%.3f rtt_us=%.0f "
      "steps=%d compute_ms=%.3f local_compute_ms=%.3f local_apply_ms=%.3f hold_ms=%.3f "
      "model_bytes=%lld ps=%d tcp_ms=%.3f tcp_gbps=%.2f step_vs_tcp=%.2f comm_vs_tcp=%.2f "
      "hidden=%lld overlap_layers=%d\n",
      local_ms, dist_ms, local_ms > 0 ? dist_ms / local_ms : 0.0, pull_ms, push_ms,
      Summarize(rtt).median * 1e6, steps, Ms(Summarize(dist_compute).median),
      Ms(Summarize(local_compute).median), Ms(Summarize(local_apply).median),
      Ms(Summarize(dist_wait).median), static_cast<long long>(model_bytes), num_ps, tcp_ms,
      tcp_gbps, tcp_ms > 0 ? dist_ms / tcp_ms : 0.0,
      tcp_ms > 0 ? (pull_ms + push_ms) / tcp_ms : 0.0,
      static_cast<long long>(HiddenUnits(f).front()), f.overlap_layers ? 1 : 0);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kubetrain

int main(int argc, char** argv) {
  kubetrain::bench::Flags flags;
  kubetrain::FlagParser parser(
      "step_bench [--ps_binary=bin/kubetrain-ps] [--steps=300]: sync step time, PS vs one process");
  parser.String("ps_binary", &flags.ps_binary, "the kubetrain-ps binary to start");
  parser.String("dataset", &flags.dataset, "Fashion-MNIST directory (IDX .gz files)");
  parser.Int("steps", &flags.steps,
             "timed steps of each loop (-1: 300; with --model_mib=N, 300 / N, at least 10)");
  parser.Int("warmup", &flags.warmup, "untimed steps before them (-1: 20; with --model_mib, 2)");
  parser.Int("model_mib", &flags.model_mib,
             "dense model size: an mlp 784-h-h-10 with h chosen for ~N MiB of parameters (0: the "
             "default mlp 784-256-128-10)");
  parser.Int(
      "tcp_rounds", &flags.tcp_rounds,
      "raw TCP transfers of one step's bytes (2 x model bytes) timed for the bound (-1: 256 MiB "
      "in all, 10..200)");
  parser.Int("batch", &flags.batch, "batch size");
  parser.Int("rtt_calls", &flags.rtt_calls, "GetInfo round trips timed");
  parser.Int("ps", &flags.ps,
             "PS tasks (each a kubetrain-ps child; the model is placed over them)");
  parser.Bool("keep_temp", &flags.keep_temp, "keep the temp dir (job file, PS log)");
  parser.Bool("bulk", &flags.bulk,
              "the PS tasks serve the bulk data plane (--bulk_port=0), which the worker uses, as "
              "under `kubetrain run`; --bulk=false: gRPC only (and for a kubetrain-ps built "
              "before it)");
  parser.Bool("overlap_layers", &flags.overlap_layers,
              "overlap the push-pull with backprop: each variable's gradient sent as soon as it "
              "is final, last layer first (PsClient::StartPushPull)");
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  kubetrain::InitProcess(kubetrain::ProcessProfile::kDefault);
  return kubetrain::bench::Run(flags);
}
