#include "cli/job_runner.h"

#include <signal.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/export.h"
#include "core/job_credentials.h"

namespace kubetrain {

struct JobRunner::Task {
  JobTask id;
  std::string name;     // "worker-1"
  std::string address;  // its TF_CONFIG address
  int metrics_port = 0;
  ProcessSpec spec;
  LineHandler on_line;
  std::unique_ptr<ChildProcess> process;
  TaskState state;         // what the lifecycle sees
  bool announced = false;  // this failure's restart was announced
};

namespace {

std::string ProgressText(const std::optional<Progress>& p) {
  if (!p) return "starting...";
  std::string s =
      absl::StrFormat("step %d/%d  loss %.4f  %.0f examples/s", p->global_step, p->target_steps,
                      p->loss.value_or(0), p->examples_per_second.value_or(0));
  if (p->accuracy) absl::StrAppend(&s, absl::StrFormat("  accuracy %.4f", *p->accuracy));
  if (p->absent_workers > 0) absl::StrAppend(&s, "  absent workers ", p->absent_workers);
  if (p->checkpoint_failures > 0) {
    absl::StrAppend(&s, "  checkpoint failures ", p->checkpoint_failures,
                    p->checkpoints_failing > 0 ? " (failing now)" : "");
  }
  return s;
}

// The launcher's words for why the lifecycle failed the job.
std::string FailureReason(const Failure& f) {
  switch (f.kind) {
    case FailureKind::kTaskFailed:
      return absl::StrCat(f.task.name(), " exited with code ", f.exit_code, " (restartPolicy ",
                          RestartPolicyName(f.policy), ")");
    case FailureKind::kBackoffLimitExceeded:
      return absl::StrCat(f.task.name(), " exited with code ", f.exit_code, "; backoffLimit (",
                          f.backoff_limit, " restarts) exceeded");
    case FailureKind::kDeadlineExceeded:
      return absl::StrCat("activeDeadlineSeconds (", f.deadline_seconds, ") exceeded");
    case FailureKind::kNone:
      break;
  }
  return "";
}

}  // namespace

Progress JobRunResult::LastKnown() const {
  if (result) return FinalProgress(*result);
  return progress.value_or(Progress{});
}

int JobRunResult::ExitCode() const {
  if (status == "Succeeded") return 0;
  return status == "Interrupted" ? 130 : 1;
}

JobRunner::JobRunner(TrainingJob job, int64_t target_steps, std::vector<int> ports,
                     JobRunnerOptions options, JobRunnerEnv env)
    : job_(std::move(job)),
      target_steps_(target_steps),
      options_(std::move(options)),
      env_(std::move(env)) {
  const std::vector<JobTask> ids = JobTasks(job_);
  auto address = [&](const JobTask& id) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == id) return absl::StrCat("127.0.0.1:", ports.at(2 * i));
    }
    return std::string();
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    auto t = std::make_unique<Task>();
    t->id = ids[i];
    t->name = ids[i].name();
    t->address = address(ids[i]);
    t->metrics_port = ports.at(2 * i + 1);
    t->state.task = ids[i];
    const bool ps = t->id.type == "ps";
    const bool chief = job_.IsChiefTask(t->id.type, t->id.index);
    t->spec.argv = {ps ? options_.ps_binary : options_.worker_binary,
                    "--config=" + options_.job_path,
                    absl::StrCat("--metrics_address=127.0.0.1:", t->metrics_port)};
    if (ps) t->spec.argv.push_back("--bind_host=127.0.0.1");
    if (ps && options_.bulk_data_plane) t->spec.argv.push_back("--bulk_port=0");
    if (chief && !options_.export_model.empty()) {
      t->spec.argv.push_back("--export_model=" + options_.export_model);
    }
    t->spec.env["TF_CONFIG"] = SerializeTfConfig(BuildTfConfig(job_, address, t->id));
    if (auto dir = options_.auth_dirs.find(t->name); dir != options_.auth_dirs.end()) {
      t->spec.env[kAuthDirEnv] = dir->second;
    }
    t->on_line = [this, name = t->name, chief, ps](const std::string& line, bool is_stderr) {
      if (chief && !is_stderr) {
        if (auto report = ParseReportLine(line)) {
          absl::MutexLock l(&report_mu_);
          if (report->progress) progress_ = report->progress;
          if (report->result) result_ = report->result;
          return;
        }
      }
      if (ps && line.find(kHoldingParametersNote) != std::string::npos) {
        absl::MutexLock l(&report_mu_);
        holding_.insert(name);
      }
      if (size_t at = line.find("error: "); at != std::string::npos) {
        absl::MutexLock l(&report_mu_);
        last_errors_[name] = line.substr(at + 7);
      }
      env_.console->TaskLine(name, line);
    };
    tasks_.push_back(std::move(t));
  }
}

