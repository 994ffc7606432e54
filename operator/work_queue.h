// A rate-limited work queue of job keys ("namespace/name"), as in client-go:
// a key is queued at most once; a key being processed is not handed to a
// second worker (a re-add while processing is deferred until Done); failures
// back off exponentially per key; AddAfter queues a key at a time (deadlines,
// TTL). Thread-safe.
#ifndef KUBETRAIN_OPERATOR_WORK_QUEUE_H_
#define KUBETRAIN_OPERATOR_WORK_QUEUE_H_

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace kubetrain {

class WorkQueue {
 public:
  explicit WorkQueue(const Clock* clock, absl::Duration base_backoff = absl::Milliseconds(100),
                     absl::Duration max_backoff = absl::Seconds(30))
      : clock_(clock), base_backoff_(base_backoff), max_backoff_(max_backoff) {}

  void Add(const std::string& key) { AddAt(key, clock_->Now()); }
  void AddAfter(const std::string& key, absl::Duration delay) { AddAt(key, clock_->Now() + delay); }

  // Re-queues after this key's next backoff (100 ms, 200 ms, ... up to 30 s).
  void AddRateLimited(const std::string& key) {
    absl::Duration delay;
    {
      absl::MutexLock l(&mu_);
      int n = failures_[key]++;
      delay = std::min(max_backoff_, base_backoff_ * (1 << std::min(n, 20)));
    }
    AddAfter(key, delay);
  }
  // The key succeeded: reset its backoff.
  void Forget(const std::string& key) {
    absl::MutexLock l(&mu_);
    failures_.erase(key);
  }

  // Blocks until a key is due (or Shutdown). The caller must call Done(key).
  std::optional<std::string> Get() {
    absl::MutexLock l(&mu_);
    while (true) {
      if (shutdown_) return std::nullopt;
      absl::Time now = clock_->Now();
      absl::Time next = absl::InfiniteFuture();
      for (auto it = due_.begin(); it != due_.end(); ++it) {
        if (processing_.count(it->first)) continue;
        if (it->second <= now) {
          std::string key = it->first;  // copy before the node goes
          due_.erase(it);
          processing_.insert(key);
          return key;
        }
        next = std::min(next, it->second);
      }
      // Wake up for the earliest due key (real time; the clock is for tests).
      mu_.AwaitWithTimeout(absl::Condition(&changed_),
                           std::min(next - now, absl::Milliseconds(200)));
      changed_ = false;
    }
  }

  void Done(const std::string& key) {
    absl::MutexLock l(&mu_);
    processing_.erase(key);
    changed_ = true;
  }

  void Shutdown() {
    absl::MutexLock l(&mu_);
    shutdown_ = true;
    changed_ = true;
  }

  // Keys waiting (due or not), for the queue-depth metric.
  size_t Depth() const {
    absl::MutexLock l(&mu_);
    return due_.size();
  }

 private:
  void AddAt(const std::string& key, absl::Time at) {
    absl::MutexLock l(&mu_);
    auto it = due_.find(key);
    if (it == due_.end() || at < it->second) due_[key] = at;  // the earliest request wins
    changed_ = true;
  }

  const Clock* const clock_;
  const absl::Duration base_backoff_, max_backoff_;
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Time> due_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> processing_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_WORK_QUEUE_H_
