#include "operator/event_recorder.h"

#include "core/log.h"
#include "operator/status.h"

namespace kubetrain {

using nlohmann::json;

EventRecorder::EventRecorder(KubeClient* client, const Clock* clock, absl::Duration patch_interval,
                             size_t max_queued, absl::Duration shutdown_grace)
    : client_(client),
      clock_(clock),
      patch_interval_(patch_interval),
      max_queued_(max_queued),
      shutdown_grace_(shutdown_grace),
      sender_([this] { SendLoop(); }) {}

EventRecorder::~EventRecorder() {
  Stop();
  sender_.join();
}

void EventRecorder::Stop() {
  absl::MutexLock l(&mu_);
  if (stop_) return;
  stop_ = true;
  stop_deadline_ = clock_->Now() + shutdown_grace_;
}

void EventRecorder::Record(const EventTarget& job, const std::string& type,
                           const std::string& reason, const std::string& message) {
  absl::MutexLock l(&mu_);
  if (stop_) return;
  if (queue_.size() >= max_queued_) {
    Log("operator: event queue full; dropping ", reason, " for ", job.namespace_, "/", job.name);
    return;
  }
  queue_.push_back({job, type, reason, message, clock_->Now()});
}

void EventRecorder::Flush() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](EventRecorder* r)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->queue_.empty() && !r->sending_; },
      this));
}

void EventRecorder::SendLoop() {
  while (true) {
    Pending e;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](EventRecorder* r)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->stop_ || !r->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and everything is sent
      if (stop_ && clock_->Now() >= stop_deadline_) {
        Log("operator: stopping: dropping ", queue_.size(), " Events not sent within ",
            absl::FormatDuration(shutdown_grace_));
        queue_.clear();
        return;
      }
      e = std::move(queue_.front());
      queue_.pop_front();
      sending_ = true;
    }
    Send(e);
    absl::MutexLock l(&mu_);
    sending_ = false;
  }
}

void EventRecorder::Send(const Pending& p) {
  const EventTarget& job = p.job;
  const std::string &type = p.type, &reason = p.reason, &message = p.message;
  const absl::Time now = p.at;
  const Key key{job.namespace_ + "/" + job.name, job.uid, type, reason, message};
  std::string name;
  int count;
  absl::Time first;
  {
    absl::MutexLock l(&mu_);
    Seen& s = seen_[key];
    if (s.count == 0) s.first = now;
    s.count++;
    // Within the interval of the last write (or of a create in flight): carried.
    if (s.last_write != absl::InfinitePast() && now - s.last_write < patch_interval_) return;
    name = s.event_name;
    count = s.count;
    first = s.first;
    s.last_write = now;  // one writer per interval
  }
  const ResourceRef events{"/api/v1", "events", job.namespace_, name, ""};
  if (!name.empty()) {
    auto r = client_->MergePatch(events, {{"count", count}, {"lastTimestamp", Timestamp(now)}});
    if (r.ok()) return;
    if (!absl::IsNotFound(r.status())) {
      Log("operator: event ", reason, " for ", job.namespace_, "/", job.name,
          " not updated: ", r.status().message());
      return;
    }
    // Expired (Events have a TTL) or deleted: write it again.
  }
  json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"generateName", job.name + "."}, {"namespace", job.namespace_}}},
                {"involvedObject",
                 {{"apiVersion", "kubetrain.io/v1"},
                  {"kind", "TrainingJob"},
                  {"name", job.name},
                  {"namespace", job.namespace_},
                  {"uid", job.uid}}},
                {"reason", reason},
                {"message", message},
                {"type", type},
                {"source", {{"component", "kubetrain-operator"}}},
                {"firstTimestamp", Timestamp(first)},
                {"lastTimestamp", Timestamp(now)},
                {"count", count}};
  auto r = client_->Create({"/api/v1", "events", job.namespace_, "", ""}, event);
  absl::MutexLock l(&mu_);
  if (!r.ok()) {
    Log("operator: event ", reason, " for ", job.namespace_, "/", job.name,
        " not recorded: ", r.status().message());
    seen_[key].last_write = absl::InfinitePast();  // try again next time
    return;
  }
  seen_[key].event_name = (*r)["metadata"].value("name", "");
}

void EventRecorder::Forget(const std::string& job_key) {
  absl::MutexLock l(&mu_);
  for (auto it = seen_.lower_bound(Key{job_key, "", "", "", ""});
       it != seen_.end() && std::get<0>(it->first) == job_key;) {
    it = seen_.erase(it);
  }
}

}  // namespace kubetrain
