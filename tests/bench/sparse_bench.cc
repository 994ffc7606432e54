// Sparse (click-through) benchmark: a generated data set shaped like
// Criteo's — 13 numeric and 26 categorical columns — trained as a wide & deep
// model whose embedding and wide tables are row-sharded over real
// kubetrain-ps child processes, by the worker's sparse loop over gRPC.
//
// Data. Column c of the 26 categorical ones draws a rank r from a Zipf-like
// (continuous power law, exponent --zipf) distribution over an id space of
// K_c values, K_c log-spaced from 10 to --max_space (1e8); its CSV value is
// 8 hex digits of a hash of (c, r), as Criteo's are, which the data loader
// hashes into min(2 K_c, --buckets) buckets. Numeric columns are N(0, 1).
// Labels come from a planted logistic model: P(click) = sigmoid(b + sum_j
// a_j x_j + sum_c w_c(r_c)), with w_c(r) = sigma * g(c, r) / sqrt(1 + r / R),
// g a standard normal drawn from a hash (so 1e8 ids need no storage); the
// weights of rare ranks shrink (R = --rank_scale) as in real click data, where
// one rare id says little. The planted model's AUC on the test set is the
// best any model can reach; the trained one is reported as a fraction of it.
//
// Training: sync, 1 worker (in this process: Pull dense -> batch -> lookups
// -> PullRows of the batch's distinct ids -> gradients -> Push dense + rows,
// as worker/trainer.cc does), --ps PS tasks. Figures: examples/s, table rows
// pulled and pushed per second, PS bytes per stored row (the PS tasks'
// resident memory over a baseline PS of the same job with 16-row tables)
// against dim x 4 x (1 + optimizer slots), trained AUC / planted AUC, and the
// bytes on the wire per step (TCP payload of the worker's connections to the
// PS tasks, from `ss -ti`) minus the dense part's 2 x its bytes, against
// unique rows x dim x 4 x 2 + 16 bytes per unique id (8 each way).
// The last line is key=value pairs. Never fails on a time.
//
// --dynamic: the categorical columns are dynamic (no buckets: ids hashed from
// the values, table rows created on the PS tasks on first use) and the data
// streams from its files as a worker's does. PS bytes per row are then the
// PS tasks' VmRSS growth over training divided by the rows they hold.
// --scale: the scale run of issue 11: --dynamic, 4 PS tasks, dim 16, 8
// categorical columns over spaces up to 1e6 and a user-id column U whose
// values are almost all distinct (an embedding only, not in the planted
// model), 16.5M training examples: a U table of ~16M rows x 16 dims, sharded
// over the 4 PS tasks with its Adagrad state (> 2 GiB in all).
//
// --checkpoint_every_steps=N: the PS tasks write checkpoints every N steps
// while training goes on; printed: each PS task's peak resident memory
// (VmHWM) against its memory at the end, the worker's step times (median,
// p99, longest), and how long each PS task took to answer a probe: a thread
// of the bench asks every PS task for its stats (GetStats, which takes the
// shard's lock as Pull and Push do) every 10 ms while training goes on, so a
// checkpoint that holds the lock shows as a slow answer, apart from the
// worker's own steps (median, p99, longest answer).
// --kill_ps_at_step=S (with checkpoints): ps-0 is killed (SIGKILL) after step
// S and started again; it restores its newest checkpoint, the worker goes on
// (the steps ps-0 lost are done again) and the job finishes; printed: the
// restart's time to serve and its peak memory, and the steps lost.
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/flags.h"
#include "core/tabular.h"
#include "core/task_config.h"
#include "tests/bench/bench_util.h"
#include "worker/eval_data.h"
#include "worker/grpc_shard_channel.h"
#include "worker/ps_client.h"

namespace kubetrain {
namespace bench {
namespace {

constexpr int kNumeric = 13;

struct Flags {
  std::string ps_binary = DefaultPsBinary();
  int64_t ps = 2;
  int64_t train_examples = 400000;
  int64_t test_examples = 50000;
  int64_t batch = 256;
  int64_t epochs = 2;
  int64_t dim = 8;
  int64_t buckets = 1 << 17;
  double max_space = 1e8;
  double zipf = 1.1;
  double sigma = 0.6;
  double rank_scale = 200;
  int64_t seed = 7;
  double lr = 0.02;      // adagrad: dense layers and embeddings
  double wide_lr = 1.0;  // ftrl: the wide part
  int64_t categorical = 26;
  bool dynamic = false;
  bool uid = false;  // a user-id column U of ~distinct values
  bool big = false;
  bool scale = false;
  bool keep_temp = false;
  int64_t checkpoint_every_steps = 0;
  int64_t kill_ps_at_step = -1;
};

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double Unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
double Normal(uint64_t h) {  // Box-Muller from one hash
  return std::sqrt(-2 * std::log(Unit(h))) * std::cos(2 * M_PI * Unit(Mix(h)));
}

struct Generator {
  const Flags& f;
  std::vector<double> space;  // K_c per categorical column
  std::vector<double> numeric_weight;
  double bias = -1.2;

