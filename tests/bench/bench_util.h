// Helpers shared by the benchmarks in tests/bench: free loopback ports, a
// temporary directory, a real kubetrain-ps child process, timing summaries.
//
// Benchmarks print figures and never fail on a time; they exit non-zero only
// when something does not work at all (the PS does not start, an RPC fails).
#ifndef KUBETRAIN_TESTS_BENCH_BENCH_UTIL_H_
#define KUBETRAIN_TESTS_BENCH_BENCH_UTIL_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kubetrain {
namespace bench {

// Seconds on a monotonic clock.
inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds process `pid` (0: this one) has used, all its threads; -1 when
// the kernel does not say (the process is gone).
double ProcessCpuSeconds(pid_t pid = 0);

struct Summary {
  double min = 0, median = 0, max = 0;
};
Summary Summarize(std::vector<double> values);

// A port on 127.0.0.1 that was free a moment ago (bound to 0, then released).
absl::StatusOr<int> FreeLoopbackPort();

// mkdtemp under $TMPDIR (or /tmp); removed with its files by RemoveTree.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);
void RemoveTree(const std::string& dir);
absl::Status WriteFile(const std::string& path, const std::string& text);
std::string ReadFileOrEmpty(const std::string& path);

// TF_CONFIG JSON for 1 PS and 1 worker on 127.0.0.1.
std::string TfConfigJson(int ps_port, int worker_port, const std::string& task_type);
// TF_CONFIG JSON for one PS per port and 1 worker on 127.0.0.1; this task is
// `task_type`:`index`.
std::string TfConfigJson(const std::vector<int>& ps_ports, int worker_port,
                         const std::string& task_type, int index);

// One raw TCP transfer of `total` bytes over 127.0.0.1 in `write_size`
// writes (a sender and a receiver thread, a fresh connection). Returns the
// seconds from the first write to the receiver having read the last byte (the
// connection set-up is not counted). The bound every benchmark here compares
// kubetrain's transport with.
absl::StatusOr<double> TcpRound(uint64_t total, size_t write_size);

// `rounds` TcpRound(bytes, write_size): GB/s (1e9 bytes/s) of each round.
struct TcpBound {
  uint64_t bytes = 0;
  size_t write_size = 0;
  std::vector<double> gbps;  // one per round
  // The seconds of each round.
  std::vector<double> Seconds() const;
};
absl::StatusOr<TcpBound> MeasureTcpBound(uint64_t bytes, int rounds,
                                         size_t write_size = size_t{1} << 20);

// Default location of kubetrain-ps: $BUILD_WORKSPACE_DIRECTORY/bin (bazel run),
// else bin/ under the current directory.
std::string DefaultPsBinary();

// A kubetrain-ps child process. The destructor kills it if it still runs.
class PsProcess {
 public:
  PsProcess() = default;
  PsProcess(const PsProcess&) = delete;
  PsProcess& operator=(const PsProcess&) = delete;
  ~PsProcess();

  // Starts `binary --config=<job_file> --bind_host=127.0.0.1 --metrics_address=`
  // and `extra_args` (--insecure for a PS without --auth_dir: it refuses to
  // run open otherwise) with TF_CONFIG set, stdout+stderr to `log_path`; the
  // child gets SIGKILL if this process dies. Call before any other thread
  // (gRPC) exists.
  absl::Status Start(const std::string& binary, const std::string& job_file,
                     const std::string& tf_config, const std::string& log_path,
                     const std::vector<std::string>& extra_args = {});
  // Waits until 127.0.0.1:port accepts connections; fails at once if the
  // child exits first (the error carries its log).
  absl::Status WaitReady(int port, double timeout_seconds);
  // Waits up to timeout for the child to exit; kills it after that. Returns
  // its exit code (128+signal if killed by a signal, -1 if we had to kill it).
  int WaitOrKill(double timeout_seconds);
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

}  // namespace bench
}  // namespace kubetrain

#endif  // KUBETRAIN_TESTS_BENCH_BENCH_UTIL_H_
