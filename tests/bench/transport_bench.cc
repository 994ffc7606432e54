// Transport benchmark: how close does a PS push+pull get to a raw TCP stream?
//
//   (a) raw TCP over 127.0.0.1: a sender thread writes --tcp_mib MiB in 1 MiB
//       writes, a receiver thread reads them into a buffer (TcpRound in
//       bench_util.h, shared with step_bench; --tcp_only runs (a) alone, for
//       tests/bench/scaling);
//   (b) a real kubetrain-ps child process (async, sgd, one unsplit ~64 MiB
//       MLP) and a PsClient over gRPC: Push(full gradient) then Pull(full
//       model); bytes per round = 2 x model bytes;
//   (c) the same through a second kubetrain-ps that checks tokens and speaks
//       mutual TLS (core/job_credentials.h), the client as worker 0 with its
//       token and the job's certificate.
// (b) and (c) then time --rounds of the worker's fused step, PushPull (the
// gradient out and the model back in one call): fused_gbps, tls_fused_gbps.
// Each is repeated --rounds times; the figures are min/median/max GB/s
// (1e9 bytes/s). The last line is key=value pairs. Never fails on a time.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/flags.h"
#include "core/job_credentials.h"
#include "core/task_config.h"
#include "tests/bench/aes_gcm_speed.h"
#include "tests/bench/bench_util.h"
#include "worker/bulk_shard_channel.h"
#include "worker/grpc_shard_channel.h"
#include "worker/ps_client.h"

