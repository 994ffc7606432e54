#include "worker/trainer.h"

#include <algorithm>
#include <deque>
#include <numeric>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "core/log.h"
#include "core/model_file.h"

namespace kubetrain {

absl::StatusOr<TrainResult> Train(const TaskConfig& config, const TrainerOptions& options,
                                  PsClient* client, const Dataset& train, const Dataset* test,
                                  const Clock* clock, TrainerMetrics metrics,
                                  const std::function<void(const Progress&)>& on_progress) {
  const TrainingSpec& spec = config.job.training;
  const Model& model = *config.model;
  const bool sync = spec.mode == TrainingMode::kSync;
  const int64_t target = config.target_steps;
  const int64_t examples_per_step =
      static_cast<int64_t>(spec.batch_size) * (sync ? config.job.effective_replicas_to_aggregate() : 1);
  if (options.is_chief && test == nullptr) return absl::InvalidArgumentError("chief needs a test set");

  ShardedBatcher batcher(train, options.worker_index, config.num_workers, spec.seed);
  Params params, grads;
  std::vector<float> x;
  std::vector<int32_t> y;
  std::deque<float> recent_losses;
  TrainResult result;
  result.local_steps = client->resume_clock();  // a restarted worker continues its clock
  Progress progress;
  progress.target_steps = target;
  bool pushed = false;  // sync: after a push, the next pull is the barrier
  int64_t next_eval = spec.eval_every_steps > 0 ? spec.eval_every_steps : target + 1;
  const absl::Time start = clock->Now();
  absl::Time last_report = start;
  int64_t last_report_step = 0;

  auto evaluate = [&](int64_t version) {
    double acc = model.Accuracy(params, test->images.data(), test->labels.data(), test->size);
    progress.accuracy = acc;
    if (metrics.accuracy) metrics.accuracy->Set(acc);
    Log("chief: global step ", version, "/", target, " test accuracy ", acc);
    return acc;
  };
  auto mean_loss = [&] {
    return recent_losses.empty() ? 0.0
                                 : std::accumulate(recent_losses.begin(), recent_losses.end(), 0.0) /
                                       recent_losses.size();
  };

  while (true) {
    auto pulled = client->Pull(sync && pushed, result.local_steps, model.variables(), &params);
    if (!pulled.ok()) return pulled.status();
    if (pulled->steps_lost > 0) {
      result.steps_lost += pulled->steps_lost;
      ++result.ps_restarts_seen;
      if (metrics.steps_lost) metrics.steps_lost->Increment(static_cast<double>(pulled->steps_lost));
    }
    if (sync && pushed && metrics.barrier_wait_seconds) {
      metrics.barrier_wait_seconds->Observe(pulled->waited_seconds);
    }
    if (!sync && metrics.staleness_wait_seconds) {
      metrics.staleness_wait_seconds->Observe(pulled->waited_seconds);
    }
    if (metrics.global_step) metrics.global_step->Set(static_cast<double>(pulled->version));
    result.global_step = pulled->version;
    if (pulled->done || pulled->version >= target) break;

    if (options.is_chief && pulled->version >= next_eval) {
      evaluate(pulled->version);
      next_eval = (pulled->version / spec.eval_every_steps + 1) * spec.eval_every_steps;
    }

    if (options.step_delay > absl::ZeroDuration()) absl::SleepFor(options.step_delay);
    absl::Time t0 = clock->Now();
    batcher.Next(spec.batch_size, &x, &y);
    float loss = model.LossAndGradients(params, x.data(), y.data(), spec.batch_size, &grads);
    if (metrics.compute_seconds) metrics.compute_seconds->Observe(absl::ToDoubleSeconds(clock->Now() - t0));
    recent_losses.push_back(loss);
    if (recent_losses.size() > 50) recent_losses.pop_front();

    auto push = client->Push(grads, result.local_steps + 1);
    if (!push.ok()) return push.status();
    pushed = true;
    ++result.local_steps;
    if (metrics.steps) metrics.steps->Increment();
    if (metrics.examples) metrics.examples->Increment(spec.batch_size);
    if (push->dropped && metrics.dropped) metrics.dropped->Increment();
    if (metrics.loss) metrics.loss->Set(mean_loss());

    absl::Time now = clock->Now();
    if (now - last_report >= options.progress_interval) {
      double secs = absl::ToDoubleSeconds(now - last_report);
      progress.global_step = push->version;
      progress.loss = mean_loss();
      progress.examples_per_second =
          std::max<int64_t>(0, push->version - last_report_step) * examples_per_step / secs;
      last_report = now;
      last_report_step = push->version;
      if (options.is_chief) {
        on_progress(progress);
      } else {
        Log("worker:", options.worker_index, " step ", push->version, "/", target, " loss ",
            progress.loss);
      }
    }
  }

  result.final_loss = mean_loss();
  if (options.is_chief) {
    // The final model: every shard at the target version.
    auto final_pull = client->PullAtLeast(target, result.local_steps, model.variables(), &params);
    if (!final_pull.ok()) return final_pull.status();
    result.global_step = final_pull->version;
    result.test_accuracy = evaluate(final_pull->version);
    if (!options.export_model.empty()) {
      ModelFile file{model.spec(), params, final_pull->version, config.job.name};
      if (absl::Status s = WriteModelFile(options.export_model, file); !s.ok()) return s;
      result.model_path = options.export_model;
      Log("chief: exported the final model to ", options.export_model,
          " (kubetrain eval ", options.export_model, ")");
    }
  }
  result.wall_seconds = absl::ToDoubleSeconds(clock->Now() - start);
  result.examples_per_second =
      result.wall_seconds > 0 ? result.global_step * examples_per_step / result.wall_seconds : 0;
  progress.global_step = result.global_step;
  progress.loss = result.final_loss;
  progress.examples_per_second = result.examples_per_second;
  if (options.is_chief) on_progress(progress);
  if (absl::Status s = client->Leave(); !s.ok()) Log("warning: leave: ", s.message());
  if (options.is_chief) {
    auto stats = client->Shutdown();
    if (!stats.ok()) return stats.status();
    result.ps_stats = *stats;
  }
  return result;
}

}  // namespace kubetrain
