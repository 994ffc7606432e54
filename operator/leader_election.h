// Leader election with a coordination.k8s.io/v1 Lease, as client-go does: a
// candidate takes the lease when it is free or its holder has not renewed it
// for leaseDurationSeconds, and the holder renews it every renew period. Only
// the leader reconciles, so two operator replicas never act on one job.
#ifndef KUBETRAIN_OPERATOR_LEADER_ELECTION_H_
#define KUBETRAIN_OPERATOR_LEADER_ELECTION_H_

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "operator/kube_client.h"

namespace kubetrain {

struct LeaseOptions {
  std::string namespace_ = "kubetrain-system";
  std::string name = "kubetrain-operator";
  std::string identity;  // unique per process, e.g. hostname_pid
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_period = absl::Seconds(2);
};

class LeaderElector {
 public:
  // `client` and `clock` must outlive the elector.
  LeaderElector(KubeClient* client, const Clock* clock, LeaseOptions options);
  // Joins the renewing thread (it ends once *stop is set).
  ~LeaderElector();

  // One attempt to take or renew the lease. OK: we hold it now.
  // FailedPrecondition: someone else does. Other errors: the API failed.
  absl::Status TryAcquireOrRenew();
  // Blocks until the lease is ours (OK) or *stop (Cancelled).
  absl::Status Acquire(const std::atomic<bool>* stop);
  // Renews every renew_period until *stop; returns (not OK) when leadership
  // is lost, i.e. no successful renewal for lease_duration.
  absl::Status KeepRenewing(const std::atomic<bool>* stop);
  // KeepRenewing on a thread of the elector's own; when leadership is lost it
  // calls `on_lost` there (the operator exits at once: another replica may
  // already be acting). *stop must outlive the elector. Call at most once.
  void StartRenewing(const std::atomic<bool>* stop,
                     std::function<void(const absl::Status&)> on_lost);

 private:
  KubeClient* const client_;
  const Clock* const clock_;
  const LeaseOptions options_;
  std::thread renewer_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_LEADER_ELECTION_H_