namespace kubetrain {
namespace bench {
namespace {

struct Flags {
  std::string ps_binary = DefaultPsBinary();
  int64_t rounds = 5;
  int64_t tcp_mib = 1024;
  int64_t tcp_write_kib = 1024;
  int64_t tcp_bytes = 0;  // > 0: overrides tcp_mib
  bool tcp_only = false;
  int64_t hidden_units = 20000;  // 784*h + h + 10*h + 10 floats: 20000 -> 60.7 MiB
  int64_t chunk_bytes = 4 << 20;
  bool keep_temp = false;
  bool bulk = true;  // (d), (e): two more PS tasks with the bulk data plane, plain and TLS
};

std::string JobYaml(const Flags& f) {
  return absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: bench-transport
spec:
  replicaSpecs:
    PS: {replicas: 1}
    Worker: {replicas: 1}
  training:
    mode: async
    model:
      type: mlp
      hiddenUnits: [)",
                      f.hidden_units, R"(]
    optimizer:
      type: sgd
      learningRate: 1e-9
    batchSize: 1
    steps: 1000000
    placement:
      splitThresholdBytes: 1073741824
    transport:
      chunkBytes: )",
                      f.chunk_bytes, R"(
    startupTimeoutSeconds: 30
)");
}

struct PsFigures {
  std::vector<double> push_gbps, pull_gbps, both_gbps, fused_gbps;
  // Per push+pull round: CPU seconds of this process and the PS over the
  // round's wall time (cores kept busy).
  std::vector<double> busy_cores;
  int exit_code = 0;
};

// (b)/(c): --rounds of Push(full gradient) then Pull(full model) through the
// PS at `port` as worker 0 with `caller`'s credentials, after an untimed
// warm-up pull; then Leave and Shutdown (as the chief does) and the PS's exit.
absl::StatusOr<PsFigures> MeasurePs(const Flags& f, const TaskConfig& config, int port,
                                    const CallerCredentials& caller, PsProcess* ps,
                                    const char* label, bool bulk = false) {
  const int rounds = static_cast<int>(std::max<int64_t>(1, f.rounds));
  const Model& model = *config.model;
  int64_t model_bytes = 0;
  for (const auto& v : model.variables()) model_bytes += v.num_bytes();
  RealClock clock;
  std::vector<std::unique_ptr<ShardChannel>> channels;
  const std::string address = absl::StrCat("127.0.0.1:", port);
  channels.push_back(bulk ? NewPsChannel(address, f.chunk_bytes, caller)
                          : NewGrpcShardChannel(address, f.chunk_bytes, caller));
  PsClient::Options options;
  options.task_index = 0;
  options.fingerprint = config.fingerprint;
  options.chunk_bytes = f.chunk_bytes;
  options.retry_timeout = absl::Seconds(30);
  PsClient client(options, &config.placement, &clock, std::move(channels), PsClientMetrics{});
  if (auto s = client.Connect(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(label, ": connect: ", s.message()));
  }
  Params params;
  Params grads;
  for (const auto& v : model.variables()) grads.emplace_back(v.num_elements(), 1e-3f);
  auto first = client.Pull(false, 0, model.variables(), &params);  // warm-up, not timed
  if (!first.ok()) {
    return absl::Status(first.status().code(),
                        absl::StrCat(label, ": pull: ", first.status().message()));
  }
  PsFigures out;
  auto cpu_seconds = [ps] { return ProcessCpuSeconds() + ProcessCpuSeconds(ps->pid()); };
  for (int r = 0; r < rounds; ++r) {
    const double c0 = cpu_seconds();
    const double t0 = NowSeconds();
    auto pushed = client.Push(grads, r + 1);
    const double t1 = NowSeconds();
    if (!pushed.ok()) {
      return absl::Status(pushed.status().code(),
                          absl::StrCat(label, ": push: ", pushed.status().message()));
    }
    auto pulled = client.Pull(false, r + 1, model.variables(), &params);
    const double t2 = NowSeconds();
    if (!pulled.ok()) {
      return absl::Status(pulled.status().code(),
                          absl::StrCat(label, ": pull: ", pulled.status().message()));
    }
    out.push_gbps.push_back(model_bytes / (t1 - t0) / 1e9);
    out.pull_gbps.push_back(model_bytes / (t2 - t1) / 1e9);
    out.both_gbps.push_back(2.0 * model_bytes / (t2 - t0) / 1e9);
    out.busy_cores.push_back((cpu_seconds() - c0) / (t2 - t0));
    std::printf(
        "  %s round %d: push %.1f ms (%.2f GB/s), pull %.1f ms (%.2f GB/s), "
        "push+pull %.2f GB/s; version %lld\n",
        label, r + 1, (t1 - t0) * 1e3, out.push_gbps.back(), (t2 - t1) * 1e3, out.pull_gbps.back(),
        out.both_gbps.back(), static_cast<long long>(pulled->version));
    std::fflush(stdout);
  }
  const TableIds no_tables(config.placement.tables.size());
  for (int r = 0; r < rounds; ++r) {
    const double t0 = NowSeconds();
    auto step =
        client.PushPull(grads, rounds + r + 1, no_tables, false, model.variables(), &params);
    const double t1 = NowSeconds();
    if (!step.ok()) {
      return absl::Status(step.status().code(),
                          absl::StrCat(label, ": push-pull: ", step.status().message()));
    }
    out.fused_gbps.push_back(2.0 * model_bytes / (t1 - t0) / 1e9);
    std::printf("  %s fused round %d: push-pull %.1f ms (%.2f GB/s); version %lld\n", label, r + 1,
                (t1 - t0) * 1e3, out.fused_gbps.back(), static_cast<long long>(step->pull.version));
    std::fflush(stdout);
  }
  absl::Status left = client.Leave();
  auto stats = client.Shutdown();
  out.exit_code = ps->WaitOrKill(10);
  if (!left.ok()) {
    std::fprintf(stderr, "warning: %s: leave: %s\n", label, std::string(left.message()).c_str());
  }
  if (!stats.ok()) {
    std::fprintf(stderr, "warning: %s: shutdown: %s\n", label,
                 std::string(stats.status().message()).c_str());
  }
  if (out.exit_code != 0) {
    std::fprintf(stderr, "warning: %s kubetrain-ps %s; its log:\n%s\n", label,
                 out.exit_code < 0 ? "did not exit within 10 s and was killed"
                                   : absl::StrCat("exited with ", out.exit_code).c_str(),
                 ReadFileOrEmpty(ps->log_path()).c_str());
  }
  return out;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return 1;
}

uint64_t TcpBytes(const Flags& f) {
  return f.tcp_bytes > 0 ? static_cast<uint64_t>(f.tcp_bytes)
                         : static_cast<uint64_t>(f.tcp_mib) << 20;
}

// (a): --rounds raw TCP transfers of TcpBytes(f), each printed; GB/s of each.
absl::StatusOr<std::vector<double>> MeasureTcp(const Flags& f) {
  const uint64_t tcp_bytes = TcpBytes(f);
  const size_t write_size = static_cast<size_t>(f.tcp_write_kib) << 10;
  auto bound =
      MeasureTcpBound(tcp_bytes, static_cast<int>(std::max<int64_t>(1, f.rounds)), write_size);
  if (!bound.ok()) return bound.status();
  const std::vector<double> seconds = bound->Seconds();
  for (size_t r = 0; r < seconds.size(); ++r) {
    std::printf("  tcp round %zu: %.3f MiB in %.6f s = %.2f GB/s\n", r + 1, tcp_bytes / 1048576.0,
                seconds[r], bound->gbps[r]);
  }
  std::fflush(stdout);
  return bound->gbps;
}

// --tcp_only: (a) alone, no PS. Last line: tcp_gbps=… tcp_min=… tcp_max=…
// tcp_bytes=… tcp_ms=… (the median round's time) rounds=N.
int RunTcpOnly(const Flags& f) {
  const uint64_t tcp_bytes = TcpBytes(f);
  std::printf("raw tcp over 127.0.0.1: %d rounds of %llu bytes in %lld KiB writes\n",
              static_cast<int>(std::max<int64_t>(1, f.rounds)),
              static_cast<unsigned long long>(tcp_bytes), static_cast<long long>(f.tcp_write_kib));
  std::fflush(stdout);
  auto gbps = MeasureTcp(f);
  if (!gbps.ok()) return Fail(gbps.status());
  Summary tcp = Summarize(*gbps);
  std::printf("tcp_gbps=%.3f tcp_min=%.3f tcp_max=%.3f tcp_bytes=%llu tcp_ms=%.4f rounds=%zu\n",
              tcp.median, tcp.min, tcp.max, static_cast<unsigned long long>(tcp_bytes),
              tcp.median > 0 ? tcp_bytes / (tcp.median * 1e9) * 1e3 : 0.0, gbps->size());
  std::fflush(stdout);
  return 0;
}

int Run(const Flags& f) {
  if (f.tcp_only) return RunTcpOnly(f);
  const int rounds = static_cast<int>(std::max<int64_t>(1, f.rounds));

  // Start both PS tasks first: fork before any thread (gRPC, the TCP threads) exists.
  auto dir = MakeTempDir("kubetrain-bench-transport-");
  if (!dir.ok()) return Fail(dir.status());
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      if (!keep) RemoveTree(dir);
    }
  } cleanup{*dir, f.keep_temp};
  auto ps_port = FreeLoopbackPort();
  auto tls_port = FreeLoopbackPort();
  auto bulk_port = FreeLoopbackPort();
  auto bulk_tls_port = FreeLoopbackPort();
  auto worker_port = FreeLoopbackPort();
  if (!ps_port.ok() || !tls_port.ok() || !bulk_port.ok() || !bulk_tls_port.ok() ||
      !worker_port.ok() ||
      absl::flat_hash_set<int>{*ps_port, *tls_port, *bulk_port, *bulk_tls_port}.size() != 4) {
    return Fail(absl::UnavailableError("no free loopback port"));
  }
  const std::string job_file = *dir + "/job.yaml";
  if (auto s = WriteFile(job_file, JobYaml(f)); !s.ok()) return Fail(s);
  auto config = LoadTaskConfig(job_file, TfConfigJson(*ps_port, *worker_port, "worker"));
  if (!config.ok()) return Fail(config.status());
  // (c)'s PS: the job's key and TLS files; its client: worker 0's.
  auto job_credentials = GenerateJobCredentials(config->job.name, /*with_tls=*/true);
  if (!job_credentials.ok()) return Fail(job_credentials.status());
  const std::string ps_auth = *dir + "/auth-ps";
  const std::string worker_auth = *dir + "/auth-worker";
  if (auto s = WriteTaskCredentials(ps_auth, CredentialsForTask(*job_credentials, "ps", 0));
      !s.ok()) {
    return Fail(s);
  }
  if (auto s = WriteTaskCredentials(worker_auth, CredentialsForTask(*job_credentials, "worker", 0));
      !s.ok()) {
    return Fail(s);
  }
  auto worker_credentials = ReadCallerCredentials(worker_auth, "worker", 0);
  if (!worker_credentials.ok()) return Fail(worker_credentials.status());
  PsProcess ps, tls_ps, bulk_ps, bulk_tls_ps;
  if (auto s = ps.Start(f.ps_binary, job_file, TfConfigJson(*ps_port, *worker_port, "ps"),
                        *dir + "/ps.log", {"--insecure"});
      !s.ok()) {
    return Fail(s);
  }
  if (auto s = tls_ps.Start(f.ps_binary, job_file, TfConfigJson(*tls_port, *worker_port, "ps"),
                            *dir + "/ps-tls.log", {"--auth_dir=" + ps_auth});
      !s.ok()) {
    return Fail(s);
  }

  if (f.bulk) {
    if (auto s = bulk_ps.Start(f.ps_binary, job_file, TfConfigJson(*bulk_port, *worker_port, "ps"),
                               *dir + "/ps-bulk.log", {"--insecure", "--bulk_port=0"});
        !s.ok()) {
      return Fail(s);
    }
    if (auto s = bulk_tls_ps.Start(
            f.ps_binary, job_file, TfConfigJson(*bulk_tls_port, *worker_port, "ps"),
            *dir + "/ps-bulk-tls.log", {"--auth_dir=" + ps_auth, "--bulk_port=0"});
        !s.ok()) {
      return Fail(s);
    }
  }

  // Let the PS tasks initialise their shards first, so that they idle during (a).
  for (auto [p, port] : {std::pair{&ps, *ps_port}, std::pair{&tls_ps, *tls_port}}) {
    if (auto s = p->WaitReady(port, 60); !s.ok()) return Fail(s);
  }
  if (f.bulk) {
    if (auto s = bulk_ps.WaitReady(*bulk_port, 60); !s.ok()) return Fail(s);
    if (auto s = bulk_tls_ps.WaitReady(*bulk_tls_port, 60); !s.ok()) return Fail(s);
  }

  // (a) raw TCP.
  std::printf("transport benchmark: %d rounds; kubetrain-ps %s\n", rounds, f.ps_binary.c_str());
  std::fflush(stdout);
  auto tcp_gbps = MeasureTcp(f);
  if (!tcp_gbps.ok()) return Fail(tcp_gbps.status());

  // (b) push + pull through the plain PS, (c) through the TLS one.
  auto plain = MeasurePs(f, *config, *ps_port, CallerCredentials(), &ps, "ps");
  if (!plain.ok()) return Fail(plain.status());
  auto tls = MeasurePs(f, *config, *tls_port, *worker_credentials, &tls_ps, "tls ps");
  if (!tls.ok()) return Fail(tls.status());
  // (d) through a plain PS's bulk data plane, (e) through a TLS one's (--bulk).
  PsFigures bulk, bulk_tls;
  if (f.bulk) {
    auto measured =
        MeasurePs(f, *config, *bulk_port, CallerCredentials(), &bulk_ps, "bulk ps", true);
    if (!measured.ok()) return Fail(measured.status());
    bulk = *std::move(measured);
    measured = MeasurePs(f, *config, *bulk_tls_port, *worker_credentials, &bulk_tls_ps,
                         "bulk tls ps", true);
    if (!measured.ok()) return Fail(measured.status());
    bulk_tls = *std::move(measured);
  }

  int64_t model_bytes = 0;
  for (const auto& v : config->model->variables()) model_bytes += v.num_bytes();
  Summary tcp = Summarize(*tcp_gbps), psum = Summarize(plain->both_gbps),
          push = Summarize(plain->push_gbps), pull = Summarize(plain->pull_gbps),
          tsum = Summarize(tls->both_gbps), tpush = Summarize(tls->push_gbps),
          tpull = Summarize(tls->pull_gbps), fused = Summarize(plain->fused_gbps),
          tfused = Summarize(tls->fused_gbps);
  const double model_mib = model_bytes / 1048576.0;
  std::printf(
      "model: mlp 784-%lld-10, %lld bytes (%.1f MiB) in %zu unsplit parts on 1 PS; chunk %lld "
      "bytes; "
      "tcp %lld MiB per round in %lld KiB writes\n",
      static_cast<long long>(f.hidden_units), static_cast<long long>(model_bytes), model_mib,
      config->placement.parts.size(), static_cast<long long>(f.chunk_bytes),
      static_cast<long long>(TcpBytes(f) >> 20), static_cast<long long>(f.tcp_write_kib));
  std::printf("raw tcp           GB/s: min %.2f  median %.2f  max %.2f\n", tcp.min, tcp.median,
              tcp.max);
  std::printf("ps push           GB/s: min %.2f  median %.2f  max %.2f\n", push.min, push.median,
              push.max);
  std::printf("ps pull           GB/s: min %.2f  median %.2f  max %.2f\n", pull.min, pull.median,
              pull.max);
  std::printf("ps push+pull      GB/s: min %.2f  median %.2f  max %.2f  (%.1f MB per round)\n",
              psum.min, psum.median, psum.max, 2.0 * model_bytes / 1e6);
  std::printf("tls ps push       GB/s: min %.2f  median %.2f  max %.2f\n", tpush.min, tpush.median,
              tpush.max);
  std::printf("tls ps pull       GB/s: min %.2f  median %.2f  max %.2f\n", tpull.min, tpull.median,
              tpull.max);
  std::printf("tls ps push+pull  GB/s: min %.2f  median %.2f  max %.2f  (tokens + mutual TLS)\n",
              tsum.min, tsum.median, tsum.max);
  std::printf("ps push-pull       GB/s: min %.2f  median %.2f  max %.2f  (one fused call)\n",
              fused.min, fused.median, fused.max);
  std::printf("tls ps push-pull  GB/s: min %.2f  median %.2f  max %.2f\n", tfused.min,
              tfused.median, tfused.max);
  Summary bsum{}, bfused{}, btsum{}, btfused{};
  if (f.bulk) {
    bsum = Summarize(bulk.both_gbps);
    bfused = Summarize(bulk.fused_gbps);
    btsum = Summarize(bulk_tls.both_gbps);
    btfused = Summarize(bulk_tls.fused_gbps);
    std::printf("bulk push+pull    GB/s: min %.2f  median %.2f  max %.2f  (bulk data plane)\n",
                bsum.min, bsum.median, bsum.max);
    std::printf("bulk push-pull    GB/s: min %.2f  median %.2f  max %.2f\n", bfused.min,
                bfused.median, bfused.max);
    std::printf("bulk tls push+pull GB/s: min %.2f  median %.2f  max %.2f  (tokens + mutual TLS)\n",
                btsum.min, btsum.median, btsum.max);
    std::printf("bulk tls push-pull GB/s: min %.2f  median %.2f  max %.2f\n", btfused.min,
                btfused.median, btfused.max);
  }
  // What TLS cannot avoid: sealing and opening every byte (proto/bulk_tls.cc
  // negotiates AES-128-GCM first). The ceiling of bulk_tls_ratio on this
  // machine if TLS cost nothing else (aes_gcm_speed.h).
  AesGcmSpeed aes;
  double busy = 0, tls_bound = 0;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (f.bulk) {
    auto measured = MeasureAesGcm(int64_t{64} << 20);
    if (!measured.ok()) return Fail(measured.status());
    aes = *measured;
    busy = Summarize(bulk.busy_cores).median;
    tls_bound = TlsCryptoBoundRatio(bsum.median, busy, aes, cores);
    std::printf(
        "aes-128-gcm, one core, 16 KiB records: seal %.2f GB/s, open %.2f GB/s; plain bulk "
        "push+pull keeps %.2f of %d cores busy; so TLS's crypto alone bounds bulk_tls_ratio at "
        "%.3f here (measured %.3f)\n",
        aes.seal_gbps, aes.open_gbps, busy, cores, tls_bound,
        bsum.median > 0 ? btsum.median / bsum.median : 0.0);
  }
  std::printf("ps exit codes: plain %d, tls %d, bulk %d, bulk tls %d\n", plain->exit_code,
              tls->exit_code, bulk.exit_code, bulk_tls.exit_code);
  std::printf(
      "tcp_gbps=%.2f ps_gbps=%.2f ratio=%.3f tcp_min=%.2f tcp_max=%.2f ps_min=%.2f "
      "ps_max=%.2f tls_gbps=%.2f tls_ratio=%.3f tls_min=%.2f tls_max=%.2f model_mib=%.1f "
      "rounds=%d fused_gbps=%.2f fused_ratio=%.3f tls_fused_gbps=%.2f bulk_gbps=%.2f "
      "bulk_ratio=%.3f bulk_fused_gbps=%.2f bulk_fused_ratio=%.3f bulk_tls_gbps=%.2f "
      "bulk_tls_ratio=%.3f bulk_tls_fused_gbps=%.2f aes_seal_gbps=%.2f aes_open_gbps=%.2f "
      "bulk_busy_cores=%.2f bulk_tls_bound=%.3f\n",
      tcp.median, psum.median, tcp.median > 0 ? psum.median / tcp.median : 0.0, tcp.min, tcp.max,
      psum.min, psum.max, tsum.median, psum.median > 0 ? tsum.median / psum.median : 0.0, tsum.min,
      tsum.max, model_mib, rounds, fused.median, tcp.median > 0 ? fused.median / tcp.median : 0.0,
      tfused.median, bsum.median, tcp.median > 0 ? bsum.median / tcp.median : 0.0, bfused.median,
      tcp.median > 0 ? bfused.median / tcp.median : 0.0, btsum.median,
      bsum.median > 0 ? btsum.median / bsum.median : 0.0, btfused.median, aes.seal_gbps,
      aes.open_gbps, busy, tls_bound);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kubetrain

