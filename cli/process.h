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
  std::vector<std::string> argv;              // argv[0] is the executable path
  std::map<std::string, std::string> env;     // added to (or replacing in) the parent's environment
};

class Process {
 public:
  // Called from a reader thread for every complete output line (without the
  // newline); `is_stderr` tells which stream. Must be thread-safe.
  using LineHandler = std::function<void(const std::string& line, bool is_stderr)>;

  static absl::StatusOr<std::unique_ptr<Process>> Start(const ProcessSpec& spec, LineHandler on_line);
  ~Process();  // kills (SIGKILL) a still-running child and joins the readers

  pid_t pid() const { return pid_; }
  // Exit code if the child has ended (128 + signal number if it was killed,
  // as a shell or Kubernetes reports it); nullopt while it runs. Non-blocking.
  std::optional<int> Poll();
  // Sends `sig` to the child's process group.
  void Signal(int sig);
  // Waits for the end and for all output to be delivered.
  int Wait();

 private:
  Process() = default;
  void JoinReaders();
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::vector<std::thread> readers_;
};

// `n` distinct TCP ports on 127.0.0.1 that were free a moment ago (all bound
// to port 0 at once, then released).
absl::StatusOr<std::vector<int>> PickFreePorts(int n);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_PROCESS_H_
