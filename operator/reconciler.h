// One reconcile of one TrainingJob: observe (the job, its pods, services and
// ConfigMap, read from the API server every time: level-triggered, so a
// restarted operator derives everything and never duplicates a pod; and the
// chief task's live progress) -> Desired() (pure, operator/desired.h) ->
// apply (parallel creates, deletes, status, events). Thread-safe: different
// jobs may be reconciled concurrently.
#ifndef KUBETRAIN_OPERATOR_RECONCILER_H_
#define KUBETRAIN_OPERATOR_RECONCILER_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "operator/desired.h"
#include "operator/kube_client.h"

namespace kubetrain {

struct ReconcileOutcome {
  absl::Status status;                          // not OK: retry with backoff
  std::optional<absl::Duration> requeue_after;  // a timer (deadline, TTL) to honour
  std::string state;                            // the job's state after this pass ("" if gone)
};

// Reads the chief's live progress (e.g. from its /metrics, see
// operator/progress.h) given its pod IP; may return nullopt. Optional.
using ProgressReader = std::function<std::optional<Progress>(const std::string& pod_ip)>;

class Reconciler {
 public:
  // `client` and `clock` must outlive the reconciler.
  Reconciler(KubeClient* client, OperatorConfig config, const Clock* clock,
             ProgressReader progress = nullptr);

  ReconcileOutcome Reconcile(const std::string& ns, const std::string& name);

 private:
  absl::Status Apply(const JobObject& job, const Actions& actions);
  absl::Status CleanUpOrphans(const std::string& ns, const std::string& name);
  void RecordEvent(const JobObject& job, const JobEvent& event);

  KubeClient* const client_;
  const OperatorConfig config_;
  const Clock* const clock_;
  const ProgressReader progress_;
};

ResourceRef TrainingJobs(const std::string& ns, const std::string& name = "",
                         const std::string& subresource = "");

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_RECONCILER_H_
