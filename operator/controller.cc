#include "operator/controller.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/metrics.h"

namespace kubetrain {

namespace {
constexpr const char* kStates[] = {"Created",   "Running", "Restarting",
                                   "Succeeded", "Failed",  "Suspended"};
}  // namespace

Controller::Controller(JobCache* cache, Reconciler* reconciler, Expectations* expectations,
                       const Clock* clock, ControllerOptions options,
                       prometheus::Registry& registry)
    : cache_(cache),
      reconciler_(reconciler),
      expectations_(expectations),
      clock_(clock),
      options_(std::move(options)),
      queue_(clock),
      reconciles_(prometheus::BuildCounter()
                      .Name("kubetrain_operator_reconciles_total")
                      .Help("Reconciles of TrainingJobs by result (success, error, requeue)")
                      .Register(registry)),
      reconcile_seconds_(prometheus::BuildHistogram()
                             .Name("kubetrain_operator_reconcile_duration_seconds")
                             .Help("Time to reconcile one TrainingJob")
                             .Register(registry)
                             .Add({}, LatencyBuckets())),
      jobs_by_state_(prometheus::BuildGauge()
                         .Name("kubetrain_operator_jobs")
                         .Help("TrainingJobs known to the operator, by state")
                         .Register(registry)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("kubetrain_operator_queue_depth")
                       .Help("Job keys waiting in the work queue")
                       .Register(registry)
                       .Add({})),
      busy_workers_(prometheus::BuildGauge()
                        .Name("kubetrain_operator_busy_workers")
                        .Help("Reconcile workers busy now (of --workers)")
                        .Register(registry)
                        .Add({})),
      watch_restarts_(prometheus::BuildCounter()
                          .Name("kubetrain_operator_watch_restarts_total")
                          .Help("Watches re-established after they ended or failed, by resource")
                          .Register(registry)),
      relists_(prometheus::BuildCounter()
                   .Name("kubetrain_operator_relists_total")
                   .Help("Lists after the first (410 Gone or a failed watch), by resource")
                   .Register(registry)),
      cache_objects_(prometheus::BuildGauge()
                         .Name("kubetrain_operator_cache_objects")
                         .Help("Objects in the informer cache, by resource")
                         .Register(registry)),
      expectations_pending_(prometheus::BuildGauge()
                                .Name("kubetrain_operator_expectations_pending")
                                .Help("Creates and deletes not yet seen in the cache")
                                .Register(registry)
                                .Add({})) {
  for (const char* r : {"success", "error", "requeue"}) reconciles_.Add({{"result", r}});
  for (const char* s : kStates) jobs_by_state_.Add({{"state", s}});
  for (const Informer* i : cache_->informers()) {
    watch_restarts_.Add({{"resource", i->resource()}});
    relists_.Add({{"resource", i->resource()}});
    cache_objects_.Add({{"resource", i->resource()}});
  }
  cache_->set_on_job([this](const std::string& key) { queue_.Add(key); });
}

void Controller::RecordState(const std::string& key, const std::string& state) {
  absl::MutexLock l(&mu_);
  if (state.empty()) {
    states_.erase(key);
  } else {
    states_[key] = state;
  }
  std::map<std::string, int> counts;
  for (const auto& [k, s] : states_) counts[s]++;
  for (const char* s : kStates) jobs_by_state_.Add({{"state", s}}).Set(counts[s]);
}

void Controller::UpdateGauges() {
  queue_depth_.Set(static_cast<double>(queue_.Depth()));
  busy_workers_.Set(busy_.load());
  expectations_pending_.Set(static_cast<double>(expectations_->pending()));
  absl::MutexLock l(&mu_);
  for (const Informer* i : cache_->informers()) {
    cache_objects_.Add({{"resource", i->resource()}}).Set(static_cast<double>(i->size()));
    for (auto [family, name, now] : {std::tuple{&watch_restarts_, "w/", i->watch_restarts()},
                                     std::tuple{&relists_, "r/", i->relists()}}) {
      int64_t& seen = counted_[name + i->resource()];
      if (now > seen) family->Add({{"resource", i->resource()}}).Increment(now - seen);
      seen = now;
    }
  }
}

void Controller::Work(const std::atomic<bool>* stop) {
  while (!stop->load()) {
    auto key = queue_.Get();
    if (!key) return;
    busy_++;
    const auto slash = key->find('/');
    absl::Time t0 = clock_->Now();
    ReconcileOutcome out;
    try {
      out = reconciler_->Reconcile(key->substr(0, slash), key->substr(slash + 1));
    } catch (
        const std::exception& e) {  // a bug or a malformed object must not take the operator down
      out.status = absl::InternalError(absl::StrCat("reconcile threw: ", e.what()));
    }
    reconcile_seconds_.Observe(absl::ToDoubleSeconds(clock_->Now() - t0));
    busy_--;
    if (!out.status.ok()) {
      reconciles_.Add({{"result", "error"}}).Increment();
      Log("operator: reconcile ", *key, " failed: ", out.status.message(),
          "; retrying with backoff");
      queue_.Done(*key);
      queue_.AddRateLimited(*key);
      continue;
    }
    RecordState(*key, out.state);
    queue_.Forget(*key);
    queue_.Done(*key);
    if (out.requeue_after) {
      reconciles_.Add({{"result", "requeue"}}).Increment();
      queue_.AddAfter(*key, *out.requeue_after);
    } else {
      reconciles_.Add({{"result", "success"}}).Increment();
    }
  }
}

void Controller::Run(const std::atomic<bool>* stop) {
  cache_->Start(stop);
  while (!stop->load() && !cache_->synced()) {
    absl::SleepFor(absl::Milliseconds(20));
    UpdateGauges();
  }
  if (!stop->load()) {
    Log("operator: cache synced (", cache_->JobKeys().size(), " trainingjobs); ", options_.workers,
        " workers");
  }
  std::vector<std::thread> workers;
  for (int i = 0; i < options_.workers; ++i) workers.emplace_back([this, stop] { Work(stop); });
  // Periodic resync: every cached job again, in case a decision was missed.
  absl::Time next_resync = clock_->Now() + options_.resync;
  while (!stop->load()) {
    absl::SleepFor(absl::Milliseconds(200));
    UpdateGauges();
    if (clock_->Now() >= next_resync) {
      next_resync = clock_->Now() + options_.resync;
      for (const auto& key : cache_->JobKeys()) queue_.Add(key);
    }
  }
  queue_.Shutdown();
  // Workers finish their current reconcile; watches may sit in a long poll:
  // they end with the process.
  for (auto& t : workers) t.join();
  cache_->Detach();
}

}  // namespace kubetrain
