#include "tests/transport/ps_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace kubetrain {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string ScrapeMetrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

double Metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

PsProcess::PsProcess(const std::string& binary, const std::string& job_yaml, int num_workers,
                     const std::vector<std::string>& extra_args) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const int port = FreePort();
  metrics_port_ = FreePort();
  address_ = absl::StrCat("127.0.0.1:", port);
  const std::string job = absl::StrCat(tmp ? tmp : "/tmp", "/ps-", port, ".yaml");
  std::ofstream(job) << job_yaml;
  std::string workers;
  for (int w = 0; w < num_workers; ++w) {
    absl::StrAppend(&workers, w > 0 ? ", " : "", "\"127.0.0.1:", w + 1, "\"");
  }
  const std::string tf_config =
      absl::StrCat("TF_CONFIG={\"cluster\": {\"ps\": [\"", address_, "\"], \"worker\": [", workers,
                   "]}, \"task\": {\"type\": \"ps\", \"index\": 0}}");
  std::vector<std::string> args = {binary, "--config=" + job, "--bind_host=127.0.0.1",
                                   absl::StrCat("--metrics_address=127.0.0.1:", metrics_port_)};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {tf_config};
  for (char** e = environ; *e; ++e) {
    if (std::string(*e).rfind("TF_CONFIG=", 0) != 0) env_strings.push_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) pid_ = 0;
}

PsProcess::~PsProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool PsProcess::Running(std::string* how) {
  if (pid_ <= 0) {
    if (how != nullptr) *how = "not started";
    return false;
  }
  int status = 0;
  if (!reaped_) {
    if (waitpid(pid_, &status, WNOHANG) == 0) return true;
    reaped_ = true;
    how_ = WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                               : absl::StrCat("exit code ", WEXITSTATUS(status));
  }
  if (how != nullptr) *how = how_;
  return false;
}

}  // namespace kubetrain
