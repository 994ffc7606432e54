#include "cli/run.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/process.h"
#include "core/cluster_spec.h"
#include "core/job_spec.h"
#include "core/task_config.h"

namespace kubetrain {
namespace {

constexpr char kProgressTag[] = "kubetrain-progress ";
constexpr char kResultTag[] = "kubetrain-result ";

// Task logs prefixed by task name, and one progress line that stays at the
// bottom of a terminal (or is printed every few seconds when not a terminal).
// Thread-safe.
class Console {
 public:
  explicit Console(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO)) {}

  void TaskLine(const std::string& task, const std::string& line) {
    if (quiet_) return;
    absl::MutexLock l(&mu_);
    Write(absl::StrCat("[", task, "] ", line, "\n"));
  }
  void Info(const std::string& line) {
    absl::MutexLock l(&mu_);
    Write(line + "\n");
  }
  void Status(const std::string& status) {
    absl::MutexLock l(&mu_);
    status_ = status;
    if (tty_) {
      std::string s = "\r\033[K" + status_;
      std::fwrite(s.data(), 1, s.size(), stderr);
    } else if (absl::Now() - last_plain_ > absl::Seconds(5)) {
      last_plain_ = absl::Now();
      std::string s = status_ + "\n";
      std::fwrite(s.data(), 1, s.size(), stderr);
    }
    std::fflush(stderr);
  }
  void EndStatus() {
    absl::MutexLock l(&mu_);
    if (tty_ && !status_.empty()) std::fputs("\n", stderr);
    status_.clear();
  }

 private:
  void Write(const std::string& text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (tty_ && !status_.empty()) std::fputs("\r\033[K", stderr);
    std::fwrite(text.data(), 1, text.size(), stderr);
    if (tty_ && !status_.empty()) std::fputs(status_.c_str(), stderr);
    std::fflush(stderr);
  }
  absl::Mutex mu_;
  const bool quiet_;
  const bool tty_;
  std::string status_ ABSL_GUARDED_BY(mu_);
  absl::Time last_plain_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

struct Task {
  std::string name;  // "ps-0", "worker-1"
  std::string type;
  int index = 0;
  int port = 0;
  int metrics_port = 0;
  RestartPolicy restart_policy = RestartPolicy::kNever;
  ProcessSpec spec;
  Process::LineHandler on_line;
  std::unique_ptr<Process> process;
  std::optional<int> exit_code;
  int restarts = 0;
  absl::Time restart_at = absl::InfiniteFuture();  // pending restart
};

// What the chief reports, parsed from its stdout.
struct ChiefReport {
  absl::Mutex mu;
  nlohmann::json progress ABSL_GUARDED_BY(mu);
  nlohmann::json result ABSL_GUARDED_BY(mu);
};

std::string ProgressText(const nlohmann::json& p) {
  if (p.is_null()) return "starting...";
  std::string s = absl::StrFormat("step %d/%d  loss %.4f  %.0f examples/s",
                                  p.value("global_step", 0), p.value("target_steps", 0),
                                  p.value("loss", 0.0), p.value("examples_per_second", 0.0));
  if (p.contains("accuracy")) absl::StrAppend(&s, absl::StrFormat("  accuracy %.4f", p["accuracy"].get<double>()));
  return s;
}

void StopAll(std::vector<Task>& tasks) {
  for (auto& t : tasks) {
    t.restart_at = absl::InfiniteFuture();
    if (t.process && !t.exit_code) t.process->Signal(SIGTERM);
  }
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (auto& t : tasks) {
    if (!t.process) continue;
    while (!t.exit_code && absl::Now() < deadline) {
      t.exit_code = t.process->Poll();
      if (!t.exit_code) absl::SleepFor(absl::Milliseconds(20));
    }
    if (!t.exit_code) t.process->Signal(SIGKILL);
    t.exit_code = t.process->Wait();
  }
}

}  // namespace

int RunJob(const RunOptions& options) {
  auto job = LoadTrainingJobFile(options.job_file);
  if (!job.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  auto train_examples = TrainExamples(job->training.dataset_name);
  if (!train_examples.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(train_examples.status().message()).c_str());
    return 2;
  }
  if (job->replica_specs.count("Chief") || job->replica_specs.count("Evaluator")) {
    std::fprintf(stderr, "error: %s: Chief and Evaluator replicas are not supported by kubetrain run yet; worker 0 is the chief\n",
                 options.job_file.c_str());
    return 2;
  }
  const int num_ps = job->num_ps(), num_workers = job->num_workers();
  const std::string ps_bin = options.bin_dir + "/kubetrain-ps";
  const std::string worker_bin = options.bin_dir + "/kubetrain-worker";
  for (const auto& bin : {ps_bin, worker_bin}) {
    if (::access(bin.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "error: cannot find %s (build with `make build`, or pass --bin-dir)\n", bin.c_str());
      return 2;
    }
  }
  char cwd[4096];
  std::string job_path = options.job_file;
  if (!job_path.empty() && job_path[0] != '/' && ::getcwd(cwd, sizeof(cwd))) {
    job_path = std::string(cwd) + "/" + job_path;
  }

  auto ports = PickFreePorts(2 * (num_ps + num_workers));
  if (!ports.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(ports.status().message()).c_str());
    return 1;
  }
  std::vector<Task> tasks;
  TfConfig tf;
  size_t next_port = 0;
  for (const auto& [type, count] : {std::pair<std::string, int>{"ps", num_ps}, {"worker", num_workers}}) {
    for (int i = 0; i < count; ++i) {
      Task t;
      t.type = type;
      t.index = i;
      t.name = absl::StrCat(type, "-", i);
      t.port = (*ports)[next_port++];
      t.metrics_port = (*ports)[next_port++];
      t.restart_policy = options.restart_policy.value_or(
          job->replica_specs.at(type == "ps" ? "PS" : "Worker").restart_policy);
      tf.cluster[type].push_back(absl::StrCat("127.0.0.1:", t.port));
      tasks.push_back(std::move(t));
    }
  }

