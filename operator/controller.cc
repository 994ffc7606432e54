#include "operator/controller.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/metrics.h"
#include "operator/labels.h"

namespace kubetrain {

using nlohmann::json;

Controller::Controller(KubeClient* client, Reconciler* reconciler, const Clock* clock,
                       ControllerOptions options, prometheus::Registry& registry)
    : client_(client),
      reconciler_(reconciler),
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
      watch_restarts_(prometheus::BuildCounter()
                          .Name("kubetrain_operator_watch_restarts_total")
                          .Help("Watches re-established after they ended or failed, by resource")
                          .Register(registry)) {
  for (const char* r : {"success", "error", "requeue"}) reconciles_.Add({{"result", r}});
  for (const char* s : {"Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"}) {
    jobs_by_state_.Add({{"state", s}});
  }
  for (const char* r : {"trainingjobs", "pods"}) watch_restarts_.Add({{"resource", r}});
}

void Controller::Enqueue(const json& object, bool is_pod) {
  const json& md = object.value("metadata", json::object());
  const std::string ns = md.value("namespace", "");
  std::string name = md.value("name", "");
  if (is_pod) name = md.value("labels", json::object()).value(kJobNameLabel, std::string());
  if (!ns.empty() && !name.empty()) queue_.Add(ns + "/" + name);
}

void Controller::WatchLoop(const ResourceRef& ref, const std::string& selector, bool pods,
                           std::atomic<bool>* synced, const std::atomic<bool>* stop) {
  const char* resource = pods ? "pods" : "trainingjobs";
  absl::Duration backoff = absl::Milliseconds(200);
  std::string rv;
  while (!stop->load()) {
    if (rv.empty()) {
      auto list = client_->List(ref, selector);
      if (!list.ok()) {
        Log("operator: list ", resource, " failed: ", list.status().message(), "; retrying in ",
            absl::FormatDuration(backoff));
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(30));
        continue;
      }
      for (const auto& item : (*list)["items"]) Enqueue(item, pods);
      rv = (*list)["metadata"].value("resourceVersion", "");
      synced->store(true);
    }
    absl::Status s = client_->Watch(
        ref, selector, rv,
        [&](const WatchEvent& e) {
          std::string new_rv =
              e.object.value("/metadata/resourceVersion"_json_pointer, std::string());
          if (!new_rv.empty()) rv = new_rv;
          try {
            if (e.type != WatchEventType::kBookmark) Enqueue(e.object, pods);
          } catch (const std::exception& ex) {
            Log("operator: ignoring a malformed ", resource, " event: ", ex.what());
          }
          return !stop->load();
        },
        options_.watch_timeout_seconds);
    if (stop->load()) break;
    watch_restarts_.Add({{"resource", resource}}).Increment();
    if (absl::IsOutOfRange(s)) {
      Log("operator: watch of ", resource, " expired (", s.message(), "); relisting");
      rv.clear();
    } else if (!s.ok()) {
      Log("operator: watch of ", resource, " failed: ", s.message(), "; retrying in ",
          absl::FormatDuration(backoff));
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(30));
      rv.clear();  // relist: cheap, and no event is lost
    } else {
      backoff = absl::Milliseconds(200);  // the server ended a healthy watch: resume from rv
    }
  }
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
  for (const char* s : {"Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"}) {
    jobs_by_state_.Add({{"state", s}}).Set(counts[s]);
  }
}

void Controller::Work(const std::atomic<bool>* stop) {
  while (!stop->load()) {
    auto key = queue_.Get();
    if (!key) return;
    queue_depth_.Set(static_cast<double>(queue_.Depth()));
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
  std::vector<std::thread> threads;
  threads.emplace_back([this, stop] {
    WatchLoop(TrainingJobs(options_.namespace_), "", false, &jobs_synced_, stop);
  });
  threads.emplace_back([this, stop] {
    WatchLoop({"/api/v1", "pods", options_.namespace_, "", ""}, kJobNameLabel, true, &pods_synced_,
              stop);
  });
  for (int i = 0; i < options_.workers; ++i) threads.emplace_back([this, stop] { Work(stop); });
  // Periodic resync: every known job again, in case an event was missed.
  absl::Time next_resync = clock_->Now() + options_.resync;
  while (!stop->load()) {
    absl::SleepFor(absl::Milliseconds(200));
    queue_depth_.Set(static_cast<double>(queue_.Depth()));
    if (clock_->Now() >= next_resync) {
      next_resync = clock_->Now() + options_.resync;
      absl::MutexLock l(&mu_);
      for (const auto& [key, state] : states_) queue_.Add(key);
    }
  }
  queue_.Shutdown();
  // Workers finish their current reconcile; watches may sit in a long poll:
  // they are detached and end with the process.
  for (size_t i = 2; i < threads.size(); ++i) threads[i].join();
  threads[0].detach();
  threads[1].detach();
}

}  // namespace kubetrain