int main(int argc, char** argv) {
  kubetrain::bench::Flags flags;
  kubetrain::FlagParser parser(
      "transport_bench [--ps_binary=bin/kubetrain-ps] [--rounds=5]: raw TCP vs PS push+pull, "
      "plain and over TLS");
  parser.String("ps_binary", &flags.ps_binary, "the kubetrain-ps binary to start");
  parser.Int("rounds", &flags.rounds, "repetitions of each measurement");
  parser.Int("tcp_mib", &flags.tcp_mib, "MiB sent per raw TCP round");
  parser.Int("tcp_bytes", &flags.tcp_bytes,
             "bytes sent per raw TCP round (> 0: instead of tcp_mib)");
  parser.Bool(
      "tcp_only", &flags.tcp_only,
      "measure raw TCP only (no PS); last line tcp_gbps=... tcp_ms=... (tests/bench/scaling)");
  parser.Int("tcp_write_kib", &flags.tcp_write_kib, "size of each raw TCP write/read, KiB");
  parser.Int("hidden_units", &flags.hidden_units,
             "hidden layer width of the MLP (sets the model size)");
  parser.Int("chunk_bytes", &flags.chunk_bytes, "transport.chunkBytes of the job");
  parser.Bool("keep_temp", &flags.keep_temp, "keep the temp dir (job file, PS log)");
  parser.Bool("bulk", &flags.bulk,
              "also measure a PS's bulk data plane (--bulk_port); off for a kubetrain-ps "
              "built before it (--against)");
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  kubetrain::InitProcess(kubetrain::ProcessProfile::kDefault);
  return kubetrain::bench::Run(flags);
}
