// One-line log records on stderr: "<UTC time> <message>". kubetrain run and
// kubectl logs add the task name; the message says what happened and why.
#ifndef KUBETRAIN_CORE_LOG_H_
#define KUBETRAIN_CORE_LOG_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/flags.h"

namespace kubetrain {

template <typename... Args>
void Log(const Args&... args) {
  std::string line = absl::StrCat(absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone()),
                                  args..., "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// Where Kubernetes reads a container's termination message from; the
// operator names it to the tasks it starts in $KUBETRAIN_TERMINATION_LOG,
// the default of their --termination_log flag (unset locally: a local
// machine may have a /dev/termination-log of its own).
inline constexpr char kTerminationLogPath[] = "/dev/termination-log";
inline constexpr char kTerminationLogEnv[] = "KUBETRAIN_TERMINATION_LOG";
// The most of a reason WriteTerminationReason writes (the kubelet keeps 4096
// bytes of a termination message).
inline constexpr size_t kMaxTerminationReason = 2048;

// Registers --termination_log on `parser`, defaulting `path` to
// $KUBETRAIN_TERMINATION_LOG (the tasks' shared flag for ExitWithError).
void AddTerminationLogFlag(FlagParser& parser, std::string* path);

// A task's fatal error, the one way a task's main() ends on one: logs
// "error: <reason>" and, when `termination_log` is not empty, writes the
// reason there as the container's termination message (WriteTerminationReason),
// so the operator can say which task failed and why in the TrainingJob's
// Restarting and Failed conditions. Returns `exit_code` (2 for a
// configuration error, 1 for a failed run): `return ExitWithError(2, ...)`.
int ExitWithError(int exit_code, absl::string_view reason, const std::string& termination_log);

// Replaces `path`'s contents with `reason` as one line (newlines become
// spaces; cut at kMaxTerminationReason bytes). A file that cannot be written
// is logged as a warning, nothing more (the task is ending anyway).
void WriteTerminationReason(const std::string& path, absl::string_view reason);

// Rate limit for a log line that a client can trigger at will (bad requests,
// refused updates): the first occurrence is logged, then at most one per
// `interval`; Allow says how many were not logged in between. Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval) : interval_(interval) {}
  // True if this occurrence (at `now`) is to be logged; then *suppressed is
  // the number of occurrences not logged since the last one that was.
  bool Allow(absl::Time now, int64_t* suppressed) {
    absl::MutexLock l(&mu_);
    if (logged_once_ && now - last_ < interval_) {
      ++suppressed_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  const absl::Duration interval_;
  absl::Mutex mu_;
  bool logged_once_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_LOG_H_
