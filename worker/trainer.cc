#include "worker/trainer.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "core/log.h"
#include "core/model_file.h"
#include "worker/eval_data.h"

namespace kubetrain {
namespace {

// Training examples consumed by one global step.
int64_t ExamplesPerStep(const TaskConfig& config) {
  const TrainingSpec& spec = config.job.training;
  const bool sync = spec.mode == TrainingMode::kSync;
  return static_cast<int64_t>(spec.batch_size) *
         (sync ? config.job.effective_replicas_to_aggregate() : 1);
}

// PS restarts a pull or poll saw, and the steps they lost (a restart from a
// checkpoint as new as the last pull loses none, but is still a restart).
template <typename R>
void CountRestarts(const R& seen, TrainResult* result, const TrainerMetrics& metrics) {
  result->ps_restarts_seen += seen.ps_restarts;
  if (seen.steps_lost <= 0) return;
  result->steps_lost += seen.steps_lost;
  if (metrics.steps_lost) metrics.steps_lost->Increment(static_cast<double>(seen.steps_lost));
}

// The head's test figures for the dense values in `params` (the test set's
// table rows are pulled into it first), logged as "<who>: global step v/T
// test accuracy a[, AUC .., log loss ..]" (or "test RMSE r").
absl::StatusOr<EvalMetrics> Evaluate(const TaskConfig& config, PsClient* client, Params* params,
                                     const EvalData& test, int64_t version, const char* who,
                                     const TrainerMetrics& metrics, Progress* progress) {
  auto evaluated = test.Evaluate(client, params);
  if (!evaluated.ok()) return evaluated.status();
  const EvalMetrics& m = *evaluated;
  std::string figures;
  if (m.accuracy) {
    progress->accuracy = *m.accuracy;
    if (metrics.accuracy) metrics.accuracy->Set(*m.accuracy);
    figures = absl::StrCat(" test accuracy ", *m.accuracy);
  }
  if (m.auc) {
    if (metrics.auc) metrics.auc->Set(*m.auc);
    absl::StrAppend(&figures, ", AUC ", *m.auc);
  }
  if (m.log_loss && m.auc) {
    if (metrics.log_loss) metrics.log_loss->Set(*m.log_loss);
    absl::StrAppend(&figures, ", log loss ", *m.log_loss);
  }
  if (m.rmse) {
    if (metrics.rmse) metrics.rmse->Set(*m.rmse);
    absl::StrAppend(&figures, " test RMSE ", *m.rmse);
  }
  Log(who, ": global step ", version, "/", config.target_steps, figures);
  return m;
}

// Writes the model file from the dense values in `params`, the fixed
// tables (pulled whole into `params` here) and the dynamic tables' rows
// (listed off the PS tasks as the file is written).
absl::Status Export(const TaskConfig& config, PsClient* client, Params* params, int64_t version,
                    const Dataset& test, const std::string& path, const ExportPolicy& policy,
                    const Clock* clock, TrainResult* result) {
  if (path.empty()) return absl::OkStatus();
  if (config.model->sparse()) {
    if (absl::Status s = client->PullTables(params); !s.ok()) return s;
  }
  PsRowSource rows(client, &config.placement);
  if (absl::Status s = WriteModelExport(config, *params, version, test, path, policy, clock,
                                        &result->export_failures, &rows);
      !s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat(s.message(),
                     "; the job is not ended, so the PS tasks keep the parameters "
                     "and write a final checkpoint when stopped (if they cannot, they hold "
                     "the parameters for `kubetrain export --from-ps`)"));
  }
  result->model_path = path;
  Log("chief: exported the final model to ", path, " (kubetrain eval ", path, ")");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainResult> Train(const TaskConfig& config, const TrainerOptions& options,
                                  PsClient* client, const RecordSource& train, const Dataset* test,
                                  const Clock* clock, TrainerMetrics metrics,
                                  const std::function<void(const Progress&)>& on_progress) {
  const TrainingSpec& spec = config.job.training;
  const Model& model = *config.model;
  const bool sync = spec.mode == TrainingMode::kSync;
  const int64_t target = config.target_steps;
  const int64_t examples_per_step = ExamplesPerStep(config);
  if (options.is_chief && test == nullptr)
    return absl::InvalidArgumentError("chief needs a test set");

  ShardedBatcher batcher(train, options.worker_index, config.num_workers, spec.seed,
                         spec.shuffle_buffer);
  std::unique_ptr<EvalData> test_eval;
  if (options.is_chief) test_eval = std::make_unique<EvalData>(model, *test);
  Params params, grads;
  SparseBatch lookups;  // sparse models: this step's lookups, into compact tables
  TableIds table_ids(config.placement.tables.size());  // none for a dense model
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<float> targets;
  std::vector<int64_t> lookup_ids;
  std::vector<float> lookup_weights;
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

  auto mean_loss = [&] {
    return recent_losses.empty()
               ? 0.0
               : std::accumulate(recent_losses.begin(), recent_losses.end(), 0.0) /
                     recent_losses.size();
  };

  // The values of the next step, pulled by the last step's fused PushPull;
  // empty before the first step (a plain Pull).
  std::optional<PsClient::PullResult> prefetched;
  // --overlap_layers: the model tells the client as each gradient is final.
  const std::vector<int> backprop_order = model.BackpropOrder();
  LayerHooks hooks;
  hooks.gradient_ready = [client](int v) { client->GradientReady(v); };
  while (true) {
    if (client->cancelled()) return absl::CancelledError("training stopped");
    absl::StatusOr<PsClient::PullResult> pulled =
        prefetched.has_value()
            ? absl::StatusOr<PsClient::PullResult>(*std::exchange(prefetched, std::nullopt))
            : client->Pull(sync && pushed, result.local_steps, model.variables(), &params);
    if (!pulled.ok()) return pulled.status();
    CountRestarts(*pulled, &result, metrics);
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
      auto evaluated = Evaluate(config, client, &params, *test_eval, pulled->version, "chief",
                                metrics, &progress);
      if (!evaluated.ok()) return evaluated.status();
      next_eval = (pulled->version / spec.eval_every_steps + 1) * spec.eval_every_steps;
    }

    if (options.step_delay > absl::ZeroDuration()) clock->SleepFor(options.step_delay);
    absl::Time t0 = clock->Now();
    if (absl::Status s =
            batcher.Next(spec.batch_size, &x, &y, &targets, &lookup_ids, &lookup_weights);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("training data: ", s.message()));
    }
    // Dropout masks differ per worker and step, and repeat exactly on a rerun.
    const uint64_t dropout_seed = spec.seed ^
                                  (uint64_t{static_cast<uint32_t>(options.worker_index)} << 40) ^
                                  static_cast<uint64_t>(result.local_steps);
    Batch batch;
    batch.x = x.data();
    batch.labels = y.data();
    batch.targets = targets.empty() ? nullptr : targets.data();
    batch.size = spec.batch_size;
    if (model.sparse()) {
      // Only the rows this batch looks up: its distinct ids per table.
      lookups = model.Lookups(lookup_ids.data(), spec.batch_size, lookup_weights.data());
      table_ids = CompactLookups(&lookups);
      if (absl::Status s = client->PullRows(table_ids, &params); !s.ok()) return s;
      batch.sparse = &lookups;
      if (metrics.unique_ids) {
        int64_t n = 0;
        for (const auto& ids : table_ids) n += static_cast<int64_t>(ids.size());
        metrics.unique_ids->Observe(static_cast<double>(n));
      }
    }
    // One round trip: this step's gradient out and the next step's values
    // back, once the shard lets this worker go on (the sync barrier, the
    // staleness bound): what Push then Pull(sync) did, in the same order.
    // Overlapped, it starts before the gradient is computed and sends each
    // variable's as backprop finishes it.
    absl::StatusOr<PsClient::PushPullResult> step;
    float loss = 0;
    if (options.overlap_layers) {
      // Sized as the step leaves them (its buffers, so the push can point into them now).
      grads.resize(params.size());
      for (size_t v = 0; v < params.size(); ++v) grads[v].resize(params[v].size());
      if (absl::Status s = client->StartPushPull(grads, result.local_steps + 1, table_ids,
                                                 /*next_version=*/sync, model.variables(), &params,
                                                 backprop_order);
          !s.ok()) {
        return s;
      }
      loss = model.LossAndGradients(params, batch, dropout_seed, &grads, &hooks);
    } else {
      loss = model.LossAndGradients(params, batch, dropout_seed, &grads);
    }
    if (metrics.compute_seconds)
      metrics.compute_seconds->Observe(absl::ToDoubleSeconds(clock->Now() - t0));
    recent_losses.push_back(loss);
    if (recent_losses.size() > 50) recent_losses.pop_front();
    step = options.overlap_layers
               ? client->FinishPushPull()
               : client->PushPull(grads, result.local_steps + 1, table_ids,
                                  /*next_version=*/sync, model.variables(), &params);
    if (!step.ok()) return step.status();
    const PsClient::PushResult* push = &step->push;
    prefetched = step->pull;
    pushed = true;
    ++result.local_steps;
    if (metrics.steps) metrics.steps->Increment();
    if (metrics.examples) metrics.examples->Increment(spec.batch_size);
    if (push->dropped && metrics.dropped) metrics.dropped->Increment();
    if (metrics.loss) metrics.loss->Set(mean_loss());