  Console console(options.quiet);
  ChiefReport chief;
  const int64_t target = job->TargetSteps(*train_examples);
  console.Info(absl::StrCat("kubetrain run: ", job->name, " (", TrainingModeName(job->training.mode), ", ",
                            job->training.model.type, ", ", num_ps, " PS, ", num_workers, " workers, ",
                            target, " global steps)"));
  for (const auto& t : tasks) {
    console.Info(absl::StrCat("  ", t.name, ": grpc 127.0.0.1:", t.port,
                              "  metrics http://127.0.0.1:", t.metrics_port, "/metrics"));
  }

  const absl::Time start = absl::Now();
  for (auto& t : tasks) {
    TfConfig task_tf = tf;
    task_tf.task_type = t.type;
    task_tf.task_index = t.index;
    ProcessSpec spec;
    spec.argv = {t.type == "ps" ? ps_bin : worker_bin, "--config=" + job_path,
                 absl::StrCat("--metrics_address=127.0.0.1:", t.metrics_port)};
    if (t.type == "ps") spec.argv.push_back("--bind_host=127.0.0.1");
    if (t.type == "worker" && t.index == 0 && !options.export_model.empty()) {
      spec.argv.push_back("--export_model=" + options.export_model);
    }
    spec.env["TF_CONFIG"] = SerializeTfConfig(task_tf);
    t.spec = spec;
    const bool is_chief = t.type == "worker" && t.index == 0;
    std::string name = t.name;
    t.on_line = [&console, &chief, name, is_chief](const std::string& line, bool is_stderr) {
      if (is_chief && !is_stderr) {
        auto parse = [&](const char* tag, nlohmann::json ChiefReport::*field) {
          if (line.rfind(tag, 0) != 0) return false;
          auto j = nlohmann::json::parse(line.substr(std::strlen(tag)), nullptr, false);
          if (j.is_discarded()) return false;
          absl::MutexLock l(&chief.mu);
          chief.*field = j;
          return true;
        };
        if (parse(kProgressTag, &ChiefReport::progress) || parse(kResultTag, &ChiefReport::result)) return;
      }
      console.TaskLine(name, line);
    };
    auto p = Process::Start(t.spec, t.on_line);
    if (!p.ok()) {
      console.Info(absl::StrCat("error: starting ", t.name, ": ", p.status().message()));
      StopAll(tasks);
      return 1;
    }
    t.process = std::move(*p);
  }

