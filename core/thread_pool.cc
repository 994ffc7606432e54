#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kubetrain {

std::pair<int64_t, int64_t> ChunkRange(int64_t n, int chunks, int c) {
  // n * c stays far from overflow: n is a row or element count of one batch.
  return {n * c / chunks, n * (c + 1) / chunks};
}

namespace {

// Spins until done() or kSpinMicros have passed.
template <typename Done>
void SpinUntil(Done done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::microseconds(ThreadPool::kSpinMicros);
  while (!done()) {
    std::this_thread::yield();
    if (std::chrono::steady_clock::now() >= deadline) return;
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) : threads_(std::max(threads, 1)) {
  workers_.reserve(threads_ - 1);
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { Loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::Claim(int* c) {
  if (fn_ == nullptr || next_ >= chunks_) return false;
  *c = next_++;
  return true;
}

void ThreadPool::Loop(int /*index*/) {
  uint64_t seen = 0;
  auto ready = [this, &seen]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
  absl::MutexLock l(&mu_);
  while (true) {
    if (!ready()) {
      mu_.Unlock();
      SpinUntil([&] { return posted_.load(std::memory_order_acquire) != seen; });
      mu_.Lock();
    }
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    seen = generation_;
    int c = 0;
    while (Claim(&c)) {
      const ChunkFn* fn = fn_;
      const auto [begin, end] = ChunkRange(n_, chunks_, c);
      mu_.Unlock();
      (*fn)(begin, end);
      mu_.Lock();
      finished_.store(++done_, std::memory_order_release);
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const ChunkFn& fn) {
  if (n <= 0) return;
  const int chunks = static_cast<int>(std::min<int64_t>(n, threads_));
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  if (!use_mu_.TryLock()) {
    // Busy (another caller, or a call from inside a chunk): the same chunks
    // here, in order, give the same results.
    for (int c = 0; c < chunks; ++c) {
      const auto [begin, end] = ChunkRange(n, chunks, c);
      fn(begin, end);
    }
    return;
  }
  {
    absl::MutexLock l(&mu_);
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    next_ = 1;  // chunk 0 is the caller's
    done_ = 0;
    finished_.store(0, std::memory_order_relaxed);
    posted_.store(++generation_, std::memory_order_release);
  }
  int c = 0;
  while (true) {
    const auto [begin, end] = ChunkRange(n, chunks, c);
    fn(begin, end);
    absl::MutexLock l(&mu_);
    finished_.store(++done_, std::memory_order_release);
    if (!Claim(&c)) break;
  }
  SpinUntil([&] { return finished_.load(std::memory_order_acquire) == chunks; });
  {
    auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == chunks_; };
    absl::MutexLock l(&mu_, absl::Condition(&finished));
    fn_ = nullptr;
  }
  use_mu_.Unlock();
}

void ParallelFor(ThreadPool* pool, int64_t n, const ChunkFn& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else if (n > 0) {
    fn(0, n);
  }
}

absl::StatusOr<int> ThreadsFromCpuMax(const std::string& cpu_max, int hardware_threads) {
  const int unlimited = std::max(hardware_threads, 1);
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (fields.size() == 2 && fields[0] == "max" && absl::SimpleAtoi(fields[1], &period) &&
      period > 0) {
    return unlimited;
  }
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period) || quota <= 0 || period <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu.max: want \"<quota> <period>\" or \"max <period>\", got \"",
                     absl::StripAsciiWhitespace(cpu_max), "\""));
  }
  // A fractional limit (1.5 CPUs) still gets a thread for its fraction.
  return static_cast<int>(std::max<int64_t>((quota + period - 1) / period, 1));
}

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

}  // namespace

int ThreadsFromCpuLimit() {
  const int hardware = std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
  std::string text;
  if (ReadFile("/sys/fs/cgroup/cpu.max", &text)) {
    auto threads = ThreadsFromCpuMax(text, hardware);
    if (threads.ok()) return *threads;
  }
  // cgroup v1: a quota of -1 is no limit.
  std::string quota, period;
  if (ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &quota) &&
      ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us", &period)) {
    const std::string q(absl::StripAsciiWhitespace(quota));
    auto threads = ThreadsFromCpuMax(
        absl::StrCat(q == "-1" ? "max" : q, " ", absl::StripAsciiWhitespace(period)), hardware);
    if (threads.ok()) return *threads;
  }
  return hardware;
}

}  // namespace kubetrain