JobRunner::~JobRunner() = default;

std::string JobRunner::LastError(const std::string& task) const {
  absl::MutexLock l(&report_mu_);
  auto it = last_errors_.find(task);
  return it == last_errors_.end() ? "" : it->second;
}

absl::Status JobRunner::StartTask(Task& t) {
  auto p = env_.launcher->Start(t.spec, t.on_line);
  if (!p.ok()) return p.status();
  t.process = std::move(*p);
  t.state.phase = TaskPhase::kRunning;
  t.state.started = env_.clock->Now();
  t.state.exit_code.reset();
  t.state.finished = absl::InfinitePast();
  t.announced = false;
  return absl::OkStatus();
}

void JobRunner::Announce(const Restart& r, Task& t) {
  t.announced = true;
  env_.console->Info(absl::StrCat(
      "kubetrain run: ", t.name, " exited with code ", r.exit_code, "; restarting ",
      r.delay == absl::ZeroDuration() ? "now" : absl::StrCat("in ", absl::FormatDuration(r.delay)),
      " (restart ", r.restarts, ", restartPolicy ", RestartPolicyName(r.policy), ")",
      LastError(t.name).empty() ? "" : ": " + LastError(t.name)));
}

std::vector<std::string> JobRunner::HoldingTasks() const {
  absl::MutexLock l(&report_mu_);
  return {holding_.begin(), holding_.end()};
}

void JobRunner::StopAll(const std::atomic<bool>* interrupted, JobRunResult* out) {
  const bool was_interrupted = interrupted != nullptr && interrupted->load();
  for (auto& t : tasks_) {
    if (t->process && !t->process->Poll()) t->process->Signal(SIGTERM);
  }
  auto holding = [&](const Task& t) {
    absl::MutexLock l(&report_mu_);
    return !was_interrupted && holding_.count(t.name) > 0;
  };
  const absl::Time deadline = env_.clock->Now() + options_.stop_grace;
  for (auto& t : tasks_) {
    if (!t->process) continue;
    while (!t->process->Poll() && env_.clock->Now() < deadline) env_.sleep(absl::Milliseconds(20));
    if (!t->process->Poll() && !holding(*t)) t->process->Signal(SIGKILL);
  }
  if (was_interrupted) return;  // the user asked to stop: the tasks were killed
  out->holding_tasks = HoldingTasks();
  if (out->holding_tasks.empty()) return;
  std::vector<std::string> ps;
  for (const auto& t : tasks_) {
    if (t->id.type == "ps") ps.push_back(t->address);
  }
  out->export_command =
      ExportCommandLine(ps, options_.job_path, absl::StrCat("/tmp/", job_.name, "-model.ktm"),
                        options_.export_auth_dir);
  bool waiting = false;
  for (auto& t : tasks_) {
    if (t->process && !t->process->Poll()) waiting = true;
  }
  if (!waiting) return;
  env_.console->Info(absl::StrCat(
      "kubetrain run: ", absl::StrJoin(out->holding_tasks, ", "),
      " could not write the final checkpoint to spec.training.checkpoint.directory ",
      job_.training.checkpoint_dir,
      " and hold the trained parameters read-only until they exit (kubetrain-ps "
      "--keep_serving_after_checkpoint_failure_seconds). Save the model now, from another shell "
      "(any writable --output):\n  ",
      out->export_command, "\nkubetrain run waits for them; Ctrl-C stops them now."));
  bool stopped = false;
  absl::Time kill_at = absl::InfiniteFuture();
  while (true) {
    bool alive = false;
    for (auto& t : tasks_) {
      if (t->process && !t->process->Poll()) alive = true;
    }
    if (!alive) break;
    if (!stopped && interrupted != nullptr && interrupted->load()) {
      stopped = true;  // a second SIGTERM: the PS tasks exit at once
      for (auto& t : tasks_) {
        if (t->process && !t->process->Poll()) t->process->Signal(SIGTERM);
      }
      kill_at = env_.clock->Now() + options_.stop_grace;
    }
    if (env_.clock->Now() >= kill_at) {
      for (auto& t : tasks_) {
        if (t->process && !t->process->Poll()) t->process->Signal(SIGKILL);
      }
    }
    env_.sleep(options_.poll_interval);
  }
}

std::string JobRunner::ProgressLine(absl::Time start) const {
  absl::MutexLock l(&report_mu_);
  return absl::StrFormat("[%s %5.1fs] %s", job_.name,
                         absl::ToDoubleSeconds(env_.clock->Now() - start), ProgressText(progress_));
}

