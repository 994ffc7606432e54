#include "cli/console.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace kubetrain {

Console::Console(bool quiet, FILE* out, const Clock* clock)
    : quiet_(quiet), out_(out), tty_(::isatty(::fileno(out))), clock_(clock) {}

void Console::TaskLine(const std::string& task, const std::string& line) {
  if (quiet_) return;
  absl::MutexLock l(&mu_);
  Write(absl::StrCat("[", task, "] ", line, "\n"));
}

void Console::Info(const std::string& line) {
  absl::MutexLock l(&mu_);
  Write(line + "\n");
}

void Console::Status(const std::string& status) {
  absl::MutexLock l(&mu_);
  status_ = status;
  if (tty_) {
    const std::string s = "\r\033[K" + status_;
    std::fwrite(s.data(), 1, s.size(), out_);
  } else if (clock_->Now() - last_plain_ > absl::Seconds(5)) {
    last_plain_ = clock_->Now();
    const std::string s = status_ + "\n";
    std::fwrite(s.data(), 1, s.size(), out_);
  }
  std::fflush(out_);
}

void Console::EndStatus() {
  absl::MutexLock l(&mu_);
  if (tty_ && !status_.empty()) std::fputs("\n", out_);
  status_.clear();
}

void Console::Write(const std::string& text) {
  if (tty_ && !status_.empty()) std::fputs("\r\033[K", out_);
  std::fwrite(text.data(), 1, text.size(), out_);
  if (tty_ && !status_.empty()) std::fputs(status_.c_str(), out_);
  std::fflush(out_);
}

}  // namespace kubetrain
