// GFLOP/s of the layer kernels kubetrain trains with, against a plain Eigen
// GEMM of the same shapes measured in the same run:
//   conv   ConvForward + ConvBackward (im2col, three GEMMs, col2im) of the
//          fashion-mnist-cnn example's second conv layer (14x14x32 -> 64
//          filters, 3x3, same padding) on a batch;
//   dense  Model::LossAndGradients-style dense forward + backward (three
//          GEMMs) of its 3136 -> 128 layer;
//   gemm   the same three GEMMs per layer on preallocated matrices: the
//          ceiling the kernels are compared with;
//   step   one Model::LossAndGradients of the whole example CNN (what a
//          worker computes per step, on one core; no PS transfer);
//   threads the same step with Model::SetThreads(--threads) against one
//          thread, timed alternately step by step (one of each per round)
//          so that load from other processes hits both alike;
//          threads_speedup is the median over rounds of t(1) / t(N);
//   mlp     the same alternation for an MLP step with tanh (784 -> 512 ->
//          256 -> 10, --batch): split GEMMs and tanh;
//   sparse  and for a wide & deep step (4 columns, embeddings of 32,
//          dense 256 ReLU, batch 2048, compact lookups and tables as a
//          worker steps): the split gather and scatter.
// --profile_steps=N runs only N CNN steps on --threads threads (the kernel
// figures above once, as a warm-up) and prints ms per step, so that
//   perf record -g layers_bench --profile_steps=300
// profiles the threaded step and little else.
// Prints figures; the last line is key=value pairs (ratios = kernel / gemm).
// Never fails on a time.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/flags.h"
#include "core/layers.h"
#include "core/model.h"
#include "core/thread_pool.h"
#include "tests/bench/bench_util.h"

