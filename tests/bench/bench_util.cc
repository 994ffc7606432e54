#include "tests/bench/bench_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace kubetrain {
namespace bench {

double ProcessCpuSeconds(pid_t pid) {
  clockid_t clock = CLOCK_PROCESS_CPUTIME_ID;
  if (pid != 0 && clock_getcpuclockid(pid, &clock) != 0) return -1;
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

absl::StatusOr<int> FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(e)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/", prefix, "XXXXXX");
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", templ, ": ", std::strerror(errno)));
  }
  return std::string(buf.data());
}

void RemoveTree(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TfConfigJson(int ps_port, int worker_port, const std::string& task_type) {
  return TfConfigJson(std::vector<int>{ps_port}, worker_port, task_type, 0);
}

std::string TfConfigJson(const std::vector<int>& ps_ports, int worker_port,
                         const std::string& task_type, int index) {
  std::string ps;
  for (int port : ps_ports) absl::StrAppend(&ps, ps.empty() ? "" : ",", "\"127.0.0.1:", port, "\"");
  return absl::StrCat(R"({"cluster":{"ps":[)", ps, R"(],"worker":["127.0.0.1:)", worker_port,
                      R"("]},"task":{"type":")", task_type, R"(","index":)", index,
                      R"(},"environment":"cloud"})");
}

std::string DefaultPsBinary() {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return absl::StrCat(ws && *ws ? ws : ".", "/bin/kubetrain-ps");
}

absl::StatusOr<double> TcpRound(uint64_t total, size_t write_size) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(lfd, 1) != 0 || getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    if (lfd >= 0) close(lfd);
    return absl::InternalError(absl::StrCat("listen on 127.0.0.1: ", std::strerror(e)));
  }
  uint64_t received = 0;
  double end_time = 0;
  std::string recv_error;
  std::thread receiver([&] {
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) {
      recv_error = std::strerror(errno);
      return;
    }
    std::vector<char> buf(write_size);
    while (received < total) {
      ssize_t n = read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        recv_error = n == 0 ? "early EOF" : std::strerror(errno);
        break;
      }
      received += static_cast<uint64_t>(n);
    }
    end_time = NowSeconds();
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    shutdown(lfd, SHUT_RDWR);
    close(lfd);
    receiver.join();
    return absl::InternalError(absl::StrCat("connect: ", std::strerror(e)));
  }
  std::vector<char> data(write_size, 'k');
  const double start = NowSeconds();
  uint64_t sent = 0;
  std::string send_error;
  while (sent < total) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(write_size, total - sent));
    size_t off = 0;
    while (off < want) {
      ssize_t n = write(fd, data.data() + off, want - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        send_error = std::strerror(errno);
        break;
      }
      off += static_cast<size_t>(n);
    }
    if (!send_error.empty()) break;
    sent += want;
  }
  close(fd);
  receiver.join();
  close(lfd);
  if (!send_error.empty()) return absl::InternalError("tcp send: " + send_error);
  if (!recv_error.empty()) return absl::InternalError("tcp receive: " + recv_error);
  return end_time - start;
}

std::vector<double> TcpBound::Seconds() const {
  std::vector<double> out;
  for (double gbps : gbps) out.push_back(gbps > 0 ? bytes / (gbps * 1e9) : 0.0);
  return out;
}

absl::StatusOr<TcpBound> MeasureTcpBound(uint64_t bytes, int rounds, size_t write_size) {
  TcpBound out;
  out.bytes = bytes;
  out.write_size = write_size;
  for (int r = 0; r < std::max(1, rounds); ++r) {
    auto secs = TcpRound(bytes, write_size);
    if (!secs.ok()) return secs.status();
    out.gbps.push_back(*secs > 0 ? bytes / *secs / 1e9 : 0.0);
  }
  return out;
}

PsProcess::~PsProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status PsProcess::Start(const std::string& binary, const std::string& job_file,
                              const std::string& tf_config, const std::string& log_path,
                              const std::vector<std::string>& extra_args) {
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(binary, " is not an executable (run `make build`, or pass --ps_binary)"));
  }
  log_path_ = log_path;
  std::vector<std::string> args = {binary, "--config=" + job_file, "--bind_host=127.0.0.1",
                                   "--metrics_address="};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TF_CONFIG=", 10) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back("TF_CONFIG=" + tf_config);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0)
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(log_fd);
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status PsProcess::WaitReady(int port, double timeout_seconds) {
  const double deadline = NowSeconds() + timeout_seconds;
  while (true) {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("kubetrain-ps exited (status ", status,
                                                 ") before serving; its log:\n",
                                                 ReadFileOrEmpty(log_path_)));
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return absl::OkStatus();
    if (NowSeconds() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("kubetrain-ps not listening on port ", port,
                                                      " after ", timeout_seconds, " s; its log:\n",
                                                      ReadFileOrEmpty(log_path_)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int PsProcess::WaitOrKill(double timeout_seconds) {
  if (pid_ <= 0) return -1;
  const double deadline = NowSeconds() + timeout_seconds;
  int status = 0;
  while (NowSeconds() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

}  // namespace bench
}  // namespace kubetrain