    absl::Time now = clock->Now();
    if (now - last_report >= options.progress_interval) {
      double secs = std::max(1e-9, absl::ToDoubleSeconds(now - last_report));
      progress.global_step = push->version;
      progress.absent_workers = push->absent_workers;
      progress.loss = mean_loss();
      progress.examples_per_second =
          std::max<int64_t>(0, push->version - last_report_step) * examples_per_step / secs;
      last_report = now;
      last_report_step = push->version;
      if (options.is_chief) {
        if (metrics.examples_per_second)
          metrics.examples_per_second->Set(*progress.examples_per_second);
        on_progress(progress);
      } else {
        Log("worker:", options.worker_index, " step ", push->version, "/", target, " loss ",
            *progress.loss);
      }
    }
  }

  result.final_loss = mean_loss();
  if (options.is_chief) {
    // The final model: every shard at the target version.
    auto final_pull = client->PullAtLeast(target, result.local_steps, model.variables(), &params);
    if (!final_pull.ok()) return final_pull.status();
    CountRestarts(*final_pull, &result, metrics);
    result.global_step = final_pull->version;
    auto evaluated = Evaluate(config, client, &params, *test_eval, final_pull->version, "chief",
                              metrics, &progress);
    if (!evaluated.ok()) return evaluated.status();
    result.test_metrics = *evaluated;
    result.test_accuracy = result.test_metrics.accuracy.value_or(-1);
    if (absl::Status s = Export(config, client, &params, final_pull->version, *test,
                                options.export_model, options.export_policy, clock, &result);
        !s.ok()) {
      return s;
    }
  }
  result.wall_seconds = absl::ToDoubleSeconds(clock->Now() - start);
  result.examples_per_second =
      result.wall_seconds > 0 ? result.global_step * examples_per_step / result.wall_seconds : 0;
  if (options.is_chief) {
    progress.global_step = result.global_step;
    progress.loss = result.final_loss;
    progress.examples_per_second = result.examples_per_second;
    if (metrics.examples_per_second) metrics.examples_per_second->Set(result.examples_per_second);
    on_progress(progress);
  }
  if (absl::Status s = client->Leave(); !s.ok()) Log("warning: leave: ", s.message());
  if (options.is_chief) {
    auto stats = client->Shutdown();
    if (!stats.ok()) return stats.status();
    result.ps_stats = *stats;
  }
  return result;
}