JobRunResult JobRunner::Run(const std::atomic<bool>* interrupted) {
  JobRunResult out;
  auto count = [&](const char* key, const char* what) -> std::string {
    auto it = job_.replica_specs.find(key);
    return it == job_.replica_specs.end() ? "" : absl::StrCat(it->second.replicas, " ", what, ", ");
  };
  env_.console->Info(
      absl::StrCat("kubetrain run: ", job_.name, " (", TrainingModeName(job_.training.mode), ", ",
                   job_.training.model.type, ", ", count("Chief", "chief"), job_.num_ps(), " PS, ",
                   job_.num_workers(), " workers, ", count("Evaluator", "evaluator"), target_steps_,
                   " global steps)"));
  for (const auto& t : tasks_) {
    env_.console->Info(absl::StrCat("  ", t->name, ": grpc ", t->address,
                                    "  metrics http://127.0.0.1:", t->metrics_port, "/metrics"));
  }
  const absl::Time start = env_.clock->Now();
  LifecycleDecision decision;
  for (auto& t : tasks_) {
    if (absl::Status s = StartTask(*t); !s.ok()) {
      out.status = "Failed";
      out.reason = absl::StrCat("starting ", t->name, ": ", s.message());
      env_.console->Info("error: " + out.reason);
      break;
    }
  }
  while (out.status.empty()) {
    const absl::Time now = env_.clock->Now();
    if (interrupted && interrupted->load()) {
      out.status = "Interrupted";
      out.reason = "stopped by signal";
      break;
    }
    std::vector<TaskState> states;
    for (auto& t : tasks_) {
      if (t->state.phase == TaskPhase::kRunning) {
        if (std::optional<int> code = t->process->Poll()) {
          t->state.phase = *code == 0 ? TaskPhase::kSucceeded : TaskPhase::kFailed;
          t->state.exit_code = *code;
          t->state.finished = now;
        }
      }
      states.push_back(t->state);
    }
    decision = DecideJob(job_, states, start, now, options_.backoff);
    if (decision.outcome == JobOutcome::kSucceeded) {
      out.status = "Succeeded";
      break;
    }
    if (decision.outcome == JobOutcome::kFailed) {
      out.status = "Failed";
      out.failure = decision.failure;
      out.reason = FailureReason(decision.failure);
      for (auto& t : tasks_) {
        if (t->id == decision.failure.task && t->process && t->process->Poll()) t->process->Wait();
      }
      if (const std::string why = LastError(decision.failure.task.name()); !why.empty()) {
        absl::StrAppend(&out.reason, ": ", why);
      }
      break;
    }
    for (const Restart& r : decision.restarts) {
      Task* t = nullptr;
      for (auto& candidate : tasks_) {
        if (candidate->id == r.task) t = candidate.get();
      }
      if (!t->announced) {
        t->process->Wait();  // its last output (the error) first
        Announce(r, *t);
      }
      if (r.at > now) continue;
      t->process->Wait();  // deliver its last output first
      if (absl::Status s = StartTask(*t); !s.ok()) {
        out.status = "Failed";
        out.reason = absl::StrCat("restarting ", t->name, ": ", s.message());
        break;
      }
      t->state.restarts = r.restarts;
      t->state.consecutive_failures = r.consecutive_failures;
    }
    if (!out.status.empty()) break;
    env_.console->Status(ProgressLine(start));
    env_.sleep(options_.poll_interval);
  }

  out.decided_after = env_.clock->Now() - start;
  if (out.status == "Succeeded") {
    // The others (PS tasks, other workers) end by themselves once the chief
    // has ended the job; give them the grace before stopping them.
    const absl::Time until = env_.clock->Now() + options_.cleanup_grace;
    auto all_ended = [&] {
      for (auto& t : tasks_) {
        if (t->process && !t->process->Poll()) return false;
      }
      return true;
    };
    while (!all_ended() && env_.clock->Now() < until) env_.sleep(options_.poll_interval);
  }
  StopAll(interrupted, &out);
  for (auto& t : tasks_) {
    out.tasks.push_back({t->name, t->process ? t->process->Wait() : -1, t->state.restarts});
  }
  env_.console->EndStatus();
  out.wall_seconds = absl::ToDoubleSeconds(env_.clock->Now() - start);
  out.replicas = decision.replicas;
  out.total_restarts = decision.total_restarts;
  {
    absl::MutexLock l(&report_mu_);
    out.result = result_;
    out.progress = progress_;
  }
  if (out.status == "Succeeded" && !out.result) {
    std::string chief;
    for (auto& t : tasks_) {
      if (job_.IsChiefTask(t->id.type, t->id.index)) chief = t->name;
    }
    out.status = "Failed";
    out.reason = absl::StrCat("the chief (", chief, ") exited without reporting a result");
  }
  return out;
}

