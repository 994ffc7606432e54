// Transport benchmark: how close does a PS push+pull get to a raw TCP stream?
//
//   (a) raw TCP over 127.0.0.1: a sender thread writes --tcp_mib MiB in 1 MiB
//       writes, a receiver thread reads them into a buffer;
//   (b) a real kubetrain-ps child process (async, sgd, one unsplit ~64 MiB
//       MLP) and a PsClient over gRPC: Push(full gradient) then Pull(full
//       model); bytes per round = 2 x model bytes.
// Each is repeated --rounds times; the figures are min/median/max GB/s
// (1e9 bytes/s). The last line is key=value pairs. Never fails on a time.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/flags.h"
#include "core/task_config.h"
#include "tests/bench/bench_util.h"
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
  int64_t hidden_units = 20000;  // 784*h + h + 10*h + 10 floats: 20000 -> 60.7 MiB
  int64_t chunk_bytes = 4 << 20;
  bool keep_temp = false;
};

// One raw TCP transfer of `total` bytes in `write_size` writes. Returns seconds
// from the first write to the receiver having read the last byte.
absl::StatusOr<double> TcpRound(uint64_t total, size_t write_size) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(lfd, 1) != 0 || getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    if (lfd >= 0) close(lfd);
    return absl::InternalError(absl::StrCat("listen on 127.0.0.1: ", std::strerror(e)));
  }
  uint64_t received = 0;
  double end_time = 0;
  std::string recv_error;
  std::thread receiver([&] {
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) {
      recv_error = std::strerror(errno);
      return;
    }
    std::vector<char> buf(write_size);
    while (received < total) {
      ssize_t n = read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        recv_error = n == 0 ? "early EOF" : std::strerror(errno);
        break;
      }
      received += static_cast<uint64_t>(n);
    }
    end_time = NowSeconds();
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    shutdown(lfd, SHUT_RDWR);
    close(lfd);
    receiver.join();
    return absl::InternalError(absl::StrCat("connect: ", std::strerror(e)));
  }
  std::vector<char> data(write_size, 'k');
  const double start = NowSeconds();
  uint64_t sent = 0;
  std::string send_error;
  while (sent < total) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(write_size, total - sent));
    size_t off = 0;
    while (off < want) {
      ssize_t n = write(fd, data.data() + off, want - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        send_error = std::strerror(errno);
        break;
      }
      off += static_cast<size_t>(n);
    }
    if (!send_error.empty()) break;
    sent += want;
  }
  close(fd);
  receiver.join();
  close(lfd);
  if (!send_error.empty()) return absl::InternalError("tcp send: " + send_error);
  if (!recv_error.empty()) return absl::InternalError("tcp receive: " + recv_error);
  return end_time - start;
}

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

