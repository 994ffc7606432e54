// A token bucket (client-go's flowcontrol.NewTokenBucketRateLimiter): `qps`
// tokens a second, at most `burst` saved up. Reserve() takes one token and
// says how long the caller must wait for it; callers wait in turn (a token
// reserved is never given to another). qps <= 0 means no limit. Thread-safe.
#ifndef KUBETRAIN_OPERATOR_RATE_LIMITER_H_
#define KUBETRAIN_OPERATOR_RATE_LIMITER_H_

#include <algorithm>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace kubetrain {

class TokenBucket {
 public:
  // `clock` must outlive the bucket. REQUIRES: burst >= 1 when qps > 0.
  TokenBucket(const Clock* clock, double qps, int burst)
      : clock_(clock), qps_(qps), burst_(std::max(1, burst)), tokens_(burst_), at_(clock->Now()) {}

  // Takes a token; returns how long to wait before using it (zero if one was saved up).
  absl::Duration Reserve() {
    if (qps_ <= 0) return absl::ZeroDuration();
    absl::MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    if (now > at_) {
      tokens_ = std::min<double>(burst_, tokens_ + absl::ToDoubleSeconds(now - at_) * qps_);
      at_ = now;
    }
    tokens_ -= 1;  // may go negative: later callers queue behind this one
    return tokens_ >= 0 ? absl::ZeroDuration() : absl::Seconds(-tokens_ / qps_);
  }
  // Reserve() and sleep (on the clock) until the token is due; returns the wait.
  absl::Duration Wait() {
    const absl::Duration d = Reserve();
    if (d > absl::ZeroDuration()) clock_->SleepFor(d);
    return d;
  }
  double qps() const { return qps_; }
  int burst() const { return burst_; }

 private:
  // Constant after construction.
  const Clock* const clock_;
  const double qps_;
  const int burst_;

  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_RATE_LIMITER_H_