absl::StatusOr<TrainResult> Follow(const TaskConfig& config, const FollowOptions& options,
                                   PsClient* client, const Dataset& test,
                                   const Dataset* loss_sample, const Clock* clock,
                                   TrainerMetrics metrics,
                                   const std::function<void(const Progress&)>& on_progress) {
  const TrainingSpec& spec = config.job.training;
  const Model& model = *config.model;
  const int64_t target = config.target_steps;
  const int64_t every = spec.eval_every_steps;
  const int64_t examples_per_step = ExamplesPerStep(config);
  const char* who = options.is_chief ? "chief" : "evaluator";
  Params params, grads;
  TrainResult result;
  Progress progress;
  progress.target_steps = target;
  const absl::Time start = clock->Now();
  absl::Time last_report = start;
  int64_t last_report_step = -1;  // the first poll sets the base of the rate
  const EvalData test_eval(model, test);
  std::unique_ptr<EvalData> sample_eval;
  if (loss_sample != nullptr && loss_sample->size > 0) {
    sample_eval = std::make_unique<EvalData>(model, *loss_sample, kLossSampleExamples);
  }

  // Evaluates the dense values in `params` (read at `version`) with the
  // table rows as they are now (read right after them, not held: training
  // goes on).
  auto evaluate = [&](int64_t version) -> absl::Status {
    auto evaluated = Evaluate(config, client, &params, test_eval, version, who, metrics, &progress);
    if (!evaluated.ok()) return evaluated.status();
    result.test_metrics = *evaluated;
    if (sample_eval != nullptr) {
      if (absl::Status s = sample_eval->PullRows(client, &params); !s.ok()) return s;
      const double loss = model.LossAndGradients(params, sample_eval->batch(), 0, &grads);
      progress.loss = loss;
      if (metrics.loss) metrics.loss->Set(loss);
    }
    return absl::OkStatus();
  };
  auto report = [&](int64_t version, absl::Time now) {
    progress.global_step = version;
    const double secs = absl::ToDoubleSeconds(now - last_report);
    if (last_report_step >= 0 && secs > 0) {
      progress.examples_per_second =
          std::max<int64_t>(0, version - last_report_step) * examples_per_step / secs;
      if (metrics.examples_per_second)
        metrics.examples_per_second->Set(*progress.examples_per_second);
    }
    last_report = now;
    last_report_step = version;
    if (options.is_chief) on_progress(progress);
  };

  // The chief wakes up every progress interval to report; the evaluator
  // only at boundaries.
  const absl::Duration hold = options.is_chief
                                  ? std::max(options.progress_interval, absl::Milliseconds(10))
                                  : absl::ZeroDuration();
  auto poll_and_report = [&]() -> absl::Status {
    auto step = client->PollStep();
    if (!step.ok()) return step.status();
    CountRestarts(*step, &result, metrics);
    if (metrics.global_step) metrics.global_step->Set(static_cast<double>(step->version));
    progress.absent_workers = step->absent_workers;
    report(step->version, clock->Now());
    return absl::OkStatus();
  };
  if (options.is_chief) {
    if (absl::Status s = poll_and_report(); !s.ok()) return s;
  }
  int64_t next_eval = every > 0 ? every : target;
  absl::StatusOr<PsClient::PullResult> final_pull;
  while (true) {
    if (client->cancelled()) return absl::CancelledError("stopped");
    // Wait on the PS for the next boundary: it answers the moment its
    // version gets there, with the values at exactly that version. A
    // reader's pull joins no barrier and no staleness bound.
    const int64_t boundary = std::min(next_eval, target);
    auto pulled = hold > absl::ZeroDuration()
                      ? client->PullAtLeastWithin(boundary, hold, model.variables(), &params)
                      : client->PullAtLeast(boundary, 0, model.variables(), &params);
    if (absl::IsDeadlineExceeded(pulled.status())) {  // the chief's progress interval
      if (absl::Status s = poll_and_report(); !s.ok()) return s;
      continue;
    }
    if (!pulled.ok()) return pulled.status();
    CountRestarts(*pulled, &result, metrics);
    if (metrics.global_step) metrics.global_step->Set(static_cast<double>(pulled->version));
    if (pulled->version >= target) {
      final_pull = std::move(pulled);
      break;
    }
    if (pulled->version < boundary) continue;  // a restarted PS answered at once: wait again
    progress.absent_workers = pulled->absent_workers;
    if (absl::Status s = evaluate(pulled->version); !s.ok()) {
      Log("warning: ", who, ": evaluation at global step ", pulled->version,
          " skipped: reading the table rows failed: ", s.message());
    }
    report(pulled->version, clock->Now());
    next_eval = (pulled->version / every + 1) * every;
  }

  // `params` hold the final model: every shard at the target version.
  result.global_step = final_pull->version;
  if (absl::Status s = evaluate(final_pull->version); !s.ok()) return s;
  result.test_accuracy = result.test_metrics.accuracy.value_or(-1);
  if (progress.loss.has_value()) result.final_loss = *progress.loss;
  if (options.is_chief) {
    if (absl::Status s = Export(config, client, &params, final_pull->version, test,
                                options.export_model, options.export_policy, clock, &result);
        !s.ok()) {
      return s;
    }
  }
  result.wall_seconds = absl::ToDoubleSeconds(clock->Now() - start);
  result.examples_per_second =
      result.wall_seconds > 0 ? result.global_step * examples_per_step / result.wall_seconds : 0;
  if (options.is_chief) {
    progress.global_step = result.global_step;
    progress.examples_per_second = result.examples_per_second;
    if (metrics.examples_per_second) metrics.examples_per_second->Set(result.examples_per_second);
    on_progress(progress);
    auto stats = client->Shutdown();
    if (!stats.ok()) return stats.status();
    result.ps_stats = *stats;
  } else if (absl::Status s = client->Leave(); !s.ok()) {
    Log("warning: leave: ", s.message());
  }
  return result;
}

}  // namespace kubetrain