int Run(const Flags& f) {
  const int rounds = static_cast<int>(std::max<int64_t>(1, f.rounds));

  // Start the PS first: fork before any thread (gRPC, the TCP threads) exists.
  auto dir = MakeTempDir("kubetrain-bench-transport-");
  if (!dir.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      if (!keep) RemoveTree(dir);
    }
  } cleanup{*dir, f.keep_temp};
  auto ps_port = FreeLoopbackPort();
  auto worker_port = FreeLoopbackPort();
  if (!ps_port.ok() || !worker_port.ok()) {
    std::fprintf(stderr, "error: no free loopback port\n");
    return 1;
  }
  const std::string job_file = *dir + "/job.yaml";
  if (auto s = WriteFile(job_file, JobYaml(f)); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto config = LoadTaskConfig(job_file, TfConfigJson(*ps_port, *worker_port, "worker"));
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  PsProcess ps;
  if (auto s = ps.Start(f.ps_binary, job_file, TfConfigJson(*ps_port, *worker_port, "ps"),
                        *dir + "/ps.log");
      !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  // Let the PS initialise its shard first, so that it idles during (a).
  if (auto s = ps.WaitReady(*ps_port, 60); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  // (a) raw TCP.
  const uint64_t tcp_bytes = static_cast<uint64_t>(f.tcp_mib) << 20;
  const size_t write_size = static_cast<size_t>(f.tcp_write_kib) << 10;
  std::printf("transport benchmark: %d rounds; kubetrain-ps %s\n", rounds, f.ps_binary.c_str());
  std::fflush(stdout);
  std::vector<double> tcp_gbps;
  for (int r = 0; r < rounds; ++r) {
    auto secs = TcpRound(tcp_bytes, write_size);
    if (!secs.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(secs.status().message()).c_str());
      return 1;
    }
    tcp_gbps.push_back(tcp_bytes / *secs / 1e9);
    std::printf("  tcp round %d: %.0f MiB in %.3f s = %.2f GB/s\n", r + 1, tcp_bytes / 1048576.0,
                *secs, tcp_gbps.back());
    std::fflush(stdout);
  }

  // (b) push + pull through the real PS.
  const Model& model = *config->model;
  int64_t model_bytes = 0;
  for (const auto& v : model.variables()) model_bytes += v.num_bytes();
  RealClock clock;
  std::vector<std::unique_ptr<ShardChannel>> channels;
  channels.push_back(NewGrpcShardChannel(absl::StrCat("127.0.0.1:", *ps_port), f.chunk_bytes));
  PsClient::Options options;
  options.task_index = 0;
  options.fingerprint = config->fingerprint;
  options.chunk_bytes = f.chunk_bytes;
  options.retry_timeout = absl::Seconds(30);
  PsClient client(options, &config->placement, &clock, std::move(channels), PsClientMetrics{});
  if (auto s = client.Connect(); !s.ok()) {
    std::fprintf(stderr, "error: connect: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  Params params;
  Params grads;
  for (const auto& v : model.variables()) grads.emplace_back(v.num_elements(), 1e-3f);
  auto first = client.Pull(false, 0, model.variables(), &params);  // warm-up, not timed
  if (!first.ok()) {
    std::fprintf(stderr, "error: pull: %s\n", std::string(first.status().message()).c_str());
    return 1;
  }
  int64_t version = first->version;
  std::vector<double> ps_gbps, push_gbps, pull_gbps;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = NowSeconds();
    auto pushed = client.Push(grads, r + 1);
    const double t1 = NowSeconds();
    if (!pushed.ok()) {
      std::fprintf(stderr, "error: push: %s\n", std::string(pushed.status().message()).c_str());
      return 1;
    }
    auto pulled = client.Pull(false, r + 1, model.variables(), &params);
    const double t2 = NowSeconds();
    if (!pulled.ok()) {
      std::fprintf(stderr, "error: pull: %s\n", std::string(pulled.status().message()).c_str());
      return 1;
    }
    version = pulled->version;
    push_gbps.push_back(model_bytes / (t1 - t0) / 1e9);
    pull_gbps.push_back(model_bytes / (t2 - t1) / 1e9);
    ps_gbps.push_back(2.0 * model_bytes / (t2 - t0) / 1e9);
    std::printf(
        "  ps round %d: push %.1f ms (%.2f GB/s), pull %.1f ms (%.2f GB/s), "
        "push+pull %.2f GB/s; version %lld\n",
        r + 1, (t1 - t0) * 1e3, push_gbps.back(), (t2 - t1) * 1e3, pull_gbps.back(), ps_gbps.back(),
        static_cast<long long>(version));
    std::fflush(stdout);
  }
  absl::Status left = client.Leave();
  auto stats = client.Shutdown();
  int exit_code = ps.WaitOrKill(10);
  if (!left.ok()) std::fprintf(stderr, "warning: leave: %s\n", std::string(left.message()).c_str());
  if (!stats.ok()) {
    std::fprintf(stderr, "warning: shutdown: %s\n", std::string(stats.status().message()).c_str());
  }
  if (exit_code != 0) {
    std::fprintf(stderr, "warning: kubetrain-ps %s; its log:\n%s\n",
                 exit_code < 0 ? "did not exit within 10 s and was killed"
                               : absl::StrCat("exited with ", exit_code).c_str(),
                 ReadFileOrEmpty(ps.log_path()).c_str());
  }

  Summary tcp = Summarize(tcp_gbps), psum = Summarize(ps_gbps), push = Summarize(push_gbps),
          pull = Summarize(pull_gbps);
  const double model_mib = model_bytes / 1048576.0;
  std::printf(
      "model: mlp 784-%lld-10, %lld bytes (%.1f MiB) in %zu unsplit parts on 1 PS; chunk %lld "
      "bytes; "
      "tcp %lld MiB per round in %lld KiB writes\n",
      static_cast<long long>(f.hidden_units), static_cast<long long>(model_bytes), model_mib,
      config->placement.parts.size(), static_cast<long long>(f.chunk_bytes),
      static_cast<long long>(f.tcp_mib), static_cast<long long>(f.tcp_write_kib));
  std::printf("raw tcp       GB/s: min %.2f  median %.2f  max %.2f\n", tcp.min, tcp.median,
              tcp.max);
  std::printf("ps push       GB/s: min %.2f  median %.2f  max %.2f\n", push.min, push.median,
              push.max);
  std::printf("ps pull       GB/s: min %.2f  median %.2f  max %.2f\n", pull.min, pull.median,
              pull.max);
  std::printf("ps push+pull  GB/s: min %.2f  median %.2f  max %.2f  (%.1f MB per round)\n",
              psum.min, psum.median, psum.max, 2.0 * model_bytes / 1e6);
  std::printf("ps exit code: %d\n", exit_code);
  std::printf(
      "tcp_gbps=%.2f ps_gbps=%.2f ratio=%.3f tcp_min=%.2f tcp_max=%.2f ps_min=%.2f "
      "ps_max=%.2f model_mib=%.1f rounds=%d\n",
      tcp.median, psum.median, tcp.median > 0 ? psum.median / tcp.median : 0.0, tcp.min, tcp.max,
      psum.min, psum.max, model_mib, rounds);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kubetrain

int main(int argc, char** argv) {
  kubetrain::bench::Flags flags;
  kubetrain::FlagParser parser(
      "transport_bench [--ps_binary=bin/kubetrain-ps] [--rounds=5]: raw TCP vs PS push+pull");
  parser.String("ps_binary", &flags.ps_binary, "the kubetrain-ps binary to start");
  parser.Int("rounds", &flags.rounds, "repetitions of each measurement");
  parser.Int("tcp_mib", &flags.tcp_mib, "MiB sent per raw TCP round");
  parser.Int("tcp_write_kib", &flags.tcp_write_kib, "size of each raw TCP write/read, KiB");
  parser.Int("hidden_units", &flags.hidden_units,
             "hidden layer width of the MLP (sets the model size)");
  parser.Int("chunk_bytes", &flags.chunk_bytes, "transport.chunkBytes of the job");
  parser.Bool("keep_temp", &flags.keep_temp, "keep the temp dir (job file, PS log)");
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  kubetrain::InitProcess(kubetrain::ProcessProfile::kDefault);
  return kubetrain::bench::Run(flags);
}
