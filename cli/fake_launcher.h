// Test-only: processes that exist only on a FakeClock. Each start is
// recorded; a task (named "worker-1", from its TF_CONFIG) ends when the test
// scheduled it to, printing scheduled lines first; a signal ends it at once
// (128 + signal, as a shell reports it) unless it holds on SIGTERM.
#ifndef KUBETRAIN_CLI_FAKE_LAUNCHER_H_
#define KUBETRAIN_CLI_FAKE_LAUNCHER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/process.h"
#include "core/clock.h"

namespace kubetrain {

class FakeLauncher final : public ProcessLauncher {
 public:
  struct Launch {
    std::string task;  // "worker-1"
    absl::Time at;
    ProcessSpec spec;
  };

  explicit FakeLauncher(const Clock* clock) : state_(std::make_shared<State>()) {
    state_->clock = clock;
  }

  // The run of `task` that is alive at `at` ends then with `exit_code`.
  void ExitAt(const std::string& task, absl::Time at, int exit_code);
  // `line` goes to the task's stdout whenever it exits with `exit_code`
  // (e.g. the chief's "kubetrain-result {...}").
  void PrintOnExit(const std::string& task, int exit_code, const std::string& line);
  // The first SIGTERM to `task` does not end it: it prints `line` (a PS that
  // holds its parameters); a second one ends it with exit code 1.
  void HoldOnSigterm(const std::string& task, const std::string& line);
  // The next start of `task` fails with `error`.
  void FailNextStart(const std::string& task, absl::Status error);
  std::vector<Launch> starts() const;

  absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ProcessSpec& spec,
                                                      LineHandler on_line) override;

 private:
  struct State {
    const Clock* clock = nullptr;
    mutable absl::Mutex mu;
    std::multimap<std::string, std::pair<absl::Time, int>> exits ABSL_GUARDED_BY(mu);
    std::multimap<std::pair<std::string, int>, std::string> lines ABSL_GUARDED_BY(mu);
    std::map<std::string, absl::Status> failures ABSL_GUARDED_BY(mu);
    std::map<std::string, std::string> holds ABSL_GUARDED_BY(mu);
    std::vector<FakeLauncher::Launch> starts ABSL_GUARDED_BY(mu);
  };
  class Child;
  std::shared_ptr<State> state_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_FAKE_LAUNCHER_H_