  explicit Generator(const Flags& flags) : f(flags) {
    const int n = static_cast<int>(f.categorical);
    for (int c = 0; c < n; ++c) {
      space.push_back(
          std::round(std::pow(10.0, 1 + std::log10(f.max_space / 10) * c / std::max(1, n - 1))));
    }
    for (int j = 0; j < kNumeric; ++j) {
      numeric_weight.push_back(0.3 * Normal(Mix(f.seed * 1000 + j)));
    }
  }
  int64_t Buckets(int c) const {
    return std::min<int64_t>(f.buckets, static_cast<int64_t>(2 * space[c]));
  }
  // A rank in [1, K] with density ~ r^-s.
  int64_t Rank(int c, uint64_t h) const {
    const double s = f.zipf, k = space[c];
    const double a = std::pow(k + 1, 1 - s) - 1;
    const double r = std::pow(a * Unit(h) + 1, 1 / (1 - s));
    return std::min<int64_t>(static_cast<int64_t>(k),
                             std::max<int64_t>(1, static_cast<int64_t>(r)));
  }
  double Weight(int c, int64_t rank) const {
    const uint64_t h =
        Mix(Mix(static_cast<uint64_t>(f.seed) * 131 + c) ^ static_cast<uint64_t>(rank));
    return f.sigma * Normal(h) / std::sqrt(1 + rank / f.rank_scale);
  }
  // One CSV line of example n of a stream, and its planted logit.
  double Line(uint64_t stream, int64_t n, std::string* line) const {
    line->clear();
    const uint64_t base = Mix(Mix(stream) ^ static_cast<uint64_t>(n));
    double logit = bias;
    char buf[32];
    for (int j = 0; j < kNumeric; ++j) {
      const double x = std::round(Normal(Mix(base + j)) * 1000) / 1000;
      logit += numeric_weight[j] * x;
      std::snprintf(buf, sizeof(buf), "%.3f,", x);
      line->append(buf);
    }
    for (int c = 0; c < static_cast<int>(f.categorical); ++c) {
      const int64_t rank = Rank(c, Mix(base + 100 + c));
      logit += Weight(c, rank);
      std::snprintf(
          buf, sizeof(buf), "%08" PRIx64 ",",
          Mix(static_cast<uint64_t>(c) << 40 ^ static_cast<uint64_t>(rank)) & 0xffffffffu);
      line->append(buf);
    }
    if (f.uid) {  // 48 bits of a hash of the example: (almost) never seen twice
      std::snprintf(buf, sizeof(buf), "%012" PRIx64 ",", Mix(base + 777) >> 16);
      line->append(buf);
    }
    const int label = Unit(Mix(base + 999)) < 1 / (1 + std::exp(-logit)) ? 1 : 0;
    line->append(label ? "1\n" : "0\n");
    return logit;
  }
};

std::string JobYaml(const Flags& f, const Generator& g, const std::string& dir, int64_t steps,
                    bool tiny_tables) {
  std::string columns, embeddings, wide;
  for (int j = 0; j < kNumeric; ++j) {
    absl::StrAppend(&columns, "        - {name: I", j + 1, ", type: numeric}\n");
  }
  for (int c = 0; c < static_cast<int>(f.categorical); ++c) {
    absl::StrAppend(&columns, "        - {name: C", c + 1, ", type: categorical, ",
                    f.dynamic ? std::string("dynamic: true")
                              : absl::StrCat("hashBuckets: ", tiny_tables ? 16 : g.Buckets(c)),
                    "}\n");
    absl::StrAppend(&embeddings, "        - {column: C", c + 1, ", dim: ", f.dim, "}\n");
    absl::StrAppend(&wide, c ? ", " : "", "C", c + 1);
  }
  if (f.uid) {
    absl::StrAppend(&columns, "        - {name: U, type: categorical, dynamic: true}\n");
    absl::StrAppend(&embeddings, "        - {column: U, dim: ", f.dim, "}\n");
  }
  return absl::StrCat(
      R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: bench-sparse
spec:
  replicaSpecs:
    PS: {replicas: )",
      f.ps, R"(}
    Worker: {replicas: 1}
  training:
    mode: sync
    model:
      embeddings:
)",
      embeddings, R"(      wide:
        columns: [)",
      wide, R"(]
        optimizer: {type: ftrl, learningRate: )",
      f.wide_lr, R"(, l2: 0.001}
      layers:
        - {type: dense, units: 32, activation: relu}
        - {type: dense, units: 1}
      head: wideAndDeep
    dataset:
      format: csv
      trainFiles: [)",
      dir, R"(/train.csv]
      testFiles: [)",
      dir, R"(/test.csv]
      onBadRecord: fail
      columns:
)",
      columns, R"(        - {name: label, type: label, classes: {"0": 0, "1": 1}}
    optimizer: {type: adagrad, learningRate: )",
      f.lr, R"(}
    batchSize: )",
      f.batch, R"(
    steps: )",
      steps, R"(
    seed: )",
      f.seed, R"(
    startupTimeoutSeconds: 60
)",
      f.checkpoint_every_steps > 0 && !tiny_tables
          ? absl::StrCat("    checkpoint: {directory: ", dir,
                         "/checkpoints, everySteps: ", f.checkpoint_every_steps, "}\n")
          : std::string());
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "error: %s%s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

