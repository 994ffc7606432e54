// EventRecorder: Kubernetes Events about TrainingJobs, aggregated as
// client-go's EventCorrelator does, so a busy or broken job costs a few
// Events, not one per reconcile: the first occurrence of (job, type,
// reason, message) creates an Event; repeats raise its `count` and
// `lastTimestamp` with one PATCH at most every `patch_interval` (repeats in
// between are carried into the next patch). Best effort: an Event that
// cannot be written is logged, never an error. Thread-safe.
#ifndef KUBETRAIN_OPERATOR_EVENT_RECORDER_H_
#define KUBETRAIN_OPERATOR_EVENT_RECORDER_H_

#include <map>
#include <string>
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
                absl::Duration patch_interval = absl::Seconds(30))
      : client_(client), clock_(clock), patch_interval_(patch_interval) {}

  void Record(const EventTarget& job, const std::string& type, const std::string& reason,
              const std::string& message);
  // The job "namespace/name" is gone: drop what is remembered about its Events.
  void Forget(const std::string& job_key);

 private:
  struct Seen {
    std::string event_name;  // "" until created
    int count = 0;           // occurrences so far
    absl::Time first, last_write = absl::InfinitePast();
  };
  // job key, uid, type, reason, message
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;

  // Constant after construction.
  KubeClient* const client_;
  const Clock* const clock_;
  const absl::Duration patch_interval_;

  absl::Mutex mu_;
  std::map<Key, Seen> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_EVENT_RECORDER_H_
