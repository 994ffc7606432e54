// What `kubetrain run` shows: each task's log lines prefixed by the task
// ("[worker-1] ..."), launcher messages, and one progress line that stays at
// the bottom of a terminal (or is printed every few seconds when the output
// is not a terminal). Thread-safe: task lines arrive from reader threads.
#ifndef KUBETRAIN_CLI_CONSOLE_H_
#define KUBETRAIN_CLI_CONSOLE_H_

#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace kubetrain {

class Console {
 public:
  // Writes to `out` (not owned; a terminal gets the redrawn progress line).
  // `quiet`: task lines are dropped. `clock` paces the plain progress lines.
  Console(bool quiet, FILE* out, const Clock* clock);

  void TaskLine(const std::string& task, const std::string& line);
  void Info(const std::string& line);
  // Replaces the progress line.
  void Status(const std::string& status);
  // Ends the progress line (before the summary).
  void EndStatus();

 private:
  void Write(const std::string& text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const bool quiet_;
  FILE* const out_;
  const bool tty_;
  const Clock* const clock_;

  absl::Mutex mu_;
  std::string status_ ABSL_GUARDED_BY(mu_);
  absl::Time last_plain_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_CONSOLE_H_
