#include "cli/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace kubetrain {
namespace {

void ReadLines(int fd, bool is_stderr, Process::LineHandler on_line) {
  std::string pending;
  char buf[8192];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = pending.find('\n', start)) != std::string::npos) {
      on_line(pending.substr(start, nl - start), is_stderr);
      start = nl + 1;
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) on_line(pending, is_stderr);
  ::close(fd);
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const ProcessSpec& spec,
                                                        LineHandler on_line) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty command");
  if (::access(spec.argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot execute ", spec.argv[0], ": ", std::strerror(errno)));
  }
  // Build argv/envp before fork: the child may only call async-signal-safe functions.
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::InternalError("pipe failed");
  }
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so Signal() works at once
  ::close(out[1]);
  ::close(err[1]);
  std::unique_ptr<Process> p(new Process());
  p->pid_ = pid;
  p->readers_.emplace_back(ReadLines, out[0], false, on_line);
  p->readers_.emplace_back(ReadLines, err[0], true, on_line);
  return p;
}

Process::~Process() {
  if (!exit_code_.has_value() && pid_ > 0) {
    Signal(SIGKILL);
    Wait();
  }
  JoinReaders();
}

std::optional<int> Process::Poll() {
  if (exit_code_.has_value()) return exit_code_;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_code_ = DecodeWaitStatus(status);
  return exit_code_;
}

void Process::Signal(int sig) {
  if (!exit_code_.has_value() && pid_ > 0) ::kill(-pid_, sig);
}

int Process::Wait() {
  while (!exit_code_.has_value()) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, 0);
    if (r == pid_) {
      exit_code_ = DecodeWaitStatus(status);
    } else if (r < 0 && errno != EINTR) {
      exit_code_ = 255;
    }
  }
  JoinReaders();
  return *exit_code_;
}

void Process::JoinReaders() {
  for (auto& t : readers_) {
    if (t.joinable()) t.join();
  }
}

absl::StatusOr<std::unique_ptr<ChildProcess>> SubprocessLauncher::Start(const ProcessSpec& spec,
                                                                        LineHandler on_line) {
  auto p = Process::Start(spec, std::move(on_line));
  if (!p.ok()) return p.status();
  return std::unique_ptr<ChildProcess>(std::move(*p));
}

absl::StatusOr<std::vector<int>> PickFreePorts(int n) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < n && status.ok(); ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::InternalError("socket failed");
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::UnavailableError("cannot find a free port on 127.0.0.1");
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
  }
  for (int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

}  // namespace kubetrain