// Resident memory of a process, bytes (VmRSS in /proc/<pid>/status).
// A memory figure of a process, bytes: "VmRSS" (resident now) or "VmHWM"
// (the peak resident) from /proc/<pid>/status.
int64_t StatusBytes(pid_t pid, absl::string_view field) {
  const std::string status = ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/status"));
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, field) || !absl::ConsumePrefix(&line, ":")) continue;
    int64_t kib = 0;
    if (absl::SimpleAtoi(
            absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB")),
            &kib)) {
      return kib * 1024;
    }
  }
  return -1;
}

int64_t RssBytes(pid_t pid) { return StatusBytes(pid, "VmRSS"); }
int64_t PeakRssBytes(pid_t pid) { return StatusBytes(pid, "VmHWM"); }

// TCP payload bytes sent + received on the established loopback connections
// to any of `ports` (`ss -ti`: bytes_sent/bytes_received per socket).
int64_t WireBytes(const std::vector<int>& ports) {
  std::string filter;
  for (int p : ports) absl::StrAppend(&filter, filter.empty() ? "" : " or ", "dport = :", p);
  const std::string cmd = absl::StrCat("ss -tinH state established '( ", filter, " )' 2>/dev/null");
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (::pclose(pipe) != 0) return -1;
  int64_t total = 0;
  for (absl::string_view field : absl::StrSplit(out, absl::ByAnyChar(" \t\n"))) {
    for (absl::string_view key : {"bytes_sent:", "bytes_received:"}) {
      if (absl::ConsumePrefix(&field, key)) {
        int64_t v = 0;
        if (absl::SimpleAtoi(field, &v)) total += v;
      }
    }
  }
  return total;
}

// Per PS task at the end of training: resident memory and the rows its
// dynamic tables hold (GetStats, over a channel of the bench's own).
struct PsFigures {
  int64_t rss = 0;
  int64_t peak_rss = 0;  // VmHWM
  int64_t rows = 0;
};

// The q-quantile (0..1) of `v` (sorted in place), 0 if empty.
double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// Lines of `path` that contain `what`.
int CountLines(const std::string& path, absl::string_view what) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(ReadFileOrEmpty(path), '\n')) {
    n += absl::StrContains(line, what) ? 1 : 0;
  }
  return n;
}

// Times every PS task's GetStats answers while training goes on (see the
// header comment): how long a PS stopped serving. Answers that fail (a PS
// killed, restarting) are not times; the first answer after a task was
// resumed is dropped (it includes the channel's reconnect).
class ServingProbe {
 public:
  explicit ServingProbe(std::vector<ShardChannel*> channels)
      : channels_(std::move(channels)), paused_(channels_.size()), reconnecting_(channels_.size()) {
    for (auto& p : paused_) p = false;
    for (auto& r : reconnecting_) r = false;
    thread_ = std::thread([this] { Loop(); });
  }
  ~ServingProbe() { Stop(); }

  void Pause(size_t task) { paused_[task] = true; }
  void Resume(size_t task) {
    reconnecting_[task] = true;
    paused_[task] = false;
  }
  // Joins the thread; the times are then final.
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<double>& millis() { return millis_; }

