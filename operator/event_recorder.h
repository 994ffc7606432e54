// EventRecorder: Kubernetes Events about TrainingJobs, aggregated as
// client-go's EventCorrelator does, so a busy or broken job costs a few
// Events, not one per reconcile: the first occurrence of (job, type,
// reason, message) creates an Event; repeats raise its `count` and
// `lastTimestamp` with one PATCH at most every `patch_interval` (repeats in
// between are carried into the next patch). Best effort: an Event that
// cannot be written is logged, never an error. Events are sent by one
// background thread (as client-go's broadcaster does), so a reconcile never
// waits for them; at most `max_queued` wait, more are dropped and logged.
// Once stopped (Stop(), the destructor) the sender goes on for at most
// `shutdown_grace` and drops what is still queued then (logged): at 1000 jobs
// thousands may wait behind the Events' rate limit, and an operator told to
// stop must not take minutes to do so. Thread-safe.
#ifndef KUBETRAIN_OPERATOR_EVENT_RECORDER_H_
#define KUBETRAIN_OPERATOR_EVENT_RECORDER_H_

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "operator/kube_client.h"

namespace kubetrain {

struct EventTarget {  // the TrainingJob an Event is about
  std::string namespace_, name, uid;
};

class EventRecorder {
 public:
  // `client` and `clock` must outlive the recorder.
  EventRecorder(KubeClient* client, const Clock* clock,
                absl::Duration patch_interval = absl::Seconds(30), size_t max_queued = 10000,
                absl::Duration shutdown_grace = absl::Seconds(5));
  // Stop(), then waits for the sender.
  ~EventRecorder();

  // Records nothing more; the sender sends what is queued for at most
  // shutdown_grace (of the clock) and drops the rest. Returns at once.
  void Stop();

  // Queues the Event (its time is now) and returns.
  void Record(const EventTarget& job, const std::string& type, const std::string& reason,
              const std::string& message);
  // The job "namespace/name" is gone: drop what is remembered about its Events.
  void Forget(const std::string& job_key);
  // Blocks until every Event queued so far has been sent (for tests).
  void Flush();

 private:
  struct Seen {
    std::string event_name;  // "" until created
    int count = 0;           // occurrences so far
    absl::Time first, last_write = absl::InfinitePast();
  };
  // job key, uid, type, reason, message
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;

  struct Pending {
    EventTarget job;
    std::string type, reason, message;
    absl::Time at;
  };
  void SendLoop();
  void Send(const Pending& e);

  // Constant after construction.
  KubeClient* const client_;
  const Clock* const clock_;
  const absl::Duration patch_interval_;
  const size_t max_queued_;
  const absl::Duration shutdown_grace_;

  absl::Mutex mu_;
  std::map<Key, Seen> seen_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stop_deadline_ ABSL_GUARDED_BY(mu_);  // once stop_: when what is queued is dropped
  std::thread sender_;                             // last: starts after the rest is built
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_EVENT_RECORDER_H_
