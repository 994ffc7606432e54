// A child process with its output delivered line by line: the launcher under
// `kubetrain run` (and, later, the test node agent).
//
// Each child runs in its own process group (so a terminal's Ctrl-C reaches
// only the launcher, which then stops its children in order) and dies with
// its parent (PR_SET_PDEATHSIG), so no task outlives a killed launcher.
#ifndef KUBETRAIN_CLI_PROCESS_H_
#define KUBETRAIN_CLI_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace kubetrain {

struct ProcessSpec {
  std::vector<std::string> argv;           // argv[0] is the executable path
  std::map<std::string, std::string> env;  // added to (or replacing in) the parent's environment
};

// Called from a reader thread for every complete output line (without the
// newline); `is_stderr` tells which stream. Must be thread-safe.
using LineHandler = std::function<void(const std::string& line, bool is_stderr)>;

// A started child, as a launcher's user sees it (the seam that lets
// `kubetrain run`'s JobRunner be tested with fake processes).
class ChildProcess {
 public:
  virtual ~ChildProcess() = default;
  // Exit code if the child has ended (128 + signal number if it was killed,
  // as a shell or Kubernetes reports it); nullopt while it runs. Non-blocking.
  virtual std::optional<int> Poll() = 0;
  // Sends `sig` to the child's process group.
  virtual void Signal(int sig) = 0;
  // Waits for the end and for all output to be delivered.
  virtual int Wait() = 0;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  virtual absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ProcessSpec& spec,
                                                              LineHandler on_line) = 0;
};

class Process final : public ChildProcess {
 public:
  using LineHandler = ::kubetrain::LineHandler;

  static absl::StatusOr<std::unique_ptr<Process>> Start(const ProcessSpec& spec,
                                                        LineHandler on_line);
  ~Process() override;  // kills (SIGKILL) a still-running child and joins the readers

  pid_t pid() const { return pid_; }
  std::optional<int> Poll() override;
  void Signal(int sig) override;
  int Wait() override;

 private:
  Process() = default;
  void JoinReaders();
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::vector<std::thread> readers_;
};

// Starts real processes (Process::Start).
class SubprocessLauncher final : public ProcessLauncher {
 public:
  absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ProcessSpec& spec,
                                                      LineHandler on_line) override;
};

// `n` distinct TCP ports on 127.0.0.1 that were free a moment ago (all bound
// to port 0 at once, then released).
absl::StatusOr<std::vector<int>> PickFreePorts(int n);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_PROCESS_H_
