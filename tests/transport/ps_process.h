// Test-only: a real kubetrain-ps process on a loopback port, started from a
// job file, for the tests (and the wire fuzzer) that need the real binary.
#ifndef KUBETRAIN_TESTS_TRANSPORT_PS_PROCESS_H_
#define KUBETRAIN_TESTS_TRANSPORT_PS_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace kubetrain {

// A free TCP port on 127.0.0.1 (free when asked; a race with other processes
// is possible but rare).
int FreePort();
// GET http://127.0.0.1:<port>/metrics, or "" if it cannot be read.
std::string ScrapeMetrics(int port);
// The value of the unlabelled sample `name` in Prometheus text, or -1.
double Metric(const std::string& text, const std::string& name);

// PS task 0 of a job whose spec is `job_yaml` with `num_workers` workers,
// run from `binary` (a runfiles path such as "ps/kubetrain-ps") with
// `extra_args` (e.g. --auth_dir=DIR). The job file goes to $TEST_TMPDIR
// (else /tmp). Killed (SIGKILL) when destroyed.
class PsProcess {
 public:
  PsProcess(const std::string& binary, const std::string& job_yaml, int num_workers,
            const std::vector<std::string>& extra_args = {});
  ~PsProcess();
  PsProcess(const PsProcess&) = delete;
  PsProcess& operator=(const PsProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }  // "127.0.0.1:port"
  int metrics_port() const { return metrics_port_; }
  // Whether the process is still running; if not, *how says how it ended
  // ("exit code 2", "signal 6").
  bool Running(std::string* how = nullptr);

 private:
  pid_t pid_ = 0;
  bool reaped_ = false;
  std::string how_;  // once reaped
  int metrics_port_ = 0;
  std::string address_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_TESTS_TRANSPORT_PS_PROCESS_H_
