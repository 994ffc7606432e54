// Time source, injected so that waits, deadlines and timeouts can be tested
// without sleeping. Code that waits for a while (retry backoff, polling,
// cadences) sleeps through the clock too, so that on a FakeClock it does not
// wait at all.
#ifndef KUBETRAIN_CORE_CLOCK_H_
#define KUBETRAIN_CORE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kubetrain {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks the calling thread for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) const override { absl::SleepFor(d); }
};

// A clock that only moves when told to (Advance) or slept on: SleepFor(d)
// moves it forward by d at once and returns, so a retry loop or a poll runs
// through its waits without waiting, and its deadlines still pass. Other
// threads see the time jump. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void SleepFor(absl::Duration d) const override {
    {
      absl::MutexLock l(&mu_);
      if (d > absl::ZeroDuration()) now_ += d;
    }
    // A polling loop on a fake clock must not starve the threads it waits for.
    absl::SleepFor(absl::Microseconds(50));
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_CLOCK_H_
