// A small fixed pool of threads that a worker computes a training step on
// (core/layers.h, core/model.h), and how many threads a task gets.
//
// ParallelFor splits [0, n) into contiguous chunks that are a function of
// (n, threads) only (no dynamic sizes, no splitting of a chunk): chunk c of
// k = min(n, threads) is [c*n/k, (c+1)*n/k). A kernel that computes each
// output element within one chunk therefore gives the same bits on every
// run with the same thread count, whichever thread runs which chunk.
//
// The caller runs chunk 0; the others are claimed whole, in order, by
// whichever thread is free first, the caller included: on a loaded machine
// a pool thread that is not scheduled in time leaves its chunk to the
// caller instead of stalling it (the result is the same; only the speed
// changes).
//
// Waiting: a pool thread that finished its chunks spins for a short while
// (kSpinMicros, yielding the core to any other runnable thread on each
// turn) before it sleeps, and so does the caller waiting for the last
// chunk: a step calls ParallelFor layer after layer with little serial
// work between, and waking a sleeping thread costs tens of microseconds
// each time (more on a busy machine). The spin reads hints only; who runs
// what is still decided under the mutex, so spinning changes no result.
//
// Thread safety: ParallelFor may be called from any number of threads at
// once, and from inside a chunk. One call at a time uses the pool; a call
// that finds it busy (a concurrent or nested one) runs the same chunks
// itself, in order, so its results do not change, only its speed.
#ifndef KUBETRAIN_CORE_THREAD_POOL_H_
#define KUBETRAIN_CORE_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kubetrain {

// A chunk [begin, end) of [0, n) (begin < end).
using ChunkFn = std::function<void(int64_t begin, int64_t end)>;

// [begin, end) of chunk c of [0, n) split into `chunks` (REQUIRES:
// 1 <= chunks <= n, 0 <= c < chunks).
std::pair<int64_t, int64_t> ChunkRange(int64_t n, int chunks, int c);

class ThreadPool {
 public:
  // threads >= 1: the caller of ParallelFor plus threads - 1 started here.
  explicit ThreadPool(int threads);
  ~ThreadPool();  // joins the threads
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // How long a waiting thread spins before it sleeps.
  static constexpr int kSpinMicros = 50;

  // Calls fn once per chunk of [0, n) (see above; nothing for n <= 0) and
  // returns when all have returned. With one thread, fn(0, n) runs inline.
  // fn must not throw.
  void ParallelFor(int64_t n, const ChunkFn& fn);

 private:
  void Loop(int index);

  const int threads_;
  std::vector<std::thread> workers_;
  // Held by the one ParallelFor that uses the threads (TryLock: others run
  // inline rather than wait, so nested calls cannot deadlock).
  absl::Mutex use_mu_;
  absl::Mutex mu_;
  // Claims the next chunk of the current job into *c; false if none is left.
  bool Claim(int* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The current job: a new generation wakes the threads. fn_ stays valid
  // while a chunk is unfinished: the caller returns once done_ == chunks_.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  const ChunkFn* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int next_ ABSL_GUARDED_BY(mu_) = 0;  // the first unclaimed chunk
  int done_ ABSL_GUARDED_BY(mu_) = 0;  // chunks finished
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Copies of generation_ and done_ written under mu_ and read without it
  // while spinning (hints: a waiter still checks the real ones under mu_).
  std::atomic<uint64_t> posted_{0};
  std::atomic<int> finished_{0};
};

// ParallelFor on `pool`, or fn(0, n) inline when pool is null (n > 0).
void ParallelFor(ThreadPool* pool, int64_t n, const ChunkFn& fn);

// Threads a CPU limit allows, from the text of cgroup v2's cpu.max
// ("max 100000": no limit -> hardware_threads; "200000 100000" -> 2;
// fractions round up, at least 1). InvalidArgumentError if malformed.
absl::StatusOr<int> ThreadsFromCpuMax(const std::string& cpu_max, int hardware_threads);

// Threads for this process: its cgroup's CPU limit (/sys/fs/cgroup/cpu.max,
// else cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us), else the
// machine's hardware threads; at least 1.
int ThreadsFromCpuLimit();

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_THREAD_POOL_H_
