#include "cli/fake_launcher.h"

#include <signal.h>

#include "core/cluster_spec.h"

namespace kubetrain {

class FakeLauncher::Child final : public ChildProcess {
 public:
  Child(std::shared_ptr<State> state, std::string task, LineHandler on_line)
      : state_(std::move(state)),
        task_(std::move(task)),
        on_line_(std::move(on_line)),
        started_(state_->clock->Now()) {}

  std::optional<int> Poll() override {
    if (exit_code_) return exit_code_;
    std::vector<std::string> lines;
    {
      absl::MutexLock l(&state_->mu);
      const absl::Time now = state_->clock->Now();
      auto range = state_->exits.equal_range(task_);
      for (auto it = range.first; it != range.second; ++it) {
        const auto [at, code] = it->second;
        if (at < started_ || at > now) continue;
        exit_code_ = code;
        state_->exits.erase(it);
        break;
      }
      if (!exit_code_) return std::nullopt;
      auto printed = state_->lines.equal_range({task_, *exit_code_});
      for (auto it = printed.first; it != printed.second; ++it) lines.push_back(it->second);
    }
    for (const auto& line : lines) on_line_(line, /*is_stderr=*/false);
    return exit_code_;
  }
  void Signal(int sig) override {
    if (Poll()) return;
    if (sig == SIGTERM) {
      std::optional<std::string> hold;
      {
        absl::MutexLock l(&state_->mu);
        auto it = state_->holds.find(task_);
        if (it != state_->holds.end()) hold = it->second;
      }
      if (hold && !holding_) {
        holding_ = true;
        on_line_(*hold, /*is_stderr=*/false);
        return;
      }
      if (hold) {
        exit_code_ = 1;
        return;
      }
    }
    exit_code_ = 128 + sig;
  }
  int Wait() override {
    if (!Poll()) exit_code_ = 128 + 9;  // nothing ends a fake by itself: as if killed
    return *exit_code_;
  }

 private:
  const std::shared_ptr<State> state_;
  const std::string task_;
  const LineHandler on_line_;
  const absl::Time started_;
  std::optional<int> exit_code_;
  bool holding_ = false;
};

void FakeLauncher::ExitAt(const std::string& task, absl::Time at, int exit_code) {
  absl::MutexLock l(&state_->mu);
  state_->exits.insert({task, {at, exit_code}});
}

void FakeLauncher::PrintOnExit(const std::string& task, int exit_code, const std::string& line) {
  absl::MutexLock l(&state_->mu);
  state_->lines.insert({{task, exit_code}, line});
}

void FakeLauncher::HoldOnSigterm(const std::string& task, const std::string& line) {
  absl::MutexLock l(&state_->mu);
  state_->holds[task] = line;
}

void FakeLauncher::FailNextStart(const std::string& task, absl::Status error) {
  absl::MutexLock l(&state_->mu);
  state_->failures[task] = std::move(error);
}

std::vector<FakeLauncher::Launch> FakeLauncher::starts() const {
  absl::MutexLock l(&state_->mu);
  return state_->starts;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> FakeLauncher::Start(const ProcessSpec& spec,
                                                                  LineHandler on_line) {
  std::string task = "?";
  auto env = spec.env.find("TF_CONFIG");
  if (env != spec.env.end()) {
    if (auto tf = ParseTfConfig(env->second); tf.ok())
      task = JobTask{tf->task_type, tf->task_index}.name();
  }
  {
    absl::MutexLock l(&state_->mu);
    auto failure = state_->failures.find(task);
    if (failure != state_->failures.end()) {
      absl::Status error = failure->second;
      state_->failures.erase(failure);
      return error;
    }
    state_->starts.push_back({task, state_->clock->Now(), spec});
  }
  return std::unique_ptr<ChildProcess>(new Child(state_, task, std::move(on_line)));
}

}  // namespace kubetrain
