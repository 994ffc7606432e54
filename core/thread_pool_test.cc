#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// The chunks one ParallelFor call ran, sorted by begin.
Chunks RunChunks(ThreadPool* pool, int64_t n) {
  absl::Mutex mu;
  Chunks got;
  ParallelFor(pool, n, [&](int64_t begin, int64_t end) {
    absl::MutexLock l(&mu);
    got.emplace_back(begin, end);
  });
  std::sort(got.begin(), got.end());
  return got;
}

TEST(ThreadPoolTest, CoversEveryIndexOnceInDeterministicContiguousChunks) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {1, 2, 3, 5, 6, 7, 64, 100, 12544}) {
      std::vector<std::atomic<int>> hits(n);
      ParallelFor(&pool, n, [&](int64_t begin, int64_t end) {
        ASSERT_LT(begin, end);
        for (int64_t i = begin; i < end; ++i) ++hits[i];
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
      // The split is a function of (n, threads) only: the same on every call.
      const Chunks first = RunChunks(&pool, n);
      const int chunks = static_cast<int>(std::min<int64_t>(n, threads));
      ASSERT_EQ(first.size(), static_cast<size_t>(chunks));
      for (int c = 0; c < chunks; ++c) EXPECT_EQ(first[c], ChunkRange(n, chunks, c));
      for (int rep = 0; rep < 20; ++rep) ASSERT_EQ(RunChunks(&pool, n), first);
    }
  }
  EXPECT_EQ(ChunkRange(10, 3, 0), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(ChunkRange(10, 3, 1), std::make_pair(int64_t{3}, int64_t{6}));
  EXPECT_EQ(ChunkRange(10, 3, 2), std::make_pair(int64_t{6}, int64_t{10}));
}

TEST(ThreadPoolTest, OneThreadAndNoPoolRunInline) {
  ThreadPool one(1);
  for (ThreadPool* pool : {&one, static_cast<ThreadPool*>(nullptr)}) {
    std::vector<std::thread::id> ids;
    Chunks chunks;
    ParallelFor(pool, 17, [&](int64_t begin, int64_t end) {
      ids.push_back(std::this_thread::get_id());
      chunks.emplace_back(begin, end);
    });
    EXPECT_EQ(ids, std::vector<std::thread::id>{std::this_thread::get_id()});
    EXPECT_EQ(chunks, (Chunks{{0, 17}}));
    int calls = 0;
    ParallelFor(pool, 0, [&](int64_t, int64_t) { ++calls; });
    EXPECT_EQ(calls, 0);
  }
}

TEST(ThreadPoolTest, RunsChunksOnOtherThreadsWhileTheCallerRunsChunkZero) {
  ThreadPool pool(3);
  // Chunk 0 (the caller's) waits until chunks 1 and 2 have run: they can
  // only have run on the pool's threads.
  absl::Mutex mu;
  int others_done = 0;
  std::vector<std::pair<int64_t, std::thread::id>> by;
  ParallelFor(&pool, 3, [&](int64_t begin, int64_t) {
    absl::MutexLock l(&mu);
    by.emplace_back(begin, std::this_thread::get_id());
    if (begin == 0) {
      mu.Await(absl::Condition(
          +[](int* done) { return *done == 2; }, &others_done));
    } else {
      ++others_done;
    }
  });
  std::sort(by.begin(), by.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  ASSERT_EQ(by.size(), 3u);
  EXPECT_EQ(by[0].second, std::this_thread::get_id());
  EXPECT_NE(by[1].second, by[0].second);
  EXPECT_NE(by[2].second, by[0].second);
}

TEST(ThreadPoolTest, NestedAndConcurrentCallsRunTheSameChunks) {
  ThreadPool pool(2);
  // Nested: the inner call finds the pool busy and runs its chunks inline.
  std::atomic<int64_t> sum{0};
  Chunks inner_first;
  absl::Mutex mu;
  ParallelFor(&pool, 2, [&](int64_t, int64_t) {
    const Chunks inner = RunChunks(&pool, 9);
    absl::MutexLock l(&mu);
    EXPECT_EQ(inner, (Chunks{{0, 4}, {4, 9}}));
    sum += 1;
  });
  EXPECT_EQ(sum.load(), 2);
  // Concurrent callers: every call still covers its range in the same chunks.
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        if (RunChunks(&pool, 1000) != (Chunks{{0, 500}, {500, 1000}})) ++bad;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ThreadsFromCpuMaxTest, ParsesQuotaAndPeriod) {
  EXPECT_EQ(*ThreadsFromCpuMax("max 100000\n", 8), 8);
  EXPECT_EQ(*ThreadsFromCpuMax("max 100000", 0), 1);
  EXPECT_EQ(*ThreadsFromCpuMax("200000 100000\n", 8), 2);
  EXPECT_EQ(*ThreadsFromCpuMax("150000 100000", 8), 2);  // 1.5 CPUs: rounds up
  EXPECT_EQ(*ThreadsFromCpuMax("50000 100000", 8), 1);
  EXPECT_EQ(*ThreadsFromCpuMax("  400000   100000  ", 2), 4);  // the limit, not the machine
  for (const char* bad :
       {"", "max", "100000", "abc 100000", "200000 0", "-1 100000", "200000 100000 7", "max 0"}) {
    auto got = ThreadsFromCpuMax(bad, 8);
    EXPECT_FALSE(got.ok()) << bad;
    if (!got.ok()) {
      EXPECT_NE(got.status().message().find("cpu.max"), absl::string_view::npos);
    }
  }
}

TEST(ThreadsFromCpuMaxTest, ThisProcessGetsAtLeastOne) { EXPECT_GE(ThreadsFromCpuLimit(), 1); }

}  // namespace
}  // namespace kubetrain
