// Expectations: what a reconcile has just created or deleted and the
// informer caches have not shown yet (kube-controller-manager's
// UIDTrackingControllerExpectations, by object name). A reconcile that finds
// its job's expectations unmet decides nothing: the cache may not show its
// own creates yet, and deciding from it would create them twice. The watch
// events that show the objects satisfy them (Observed) and enqueue the job
// again; a write that failed lowers them at once (Forget). Expectations
// older than `timeout` count as met, so a lost event delays a job, never
// stalls it.
//
// Names are "plural/name" (e.g. "pods/mnist-worker-0"). Thread-safe.
#ifndef KUBETRAIN_OPERATOR_EXPECTATIONS_H_
#define KUBETRAIN_OPERATOR_EXPECTATIONS_H_

#include <map>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace kubetrain {

class Expectations {
 public:
  // `clock` must outlive this object.
  Expectations(const Clock* clock, absl::Duration timeout) : clock_(clock), timeout_(timeout) {}

  // Call before issuing the write, so an event that beats its answer counts.
  void ExpectCreate(const std::string& job_key, const std::string& object);
  void ExpectDelete(const std::string& job_key, const std::string& object);
  // The write of `object` failed: nothing will be observed for it.
  void Forget(const std::string& job_key, const std::string& object);
  // The cache shows `object`: `exists` false when it is gone or being
  // deleted (metadata.deletionTimestamp), true otherwise.
  void Observed(const std::string& job_key, const std::string& object, bool exists);
  // True when nothing is pending for the job (or what is pending has timed
  // out: it is dropped and logged).
  bool Satisfied(const std::string& job_key);
  // The job is gone.
  void Clear(const std::string& job_key);
  // Objects pending over all jobs, for a gauge.
  size_t pending() const;

 private:
  struct Pending {
    std::set<std::string> creates, deletes;
    absl::Time since;
  };

  // Constant after construction.
  const Clock* const clock_;
  const absl::Duration timeout_;

  mutable absl::Mutex mu_;
  std::map<std::string, Pending> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_EXPECTATIONS_H_