nlohmann::json SummaryJson(const TrainingJob& job, int64_t target_steps, const JobRunResult& r) {
  nlohmann::json s = r.result ? ToJson(*r.result) : nlohmann::json::object();
  if (!r.result && r.progress) {
    const Progress& p = *r.progress;
    s["absent_workers"] = p.absent_workers;
    s["checkpoint_failures"] = p.checkpoint_failures;
    s["checkpoints_failing"] = p.checkpoints_failing;
    s["checkpoint_error"] = p.checkpoint_error;
  }
  if (s.contains("wall_seconds")) {
    s["training_seconds"] = s["wall_seconds"];  // the chief's; wall_seconds is the whole run
  }
  s["name"] = job.name;
  s["status"] = r.status;
  if (!r.reason.empty()) s["reason"] = r.reason;
  s["mode"] = TrainingModeName(job.training.mode);
  s["model"] = job.training.model.type;
  s["ps"] = job.num_ps();
  s["workers"] = job.num_workers();
  if (job.has_chief_replica()) s["chief"] = 1;
  if (job.replica_specs.count("Evaluator"))
    s["evaluators"] = job.replica_specs.at("Evaluator").replicas;
  s["target_steps"] = target_steps;
  s["wall_seconds"] = r.wall_seconds;
  nlohmann::json exit_codes = nlohmann::json::object(), restarts = nlohmann::json::object();
  for (const TaskOutcome& t : r.tasks) {
    exit_codes[t.name] = t.exit_code;
    restarts[t.name] = t.restarts;
  }
  s["exit_codes"] = exit_codes;
  s["restarts"] = restarts;
  s["total_restarts"] = r.total_restarts;
  if (!r.export_command.empty()) s["export_command"] = r.export_command;
  return s;
}

std::string SummaryText(const TrainingJob& job, int64_t target_steps, const JobRunResult& r) {
  std::string text = absl::StrCat("\nTrainingJob ", job.name, " ", r.status,
                                  absl::StrFormat(" in %.1f s", r.wall_seconds),
                                  r.reason.empty() ? "" : ": " + r.reason, "\n");
  if (r.result) {
    const JobResult& res = *r.result;
    absl::StrAppend(
        &text,
        absl::StrFormat("  %s mode, %d PS, %d workers: global step %d/%d\n  test accuracy %.4f, "
                        "final loss %.4f\n"
                        "  %.0f examples/s, stale gradients dropped %d, task restarts %d\n",
                        TrainingModeName(job.training.mode), job.num_ps(), job.num_workers(),
                        res.global_step, target_steps, res.test_accuracy, res.final_loss,
                        res.examples_per_second, res.stale_gradients_dropped, r.total_restarts));
    if (res.test_auc || res.test_log_loss || res.test_rmse || res.records_skipped > 0) {
      absl::StrAppend(&text, " ");
      if (res.test_auc) absl::StrAppend(&text, absl::StrFormat(" test AUC %.4f", *res.test_auc));
      if (res.test_log_loss) {
        absl::StrAppend(&text, absl::StrFormat(" test log loss %.4f", *res.test_log_loss));
      }
      if (res.test_rmse) absl::StrAppend(&text, absl::StrFormat(" test RMSE %.4f", *res.test_rmse));
      if (res.records_skipped > 0) {
        absl::StrAppend(&text, " bad records skipped ", res.records_skipped);
      }
      absl::StrAppend(&text, "\n");
    }
    if (res.dynamic_rows > 0 || res.dynamic_rows_evicted > 0) {
      absl::StrAppend(&text, "  dynamic tables: ", res.dynamic_rows, " rows held, ",
                      res.dynamic_rows_evicted, " evicted (maxRows)\n");
    }
    if (!res.model_path.empty()) {
      absl::StrAppend(&text, "  model: ", res.model_path, " (kubetrain eval ", res.model_path,
                      ")\n");
    }
  }
  const Progress last = r.LastKnown();
  if (last.absent_workers > 0) {
    absl::StrAppend(&text, "  absent workers: ", last.absent_workers,
                    " (missed a barrier, not waited for: barrierTimeoutSeconds)\n");
  }
  if (!r.holding_tasks.empty()) {
    absl::StrAppend(&text, "  parameters: ", absl::StrJoin(r.holding_tasks, ", "),
                    " could not write the final checkpoint and held them read-only for `",
                    r.export_command,
                    "` until they exited; a model saved that way: kubetrain eval FILE\n");
  }
  if (const std::string storage = CheckpointHealthText(
          last.checkpoint_failures, last.checkpoints_failing, last.checkpoint_error);
      !storage.empty()) {
    absl::StrAppend(&text, "  storage: ", storage, "\n");
  }
  return text;
}

}  // namespace kubetrain