 private:
  void Loop() {
    v1::InfoRequest req;
    req.set_task_type(v1::TASK_TYPE_EXPORTER);
    while (!stop_) {
      for (size_t i = 0; i < channels_.size() && !stop_; ++i) {
        if (paused_[i]) continue;
        const double start = NowSeconds();
        auto stats = channels_[i]->GetStats(req);
        if (!stats.ok() || paused_[i]) continue;
        if (reconnecting_[i].exchange(false)) continue;
        const double ms = (NowSeconds() - start) * 1e3;
        millis_.push_back(ms);
        // Slow answers with the time, to match against the PS logs'
        // checkpoint lines.
        if (ms >= 100) {
          std::fprintf(stderr, "%s GetStats of ps-%zu took %.1f ms\n",
                       absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()).c_str(),
                       i, ms);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  const std::vector<ShardChannel*> channels_;
  std::vector<std::atomic<bool>> paused_, reconnecting_;
  std::atomic<bool> stop_{false};
  std::vector<double> millis_;  // the probe thread's until Stop()
  std::thread thread_;
};

int Run(Flags f) {
  if (f.big) {
    f.train_examples = std::max<int64_t>(f.train_examples, 4000000);
    f.test_examples = std::max<int64_t>(f.test_examples, 200000);
    f.buckets = std::max<int64_t>(f.buckets, 1 << 20);
  }
  if (f.scale) {
    f.dynamic = f.uid = true;
    f.ps = 4;
    f.dim = 16;
    f.categorical = 8;
    f.max_space = 1e6;
    f.train_examples = std::max<int64_t>(f.train_examples, 16500000);
    f.test_examples = std::max<int64_t>(f.test_examples, 200000);
    f.batch = std::max<int64_t>(f.batch, 2048);
    f.epochs = 1;
  }
  const Generator gen(f);
  auto dir = MakeTempDir("kubetrain-bench-sparse-");
  if (!dir.ok()) return Fail("", dir.status());
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      if (!keep) RemoveTree(dir);
    }
  } cleanup{*dir, f.keep_temp};

  // The data (before any thread: the PS tasks are forked next).
  const double t_gen = NowSeconds();
  std::vector<double> planted_test;
  for (const char* name : {"train", "test"}) {
    const bool test = std::string(name) == "test";
    const int64_t n = test ? f.test_examples : f.train_examples;
    std::ofstream out(absl::StrCat(*dir, "/", name, ".csv"));
    std::string line;
    for (int64_t i = 0; i < n; ++i) {
      const double logit = gen.Line(test ? 2 : 1, i, &line);
      if (test) planted_test.push_back(logit);
      out << line;
    }
    if (!out.good()) return Fail("", absl::InternalError(absl::StrCat("cannot write ", name)));
  }
  const double gen_seconds = NowSeconds() - t_gen;
  const int64_t steps = std::max<int64_t>(1, f.epochs * f.train_examples / f.batch);

  // Fixed tables: baseline PS tasks of the same job with 16-row tables give
  // the memory that is not table rows. Dynamic tables start empty: the PS
  // tasks' own memory before training is their baseline.
  std::vector<int> ps_ports, base_ports;
  const int num_ps = static_cast<int>(std::max<int64_t>(1, f.ps));
  for (int i = 0; i < (f.dynamic ? 1 : 2) * num_ps; ++i) {
    auto port = FreeLoopbackPort();
    if (!port.ok()) return Fail("", port.status());
    (i < num_ps ? ps_ports : base_ports).push_back(*port);
  }
  auto worker_port = FreeLoopbackPort();
  auto base_worker_port = FreeLoopbackPort();
  if (!worker_port.ok() || !base_worker_port.ok()) return Fail("", worker_port.status());
  const std::string job_file = *dir + "/job.yaml", base_file = *dir + "/baseline.yaml";
  if (auto s = WriteFile(job_file, JobYaml(f, gen, *dir, steps, false)); !s.ok())
    return Fail("", s);
  if (auto s = WriteFile(base_file, JobYaml(f, gen, *dir, steps, true)); !s.ok())
    return Fail("", s);
  std::vector<PsProcess> ps(num_ps), base(base_ports.size());
  for (int i = 0; i < num_ps; ++i) {
    if (auto s = ps[i].Start(f.ps_binary, job_file, TfConfigJson(ps_ports, *worker_port, "ps", i),
                             absl::StrCat(*dir, "/ps-", i, ".log"), {"--insecure"});
        !s.ok()) {
      return Fail("", s);
    }
  }
  for (size_t i = 0; i < base_ports.size(); ++i) {
    if (auto s =
            base[i].Start(f.ps_binary, base_file,
                          TfConfigJson(base_ports, *base_worker_port, "ps", static_cast<int>(i)),
                          absl::StrCat(*dir, "/baseline-ps-", i, ".log"), {"--insecure"});
        !s.ok()) {
      return Fail("", s);
    }
  }
  auto config = LoadTaskConfig(job_file, TfConfigJson(ps_ports, *worker_port, "worker", 0));
  if (!config.ok()) return Fail("", config.status());
  const TrainingSpec& spec = config->job.training;
  const Model& model = *config->model;
  const Placement& placement = config->placement;
  const double t_load = NowSeconds();
  // Fixed tables: the training set in memory (as before, for the figures of
  // the README); dynamic: streamed from its file, as a worker does.
  std::unique_ptr<ShardedBatcher> batcher;
  absl::StatusOr<Dataset> train_in_memory;
  absl::StatusOr<TrainingSet> train_stream;
  if (f.dynamic) {
    train_stream = OpenTabularTrainingSet(spec.tabular);
    if (!train_stream.ok()) return Fail("train data: ", train_stream.status());
    batcher = std::make_unique<ShardedBatcher>(*train_stream->source, 0, 1, spec.seed,
                                               spec.shuffle_buffer);
  } else {
    train_in_memory = LoadTabular(spec.tabular, spec.tabular.train_files, nullptr);
    if (!train_in_memory.ok()) return Fail("train data: ", train_in_memory.status());
    batcher = std::make_unique<ShardedBatcher>(*train_in_memory, 0, 1, spec.seed);
  }
  auto test = LoadTabular(spec.tabular, spec.tabular.test_files, nullptr);
  if (!test.ok()) return Fail("test data: ", test.status());
  const double load_seconds = NowSeconds() - t_load;

  int64_t table_rows = 0, table_floats = 0, dense_bytes = 0;
  for (const auto& t : placement.tables) {
    table_rows += t.rows;
    table_floats += t.rows * t.dim;
  }
  for (const auto& v : model.variables()) {
    if (!v.table) dense_bytes += v.num_bytes();
  }
  // Values + optimizer slots per row: adagrad 1 slot (embeddings), ftrl 2 (wide).
  auto row_bytes = [](const TablePlacement& t) { return t.dim * 4 * (1 + (t.wide ? 2 : 1)); };
  int64_t slot_bytes = 0;
  for (const auto& t : placement.tables) slot_bytes += t.rows * row_bytes(t);
  const std::string tables_text =
      f.dynamic ? std::string("rows created as ids appear")
                : absl::StrFormat("%lld rows (%.1f MiB of values)",
                                  static_cast<long long>(table_rows), table_floats * 4 / 1048576.0);
  std::printf(
      "sparse benchmark: %d numeric + %lld categorical columns%s, id spaces 10..%.0g (Zipf %.2f), "
      "%lld train / %lld test examples (generated in %.1f s, loaded in %.1f s)\n"
      "  wide & deep: %zu %s tables, %s, dense %lld bytes; "
      "%d PS, 1 sync worker, batch %lld, %lld steps\n",
      kNumeric, static_cast<long long>(f.categorical), f.uid ? " + a user id U" : "", f.max_space,
      f.zipf, static_cast<long long>(f.train_examples), static_cast<long long>(f.test_examples),
      gen_seconds, load_seconds, placement.tables.size(), f.dynamic ? "dynamic" : "fixed",
      tables_text.c_str(), static_cast<long long>(dense_bytes), num_ps,
      static_cast<long long>(f.batch), static_cast<long long>(steps));
  std::fflush(stdout);

  // PS memory before training: the job's PS tasks (and the baseline ones).
  for (int i = 0; i < num_ps; ++i) {
    if (auto s = ps[i].WaitReady(ps_ports[i], 300); !s.ok()) return Fail("", s);
  }
  for (size_t i = 0; i < base.size(); ++i) {
    if (auto s = base[i].WaitReady(base_ports[i], 300); !s.ok()) return Fail("", s);
  }
  std::vector<int64_t> rss_start(num_ps);
  int64_t rss = 0, base_rss = 0;
  for (int i = 0; i < num_ps; ++i) {
    rss_start[i] = RssBytes(ps[i].pid());
    rss += rss_start[i];
  }
  for (auto& b : base) {
    base_rss += RssBytes(b.pid());
    ::kill(b.pid(), SIGTERM);
    b.WaitOrKill(10);
  }

  RealClock clock;
  std::vector<std::unique_ptr<ShardChannel>> channels, stats_channels;
  for (int port : ps_ports) {
    channels.push_back(NewGrpcShardChannel(absl::StrCat("127.0.0.1:", port), spec.chunk_bytes));
    stats_channels.push_back(
        NewGrpcShardChannel(absl::StrCat("127.0.0.1:", port), spec.chunk_bytes));
  }
  PsClient::Options options;
  options.fingerprint = config->fingerprint;
  options.chunk_bytes = spec.chunk_bytes;
  options.retry_timeout = absl::Seconds(60);
  PsClient client(options, &placement, &clock, std::move(channels), PsClientMetrics{});
  if (auto s = client.Connect(); !s.ok()) return Fail("connect: ", s);

  Params params, grads;
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<int64_t> lookup_ids;
  int64_t rows_moved = 0, ideal_bytes = 0;
  const int64_t wire_start = WireBytes(ps_ports);
  const double t0 = NowSeconds();
  // As worker/trainer.cc: the worker's clock counts its steps; the job is
  // done when every shard reached `steps` (a restarted shard redoes the
  // steps it lost).
  std::vector<double> step_seconds;
  std::unique_ptr<ServingProbe> probe;
  if (f.checkpoint_every_steps > 0) {
    std::vector<ShardChannel*> probed;
    for (auto& c : stats_channels) probed.push_back(c.get());
    probe = std::make_unique<ServingProbe>(std::move(probed));
  }
  int64_t local_steps = 0, steps_lost = 0;
  double restart_ready_seconds = -1;
  int64_t restart_peak_rss = -1;
  for (bool pushed = false;; pushed = true) {
    const double step_start = NowSeconds();
    auto pulled = client.Pull(/*next_version=*/pushed, local_steps, model.variables(), &params);
    if (!pulled.ok()) return Fail("pull: ", pulled.status());
    steps_lost += pulled->steps_lost;
    if (pulled->done || pulled->version >= steps) break;
    if (auto s = batcher->Next(spec.batch_size, &x, &y, nullptr, &lookup_ids); !s.ok()) {
      return Fail("data: ", s);
    }
    SparseBatch lookups = model.Lookups(lookup_ids.data(), spec.batch_size);
    const TableIds ids = CompactLookups(&lookups);
    if (auto s = client.PullRows(ids, &params); !s.ok()) return Fail("pull rows: ", s);
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t n = static_cast<int64_t>(ids[t].size());
      rows_moved += n;
      ideal_bytes += n * placement.tables[t].dim * 4 * 2 + n * 8 * 2;
    }
    Batch b;
    b.x = x.data();
    b.labels = y.data();
    b.size = spec.batch_size;
    b.sparse = &lookups;
    model.LossAndGradients(params, b, spec.seed ^ static_cast<uint64_t>(local_steps), &grads);
    auto pushed_result = client.Push(grads, local_steps + 1, ids);
    if (!pushed_result.ok()) return Fail("push: ", pushed_result.status());
    ++local_steps;
    step_seconds.push_back(NowSeconds() - step_start);
    if (f.scale && local_steps % 500 == 0) {
      std::fprintf(stderr, "step %lld/%lld, %.0f examples/s\n", static_cast<long long>(local_steps),
                   static_cast<long long>(steps), local_steps * f.batch / (NowSeconds() - t0));
    }
    if (local_steps == f.kill_ps_at_step) {
      // ps-0 dies as a node would take it; its restart restores the newest
      // checkpoint. The worker's next calls retry until it serves again.
      std::fprintf(stderr, "killing ps-0 after step %lld\n", static_cast<long long>(local_steps));
      if (probe) probe->Pause(0);
      ::kill(ps[0].pid(), SIGKILL);
      ps[0].WaitOrKill(30);
      const double restart = NowSeconds();
      if (auto s = ps[0].Start(f.ps_binary, job_file, TfConfigJson(ps_ports, *worker_port, "ps", 0),
                               absl::StrCat(*dir, "/ps-0-restarted.log"), {"--insecure"});
          !s.ok()) {
        return Fail("restart ps-0: ", s);
      }
      if (auto s = ps[0].WaitReady(ps_ports[0], 600); !s.ok()) return Fail("restart ps-0: ", s);
      restart_ready_seconds = NowSeconds() - restart;
      if (probe) probe->Resume(0);
      restart_peak_rss = PeakRssBytes(ps[0].pid());
      std::fprintf(stderr, "ps-0 serves again after %.1f s\n", restart_ready_seconds);
    }
  }
  const double train_seconds = NowSeconds() - t0;
  if (probe) probe->Stop();
  const int64_t wire_end = WireBytes(ps_ports);