  std::string status = "Running", reason;
  const auto& deadline_seconds = job->run_policy.active_deadline_seconds;
  const auto& backoff_limit = job->run_policy.backoff_limit;
  int total_restarts = 0;
  while (status == "Running") {
    absl::SleepFor(absl::Milliseconds(100));
    bool all_done = true;
    for (auto& t : tasks) {
      if (t.restart_at != absl::InfiniteFuture()) {  // waiting to be restarted
        all_done = false;
        if (absl::Now() < t.restart_at) continue;
        t.restart_at = absl::InfiniteFuture();
        t.process->Wait();  // deliver its last output first
        auto p = Process::Start(t.spec, t.on_line);
        if (!p.ok()) {
          status = "Failed";
          reason = absl::StrCat("restarting ", t.name, ": ", p.status().message());
          break;
        }
        t.process = std::move(*p);
        t.exit_code.reset();
        continue;
      }
      if (!t.exit_code) t.exit_code = t.process->Poll();
      if (!t.exit_code) {
        all_done = false;
        continue;
      }
      if (*t.exit_code == 0) continue;
      if (!IsRetryable(t.restart_policy, *t.exit_code)) {  // locally, Always acts as OnFailure
        status = "Failed";
        reason = absl::StrCat(t.name, " exited with code ", *t.exit_code, " (restartPolicy ",
                              RestartPolicyName(t.restart_policy), ")");
        break;
      }
      if (backoff_limit && total_restarts >= *backoff_limit) {
        status = "Failed";
        reason = absl::StrCat(t.name, " exited with code ", *t.exit_code, "; backoffLimit (",
                              *backoff_limit, " restarts) exceeded");
        break;
      }
      ++total_restarts;
      ++t.restarts;
      all_done = false;
      // Exponential backoff per task, as a kubelet does (but from 0.5 s, capped at 8 s).
      absl::Duration delay = absl::Milliseconds(500) * (1 << std::min(t.restarts - 1, 4));
      t.restart_at = absl::Now() + delay;
      console.Info(absl::StrCat("kubetrain run: ", t.name, " exited with code ", *t.exit_code,
                                "; restarting in ", absl::FormatDuration(delay), " (restart ",
                                t.restarts, ", restartPolicy ", RestartPolicyName(t.restart_policy), ")"));
    }
    if (status != "Running") break;
    if (all_done) {
      status = "Succeeded";
      break;
    }
    if (options.interrupted && options.interrupted->load()) {
      status = "Interrupted";
      reason = "stopped by signal";
    } else if (deadline_seconds && absl::Now() - start > absl::Seconds(*deadline_seconds)) {
      status = "Failed";
      reason = absl::StrCat("activeDeadlineSeconds (", *deadline_seconds, ") exceeded");
    }
    nlohmann::json progress;
    {
      absl::MutexLock l(&chief.mu);
      progress = chief.progress;
    }
    console.Status(absl::StrFormat("[%s %5.1fs] %s", job->name, absl::ToDoubleSeconds(absl::Now() - start),
                                   ProgressText(progress)));
  }
  if (status != "Succeeded") StopAll(tasks);
  for (auto& t : tasks) t.exit_code = t.process->Wait();  // all output delivered
  console.EndStatus();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  nlohmann::json result;
  {
    absl::MutexLock l(&chief.mu);
    result = chief.result;
  }
  if (status == "Succeeded" && result.is_null()) {
    status = "Failed";
    reason = "the chief (worker-0) exited without reporting a result";
  }
  nlohmann::json summary = {{"name", job->name},
                            {"status", status},
                            {"mode", TrainingModeName(job->training.mode)},
                            {"model", job->training.model.type},
                            {"ps", num_ps},
                            {"workers", num_workers},
                            {"target_steps", target},
                            {"wall_seconds", wall}};
  if (!reason.empty()) summary["reason"] = reason;
  for (const char* key : {"global_step", "test_accuracy", "final_loss", "examples_per_second",
                          "stale_gradients_dropped", "gradients_applied", "pushes_rejected",
                          "mean_staleness", "max_staleness", "barrier_timeouts", "restored_version",
                          "steps_lost", "ps_restarts_seen", "model_path"}) {
    if (result.is_object() && result.contains(key)) summary[key] = result[key];
  }
  if (result.is_object() && result.contains("wall_seconds")) summary["training_seconds"] = result["wall_seconds"];
  nlohmann::json exit_codes = nlohmann::json::object(), restarts = nlohmann::json::object();
  for (const auto& t : tasks) {
    exit_codes[t.name] = t.exit_code.value_or(-1);
    restarts[t.name] = t.restarts;
  }
  summary["exit_codes"] = exit_codes;
  summary["restarts"] = restarts;
  summary["total_restarts"] = total_restarts;

  std::string text = absl::StrCat("\nTrainingJob ", job->name, " ", status,
                                  absl::StrFormat(" in %.1f s", wall), reason.empty() ? "" : ": " + reason, "\n");
  if (summary.contains("global_step")) {
    absl::StrAppend(&text, absl::StrFormat(
        "  %s mode, %d PS, %d workers: global step %d/%d\n  test accuracy %.4f, final loss %.4f\n"
        "  %.0f examples/s, stale gradients dropped %d, task restarts %d\n",
        summary["mode"].get<std::string>(), num_ps, num_workers, summary["global_step"].get<int64_t>(),
        target, summary.value("test_accuracy", -1.0), summary.value("final_loss", 0.0),
        summary.value("examples_per_second", 0.0), summary.value("stale_gradients_dropped", int64_t{0}),
        total_restarts));
  }
  if (summary.contains("model_path") && !summary["model_path"].get<std::string>().empty()) {
    absl::StrAppend(&text, "  model: ", summary["model_path"].get<std::string>(), " (kubetrain eval ",
                    summary["model_path"].get<std::string>(), ")\n");
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  if (!options.summary_json.empty()) {
    std::ofstream out(options.summary_json);
    out << summary.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "error: cannot write %s\n", options.summary_json.c_str());
      return 1;
    }
  }
  if (status == "Succeeded") return 0;
  return status == "Interrupted" ? 130 : 1;
}

}  // namespace kubetrain