namespace kubetrain {
namespace {

using bench::NowSeconds;

double ClockSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
double CpuSeconds() { return ClockSeconds(CLOCK_PROCESS_CPUTIME_ID); }
// This thread's CPU time: in a threaded step, the caller's share (the
// serial parts and chunk 0 of every split), which waiting does not count.
double ThreadCpuSeconds() { return ClockSeconds(CLOCK_THREAD_CPUTIME_ID); }

// Median seconds of `fn` over `reps` runs after one warm-up.
template <typename Fn>
double Time(int reps, Fn fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = NowSeconds();
    fn();
    t.push_back(NowSeconds() - t0);
  }
  return bench::Summarize(t).median;
}

RowMatrix Random(int64_t rows, int64_t cols, std::mt19937_64* rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  RowMatrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = n(*rng);
  return m;
}

// Three GEMMs of a layer's forward and backward: out = in*W, dW = in^T*dout,
// din = dout*W^T, for in [m, k], W [k, n].
double GemmSeconds(int64_t m, int64_t k, int64_t n, int reps, std::mt19937_64* rng) {
  RowMatrix in = Random(m, k, rng), w = Random(k, n, rng), dout = Random(m, n, rng);
  RowMatrix out(m, n), dw(k, n), din(m, k);
  return Time(static_cast<int>(reps), [&] {
    out.noalias() = in * w;
    dw.noalias() = in.transpose() * dout;
    din.noalias() = dout * w.transpose();
  });
}

// Median over rounds of one step on `single` then one on `threaded`.
struct Alternated {
  double ms1 = 0, msn = 0, speedup = 0;
};
Alternated Alternate(int64_t reps, const Model& single, const Model& threaded, const Params& params,
                     const Batch& b) {
  Params g1, gn;
  uint64_t seed = 0;
  single.LossAndGradients(params, b, ++seed, &g1);
  threaded.LossAndGradients(params, b, ++seed, &gn);
  std::vector<double> t1, tn, ratio;
  for (int64_t i = 0; i < reps; ++i) {
    double t0 = NowSeconds();
    single.LossAndGradients(params, b, ++seed, &g1);
    t1.push_back(NowSeconds() - t0);
    t0 = NowSeconds();
    threaded.LossAndGradients(params, b, ++seed, &gn);
    tn.push_back(NowSeconds() - t0);
    ratio.push_back(t1.back() / tn.back());
  }
  return {bench::Summarize(t1).median * 1e3, bench::Summarize(tn).median * 1e3,
          bench::Summarize(ratio).median};
}

int Main(int argc, char** argv) {
  int64_t batch = 64, reps = 20, threads = 2, profile_steps = 0;
  FlagParser flags("layers_bench [--batch N] [--reps N] [--threads N] [--profile_steps N]");
  flags.Int("batch", &batch, "examples per batch");
  flags.Int("reps", &reps, "timed repetitions (median reported)");
  flags.Int("threads", &threads, "threads of the multi-threaded CNN step (against one)");
  flags.Int("profile_steps", &profile_steps,
            "only run this many CNN steps on --threads threads and exit (for perf record: "
            "nothing else in the profile)");
  if (auto st = flags.Parse(argc, argv, 1, nullptr); !st.ok() || flags.help_requested()) {
    std::fprintf(stderr, "%s\n%s", st.ok() ? "" : std::string(st.message()).c_str(),
                 flags.Usage().c_str());
    return flags.help_requested() ? 0 : 2;
  }
  if (threads < 1) {
    std::fprintf(stderr, "--threads must be >= 1, got %lld\n", static_cast<long long>(threads));
    return 2;
  }
  std::mt19937_64 rng(1);
  // --profile_steps: the kernels below run once each (warm-up only).
  const int kernel_reps = profile_steps > 0 ? 0 : static_cast<int>(reps);

  // conv: 14x14x32 -> 64 filters, 3x3 same.
  LayerSpec conv;
  conv.type = LayerType::kConv2D;
  conv.filters = 64;
  conv.kernel = 3;
  conv.same_padding = true;
  const WindowGeometry g = MakeWindowGeometry(conv, {14, 14, 32});
  const int64_t cm = batch * g.positions(), ck = g.patch_size(), cn = conv.filters;
  RowMatrix in = Random(batch, 14 * 14 * 32, &rng), kernel = Random(ck, cn, &rng);
  std::vector<float> bias(cn, 0.1f), dkernel(ck * cn), dbias(cn);
  RowMatrix col, out, din, dout = Random(batch, g.positions() * cn, &rng);
  const double conv_s = Time(kernel_reps, [&] {
    ConvForward(g, in.data(), batch, kernel.data(), bias.data(), conv.filters, &col, &out);
    ConvBackward(g, col, dout, kernel.data(), conv.filters, batch, dkernel.data(), dbias.data(),
                 &din);
  });
  const double conv_flops = 3.0 * 2 * cm * ck * cn;
  const double conv_gemm_s = GemmSeconds(cm, ck, cn, kernel_reps, &rng);

  // dense: 3136 -> 128 (forward GEMM + bias + ReLU, backward mask + 2 GEMMs + bias sum).
  const int64_t dk = 3136, dn = 128;
  RowMatrix x = Random(batch, dk, &rng), w = Random(dk, dn, &rng);
  RowMatrix dy = Random(batch, dn, &rng), dw(dk, dn), dx(batch, dk);
  Eigen::RowVectorXf b = Eigen::RowVectorXf::Constant(dn, 0.1f), db(dn);
  const double dense_s = Time(kernel_reps, [&] {
    RowMatrix z(batch, dn);
    z.noalias() = x * w;
    z.rowwise() += b;
    ApplyActivation(Activation::kRelu, &z);
    RowMatrix d = dy;
    ActivationGradient(Activation::kRelu, z, &d);
    dw.noalias() = x.transpose() * d;
    db = d.colwise().sum();
    dx.noalias() = d * w.transpose();
  });
  const double dense_flops = 3.0 * 2 * batch * dk * dn;
  const double dense_gemm_s = GemmSeconds(batch, dk, dn, kernel_reps, &rng);

  // step: the fashion-mnist-cnn example's layer list, random inputs.
  ModelSpec cnn;
  cnn.type = "layers";
  cnn.input_shape = {28, 28, 1};
  auto layer = [](LayerType type, int n, int k, Activation a) {
    LayerSpec l;
    l.type = type;
    l.units = l.filters = n;
    l.kernel = k;
    l.stride = type == LayerType::kConv2D ? 1 : k;
    l.same_padding = true;
    l.activation = a;
    l.rate = type == LayerType::kDropout ? 0.5 : 0;
    return l;
  };
  cnn.layers = {layer(LayerType::kConv2D, 32, 3, Activation::kRelu),
                layer(LayerType::kMaxPool2D, 0, 2, Activation::kLinear),
                layer(LayerType::kConv2D, 64, 3, Activation::kRelu),
                layer(LayerType::kMaxPool2D, 0, 2, Activation::kLinear),
                layer(LayerType::kFlatten, 0, 0, Activation::kLinear),
                layer(LayerType::kDense, 128, 0, Activation::kRelu),
                layer(LayerType::kDropout, 0, 0, Activation::kLinear),
                layer(LayerType::kDense, 10, 0, Activation::kLinear)};
  auto model = Model::Create(cnn);
  if (!model.ok()) {
    std::fprintf(stderr, "cnn: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const Params params = model->InitialParams(7);
  RowMatrix images = Random(batch, 784, &rng);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % 10);
  Params grads;
  uint64_t dropout_seed = 0;
  if (profile_steps > 0) {
    Model m = *model;
    m.SetThreads(static_cast<int>(threads));
    Batch b;
    b.x = images.data();
    b.labels = labels.data();
    b.size = batch;
    const double t0 = NowSeconds(), c0 = CpuSeconds(), tc0 = ThreadCpuSeconds();
    for (int64_t i = 0; i < profile_steps; ++i)
      m.LossAndGradients(params, b, ++dropout_seed, &grads);
    const double per = 1e3 / static_cast<double>(profile_steps);
    std::printf(
        "%lld cnn steps on %lld threads: %.3f ms each; CPU %.3f ms, %.3f ms on the caller\n",
        static_cast<long long>(profile_steps), static_cast<long long>(threads),
        (NowSeconds() - t0) * per, (CpuSeconds() - c0) * per, (ThreadCpuSeconds() - tc0) * per);
    return 0;
  }
  auto step = [&] {
    Batch b;
    b.x = images.data();
    b.labels = labels.data();
    b.size = batch;
    model->LossAndGradients(params, b, ++dropout_seed, &grads);
  };
  const double step_s = Time(reps, step);
  // CPU time per step too: on a shared, loaded machine wall time measures
  // the neighbours as much as the kernels.
  const double cpu0 = CpuSeconds();
  for (int64_t i = 0; i < reps; ++i) step();
  const double step_cpu_s = (CpuSeconds() - cpu0) / static_cast<double>(reps);

  // threads: one model per thread count, steps alternated.
  Model threaded = *model;
  threaded.SetThreads(static_cast<int>(threads));
  Model single = *model;
  single.SetThreads(1);
  Params grads_n;
  auto step_on = [&](const Model& m, Params* g) {
    Batch b;
    b.x = images.data();
    b.labels = labels.data();
    b.size = batch;
    m.LossAndGradients(params, b, ++dropout_seed, g);
  };
  step_on(single, &grads);
  step_on(threaded, &grads_n);
  std::vector<double> t1, tn, ratio, cpu1, cpun, caller_cpun;
  for (int64_t i = 0; i < reps; ++i) {
    double t0 = NowSeconds(), c0 = CpuSeconds();
    step_on(single, &grads);
    t1.push_back(NowSeconds() - t0);
    cpu1.push_back(CpuSeconds() - c0);
    t0 = NowSeconds();
    c0 = CpuSeconds();
    const double tc0 = ThreadCpuSeconds();
    step_on(threaded, &grads_n);
    tn.push_back(NowSeconds() - t0);
    cpun.push_back(CpuSeconds() - c0);
    caller_cpun.push_back(ThreadCpuSeconds() - tc0);
    ratio.push_back(t1.back() / tn.back());
  }
  const double step1_s = bench::Summarize(t1).median, stepn_s = bench::Summarize(tn).median;
  const double speedup = bench::Summarize(ratio).median;
  // Load-independent figures: CPU time of the whole threaded step (all
  // threads: the cost of splitting) and of its caller thread alone (with
  // even chunks, the critical path on an idle machine), against one thread.
  const double cpu1_s = bench::Summarize(cpu1).median, cpun_s = bench::Summarize(cpun).median;
  const double caller_s = bench::Summarize(caller_cpun).median;

  // mlp with tanh, and a wide & deep step.
  ModelSpec mlp;
  mlp.type = "layers";
  mlp.input_shape = {784};
  mlp.layers = {layer(LayerType::kDense, 512, 0, Activation::kTanh),
                layer(LayerType::kDense, 256, 0, Activation::kTanh),
                layer(LayerType::kDense, 10, 0, Activation::kLinear)};
  ModelSpec wd;
  wd.type = "layers";
  wd.input_shape = {13};
  wd.head = HeadType::kWideAndDeep;
  wd.num_classes = 2;
  wd.layers = {layer(LayerType::kDense, 256, 0, Activation::kRelu),
               layer(LayerType::kDense, 1, 0, Activation::kLinear)};
  for (const char* c : {"c0", "c1", "c2", "c3"}) {
    wd.sparse_inputs.push_back({c, 100000, 1});
    wd.embeddings.push_back({c, 32, Combiner::kMean});
    wd.wide.columns.push_back(c);
  }
  auto mlp_model = Model::Create(mlp);
  auto wd_model = Model::Create(wd);
  if (!mlp_model.ok() || !wd_model.ok()) {
    std::fprintf(stderr, "mlp/wide&deep: %s %s\n",
                 std::string(mlp_model.status().message()).c_str(),
                 std::string(wd_model.status().message()).c_str());
    return 1;
  }
  // Hand-off: a ParallelFor whose chunks each compute for 20 us, back to
  // back and after 50 us of caller-only work (as between the layers of a
  // step): the median time per call above 20 us is what waking the pool's
  // threads and waiting for them costs (20 us more: the caller ran a chunk
  // a thread did not take in time).
  auto handoff_us = [&](double gap_s) {
    ThreadPool pool(static_cast<int>(threads));
    std::vector<double> t;
    for (int i = 0; i < 1000; ++i) {
      const double g0 = NowSeconds();
      while (NowSeconds() - g0 < gap_s) {
      }
      const double t0 = NowSeconds();
      pool.ParallelFor(threads, [&](int64_t b, int64_t e) {
        const double c0 = NowSeconds();
        while (NowSeconds() - c0 < 20e-6 * static_cast<double>(e - b)) {
        }
      });
      t.push_back(NowSeconds() - t0);
    }
    return bench::Summarize(t).median * 1e6 - 20;
  };
  const double handoff_s = handoff_us(0), handoff_gap_s = handoff_us(50e-6);
  Alternated mlp_t, wd_t;
  {
    Model one = *mlp_model, many = *mlp_model;
    many.SetThreads(static_cast<int>(threads));
    Batch b;
    b.x = images.data();
    b.labels = labels.data();
    b.size = batch;
    mlp_t = Alternate(reps, one, many, one.InitialParams(7), b);
  }
  const int64_t wd_batch = 2048;
  {
    Model one = *wd_model, many = *wd_model;
    many.SetThreads(static_cast<int>(threads));
    RowMatrix x = Random(wd_batch, 13, &rng);
    std::vector<int64_t> ids(wd_batch * 4);
    std::uniform_int_distribution<int64_t> id(0, 99999);
    for (int64_t& i : ids) i = id(rng);
    std::vector<int32_t> y(wd_batch);
    for (int64_t i = 0; i < wd_batch; ++i) y[i] = static_cast<int32_t>(i % 2);
    // As a worker steps: compact lookups, and only the rows they touch.
    SparseBatch lookups = one.Lookups(ids.data(), wd_batch);
    const TableIds unique = CompactLookups(&lookups);
    Params params = one.InitialParams(7);
    for (size_t t = 0; t < one.tables().size(); ++t) {
      const int v = one.tables()[t];
      const int64_t dim = one.variables()[v].cols;
      std::vector<float> rows;
      for (int64_t i : unique[t]) {
        rows.insert(rows.end(), params[v].begin() + i * dim, params[v].begin() + (i + 1) * dim);
      }
      params[v] = std::move(rows);
    }
    Batch b;
    b.x = x.data();
    b.lookup_ids = ids.data();
    b.sparse = &lookups;
    b.labels = y.data();
    b.size = wd_batch;
    wd_t = Alternate(reps, one, many, params, b);
  }

  const double conv_gf = conv_flops / conv_s / 1e9, conv_ref = conv_flops / conv_gemm_s / 1e9;
  const double dense_gf = dense_flops / dense_s / 1e9, dense_ref = dense_flops / dense_gemm_s / 1e9;
  std::printf("conv 14x14x32->64 3x3 same, batch %lld: %.3f ms, %.2f GFLOP/s (plain GEMM %.2f)\n",
              static_cast<long long>(batch), conv_s * 1e3, conv_gf, conv_ref);
  std::printf("dense 3136->128 relu, batch %lld: %.3f ms, %.2f GFLOP/s (plain GEMM %.2f)\n",
              static_cast<long long>(batch), dense_s * 1e3, dense_gf, dense_ref);
  std::printf(
      "cnn step (fashion-mnist-cnn, batch %lld, one core): %.3f ms, %.0f examples/s; CPU time "
      "%.3f ms, %.0f examples per CPU second\n",
      static_cast<long long>(batch), step_s * 1e3, batch / step_s, step_cpu_s * 1e3,
      batch / step_cpu_s);
  std::printf(
      "cnn step, %lld threads vs 1 (alternating): %.3f ms vs %.3f ms, speedup %.2fx (median "
      "of per-round ratios)\n",
      static_cast<long long>(threads), stepn_s * 1e3, step1_s * 1e3, speedup);
  std::printf(
      "cnn step CPU time: 1 thread %.3f ms; %lld threads %.3f ms in all, %.3f ms on the caller "
      "(its ratio, a bound on the speedup on an idle machine, less the pool's spin: %.2fx)\n",
      cpu1_s * 1e3, static_cast<long long>(threads), cpun_s * 1e3, caller_s * 1e3,
      cpu1_s / caller_s);
  std::printf(
      "mlp 784-512-256-10 tanh step, batch %lld, %lld threads vs 1: %.3f ms vs %.3f ms, "
      "speedup %.2fx\n",
      static_cast<long long>(batch), static_cast<long long>(threads), mlp_t.msn, mlp_t.ms1,
      mlp_t.speedup);
  std::printf(
      "wide&deep step (4 columns, dim 32), batch %lld, %lld threads vs 1: %.3f ms vs "
      "%.3f ms, speedup %.2fx\n",
      static_cast<long long>(wd_batch), static_cast<long long>(threads), wd_t.msn, wd_t.ms1,
      wd_t.speedup);
  std::printf(
      "pool hand-off, %lld threads: %.1f us per call back to back, %.1f us after 50 us apart "
      "(above the 20 us a chunk computes)\n",
      static_cast<long long>(threads), handoff_s, handoff_gap_s);
  std::printf(
      "%s\n",
      absl::StrFormat(
          "conv_gflops=%.2f conv_gemm_gflops=%.2f conv_ratio=%.3f dense_gflops=%.2f "
          "dense_gemm_gflops=%.2f dense_ratio=%.3f cnn_step_ms=%.2f cnn_examples_per_s=%.0f "
          "cnn_step_cpu_ms=%.2f cnn_examples_per_cpu_s=%.0f threads=%lld "
          "cnn_step_1thread_ms=%.2f cnn_step_threads_ms=%.2f cnn_step_1thread_cpu_ms=%.2f "
          "cnn_step_threads_cpu_ms=%.2f cnn_step_threads_caller_cpu_ms=%.2f "
          "threads_cpu_speedup=%.3f threads_speedup=%.3f mlp_tanh_1thread_ms=%.2f "
          "mlp_tanh_threads_ms=%.2f mlp_tanh_threads_speedup=%.3f sparse_1thread_ms=%.2f "
          "sparse_threads_ms=%.2f sparse_threads_speedup=%.3f handoff_us=%.1f "
          "handoff_after_gap_us=%.1f",
          conv_gf, conv_ref, conv_gf / conv_ref, dense_gf, dense_ref, dense_gf / dense_ref,
          step_s * 1e3, batch / step_s, step_cpu_s * 1e3, batch / step_cpu_s,
          static_cast<long long>(threads), step1_s * 1e3, stepn_s * 1e3, cpu1_s * 1e3, cpun_s * 1e3,
          caller_s * 1e3, cpu1_s / caller_s, speedup, mlp_t.ms1, mlp_t.msn, mlp_t.speedup, wd_t.ms1,
          wd_t.msn, wd_t.speedup, handoff_s, handoff_gap_s)
          .c_str());
  return 0;
}

}  // namespace
}  // namespace kubetrain

int main(int argc, char** argv) {
  // malloc as in kubetrain-worker: the step's large buffers (im2col patches)
  // stay in the process instead of faulting in again every step.
  kubetrain::InitProcess(kubetrain::ProcessProfile::kTensorBuffers);
  return kubetrain::Main(argc, argv);
}