  // The trained model on the test set (the rows it looks up, as the chief
  // reads them), against the planted one.
  auto final_pull = client.PullAtLeast(steps, local_steps, model.variables(), &params);
  if (!final_pull.ok()) return Fail("final pull: ", final_pull.status());
  const EvalData test_eval(model, *test);
  auto evaluated = test_eval.Evaluate(&client, &params);
  if (!evaluated.ok()) return Fail("evaluate: ", evaluated.status());
  const EvalMetrics& m = *evaluated;
  const double planted_auc = Auc(planted_test, test->labels);
  const double trained_auc = m.auc.value_or(0);

  // Dynamic tables: what each PS task holds now, and what that costs.
  std::vector<PsFigures> figures(num_ps);
  double expected_per_row = table_rows > 0 ? static_cast<double>(slot_bytes) / table_rows : 0;
  double bytes_per_row = 0;
  int64_t largest_table_rows = 0;
  std::string largest_table;
  if (f.dynamic) {
    int64_t rows = 0, growth = 0, expected = 0;
    std::map<std::string, int64_t> rows_of_table;
    for (int i = 0; i < num_ps; ++i) {
      figures[i].rss = RssBytes(ps[i].pid());
      v1::InfoRequest req;
      req.set_task_type(v1::TASK_TYPE_EXPORTER);  // a reader every job admits
      auto info = stats_channels[i]->GetInfo(req, absl::Seconds(30));
      if (!info.ok()) return Fail("info: ", info.status());
      for (int t = 0; t < info->tables_size(); ++t) {
        const int64_t n = static_cast<int64_t>(info->tables(t).local_rows());
        figures[i].rows += n;
        rows_of_table[info->tables(t).name()] += n;
        expected += n * row_bytes(placement.tables[t]);
      }
      rows += figures[i].rows;
      growth += figures[i].rss - rss_start[i];
    }
    for (const auto& [name, n] : rows_of_table) {
      if (n > largest_table_rows) {
        largest_table_rows = n;
        largest_table = name;
      }
    }
    table_rows = rows;
    bytes_per_row = rows > 0 ? static_cast<double>(growth) / rows : 0;
    expected_per_row = rows > 0 ? static_cast<double>(expected) / rows : 0;
  } else {
    const int64_t base_rows = static_cast<int64_t>(placement.tables.size()) * 16;
    bytes_per_row =
        static_cast<double>(rss - base_rss) / static_cast<double>(table_rows - base_rows);
  }

  // Every PS task's memory now and at its peak (a checkpoint's copies show there).
  for (int i = 0; i < num_ps; ++i) {
    figures[i].rss = RssBytes(ps[i].pid());
    figures[i].peak_rss = PeakRssBytes(ps[i].pid());
  }

  absl::Status left = client.Leave();
  auto stats = client.Shutdown();
  for (auto& p : ps) {
    if (const int code = p.WaitOrKill(120); code != 0) {
      std::fprintf(stderr, "warning: kubetrain-ps exit code %d; its log:\n%s\n", code,
                   ReadFileOrEmpty(p.log_path()).c_str());
    }
  }
  if (!left.ok()) std::fprintf(stderr, "warning: leave: %s\n", std::string(left.message()).c_str());
  if (!stats.ok()) return Fail("shutdown: ", stats.status());

  const double examples_per_second = steps * f.batch / train_seconds;
  const double rows_per_second = rows_moved / train_seconds;
  const double wire_per_step =
      wire_start >= 0 && wire_end >= 0 ? static_cast<double>(wire_end - wire_start) / steps : -1;
  const double sparse_wire_per_step = wire_per_step - 2.0 * dense_bytes;
  const double ideal_per_step = static_cast<double>(ideal_bytes) / steps;
  std::printf(
      "training: %.1f s, %.0f examples/s; table rows pulled %.0f/s, pushed %.0f/s "
      "(%.0f distinct ids per step over %zu tables)\n",
      train_seconds, examples_per_second, rows_per_second, rows_per_second,
      static_cast<double>(rows_moved) / steps, placement.tables.size());
  if (f.dynamic) {
    int64_t rss_max = 0, rows_max = 0;
    for (int i = 0; i < num_ps; ++i) {
      std::printf("  ps-%d: %lld rows, %.1f MiB resident (%.1f MiB at start)\n", i,
                  static_cast<long long>(figures[i].rows), figures[i].rss / 1048576.0,
                  rss_start[i] / 1048576.0);
      rss_max = std::max(rss_max, figures[i].rss);
      rows_max = std::max(rows_max, figures[i].rows);
    }
    std::printf(
        "PS memory: %lld rows of dynamic tables (largest: %s, %lld rows over %d PS tasks): %.1f "
        "bytes per row of growth (values + slots: %.1f)\n",
        static_cast<long long>(table_rows), largest_table.c_str(),
        static_cast<long long>(largest_table_rows), num_ps, bytes_per_row, expected_per_row);
    std::printf("ps_rss_max_mib=%.1f ps_rows_max=%lld largest_table_rows=%lld\n",
                rss_max / 1048576.0, static_cast<long long>(rows_max),
                static_cast<long long>(largest_table_rows));
  } else {
    std::printf(
        "PS memory: %.1f MiB resident over the 16-row baseline for %lld rows: %.1f bytes per "
        "row (values + slots: %.1f)\n",
        (rss - base_rss) / 1048576.0,
        static_cast<long long>(table_rows - static_cast<int64_t>(placement.tables.size()) * 16),
        bytes_per_row, expected_per_row);
  }
  std::printf(
      "wire: %.0f bytes per step (TCP payload, both ways); minus dense 2 x %lld = %.0f for the "
      "tables vs %.0f (rows x dim x 4 x 2 + 16 per id): %.3fx\n",
      wire_per_step, static_cast<long long>(dense_bytes), sparse_wire_per_step, ideal_per_step,
      sparse_wire_per_step / ideal_per_step);
  if (f.checkpoint_every_steps > 0) {
    int written = 0;
    double peak_over_end = 0;
    int64_t peak_max = 0;
    for (int i = 0; i < num_ps; ++i) {
      written += CountLines(ps[i].log_path(), "checkpoint at version");
      std::printf("  ps-%d: peak %.1f MiB resident, %.1f MiB at the end (%.3fx)\n", i,
                  figures[i].peak_rss / 1048576.0, figures[i].rss / 1048576.0,
                  static_cast<double>(figures[i].peak_rss) / figures[i].rss);
      peak_over_end = std::max(peak_over_end, static_cast<double>(figures[i].peak_rss) /
                                                  static_cast<double>(figures[i].rss));
      peak_max = std::max(peak_max, figures[i].peak_rss);
    }
    if (f.kill_ps_at_step > 0) {
      written += CountLines(absl::StrCat(*dir, "/ps-0.log"), "checkpoint at version");
    }
    const double p50 = Quantile(step_seconds, 0.5) * 1e3, p99 = Quantile(step_seconds, 0.99) * 1e3;
    const double longest = step_seconds.empty() ? 0 : step_seconds.back() * 1e3;
    std::vector<double>& served = probe->millis();
    const double served_p50 = Quantile(served, 0.5), served_p99 = Quantile(served, 0.99);
    const double served_max = served.empty() ? 0 : served.back();
    std::printf(
        "checkpoints: every %lld steps, %d written while training; worker steps: median %.1f "
        "ms, p99 %.1f ms, longest %.1f ms; %zu GetStats answers of the PS tasks while training: "
        "median %.2f ms, p99 %.2f ms, longest %.1f ms\n",
        static_cast<long long>(f.checkpoint_every_steps), written, p50, p99, longest, served.size(),
        served_p50, served_p99, served_max);
    if (f.kill_ps_at_step > 0) {
      std::printf(
          "ps-0 killed after step %lld: served again %.1f s after its restart (peak %.1f MiB "
          "resident while restoring); %lld steps lost and done again; %lld steps in all\n",
          static_cast<long long>(f.kill_ps_at_step), restart_ready_seconds,
          restart_peak_rss / 1048576.0, static_cast<long long>(steps_lost),
          static_cast<long long>(local_steps));
    }
    std::printf(
        "checkpoints_written=%d ps_peak_rss_max_mib=%.1f ps_peak_over_end_max=%.3f "
        "step_ms_p50=%.1f step_ms_p99=%.1f step_ms_max=%.1f serve_ms_p50=%.2f serve_ms_p99=%.2f "
        "serve_ms_max=%.1f restart_ready_s=%.1f restart_peak_rss_mib=%.1f steps_lost=%lld\n",
        written, peak_max / 1048576.0, peak_over_end, p50, p99, longest, served_p50, served_p99,
        served_max, restart_ready_seconds, restart_peak_rss / 1048576.0,
        static_cast<long long>(steps_lost));
  }
  std::printf("test AUC: trained %.4f, planted %.4f (%.4f of it); accuracy %.4f, log loss %.4f\n",
              trained_auc, planted_auc, trained_auc / planted_auc, m.accuracy.value_or(0),
              m.log_loss.value_or(0));
  std::printf(
      "examples_per_second=%.0f rows_pulled_per_second=%.0f rows_pushed_per_second=%.0f "
      "ps_bytes_per_row=%.1f expected_bytes_per_row=%.1f auc=%.4f planted_auc=%.4f "
      "auc_ratio=%.4f wire_bytes_per_step=%.0f sparse_wire_bytes_per_step=%.0f "
      "ideal_sparse_bytes_per_step=%.0f wire_ratio=%.3f steps=%lld batch=%lld ps=%d "
      "table_rows=%lld train_examples=%lld dynamic=%d\n",
      examples_per_second, rows_per_second, rows_per_second, bytes_per_row, expected_per_row,
      trained_auc, planted_auc, trained_auc / planted_auc, wire_per_step, sparse_wire_per_step,
      ideal_per_step, sparse_wire_per_step / ideal_per_step, static_cast<long long>(steps),
      static_cast<long long>(f.batch), num_ps, static_cast<long long>(table_rows),
      static_cast<long long>(f.train_examples), f.dynamic ? 1 : 0);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kubetrain

int main(int argc, char** argv) {
  kubetrain::bench::Flags flags;
  kubetrain::FlagParser parser(
      "sparse_bench [--ps_binary=bin/kubetrain-ps] [--big]: generated click-through data, wide & "
      "deep over real PS tasks");
  parser.String("ps_binary", &flags.ps_binary, "the kubetrain-ps binary to start");
  parser.Int("ps", &flags.ps, "PS tasks (kubetrain-ps children; tables are sharded over them)");
  parser.Int("train_examples", &flags.train_examples, "generated training examples");
  parser.Int("test_examples", &flags.test_examples, "generated test examples");
  parser.Int("batch", &flags.batch, "batch size");
  parser.Int("epochs", &flags.epochs, "passes over the training examples");
  parser.Int("dim", &flags.dim, "embedding dimension");
  parser.Int("buckets", &flags.buckets, "most hash buckets (table rows) per column");
  parser.Double("max_space", &flags.max_space, "id space of the largest column");
  parser.Double("zipf", &flags.zipf, "exponent of the id distributions (> 1)");
  parser.Double("sigma", &flags.sigma, "planted weight scale of a frequent id");
  parser.Double("rank_scale", &flags.rank_scale,
                "rank at which planted weights have shrunk by 1/sqrt(2)");
  parser.Int("seed", &flags.seed, "data and model seed");
  parser.Double("lr", &flags.lr, "adagrad learning rate (dense layers, embeddings)");
  parser.Double("wide_lr", &flags.wide_lr, "ftrl learning rate (the wide part)");
  parser.Int("categorical", &flags.categorical, "categorical columns");
  parser.Bool("dynamic", &flags.dynamic,
              "dynamic categorical columns (rows created on first use; data streamed from file)");
  parser.Bool("uid", &flags.uid, "a user-id column U of almost always new values (an embedding)");
  parser.Bool("big", &flags.big,
              "a bigger run: >= 4M training examples, 200k test, 2^20 buckets per column");
  parser.Bool("scale", &flags.scale,
              "the scale run: --dynamic --uid, 4 PS, dim 16, 8 categorical columns (spaces up to "
              "1e6), 16.5M training examples, batch 2048: ~16M rows x 16 dims of U");
  parser.Bool("keep_temp", &flags.keep_temp, "keep the temp dir (data, job files, PS logs)");
  parser.Int("checkpoint_every_steps", &flags.checkpoint_every_steps,
             "PS checkpoints every this many steps while training (0: none)");
  parser.Int("kill_ps_at_step", &flags.kill_ps_at_step,
             "with checkpoints: SIGKILL ps-0 after this step and start it again (-1: never)");
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  kubetrain::InitProcess(kubetrain::ProcessProfile::kDefault);
  return kubetrain::bench::Run(flags);
}
