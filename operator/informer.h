// Informer: a watch-fed, in-memory copy of one kind of object, as client-go's
// shared informers keep (and controller-runtime's cache reads). Run() lists
// the collection once, then watches it from the list's resourceVersion
// (bookmarks requested; a watch the server ends is resumed from the last
// resourceVersion seen); a 410 (history expired) or a failed watch relists,
// and the objects that vanished meanwhile are reported as deleted. Objects
// are stored after `transform` (drop what no reader needs: managedFields, a
// pod's spec, a ConfigMap's data) and indexed by the job they belong to
// (`job_of`), so a reconcile reads a job's pods without asking the API server.
// Each is kept packed (MessagePack, a few hundred bytes for a trimmed pod
// instead of several KiB as a JSON tree: at 1000 jobs the tree was most of
// the operator's memory) and unpacked when read.
//
// `on_change` runs on the Run() thread for every change to the store (after
// the store has it), outside any lock: the controller turns it into a
// work-queue key and into observed expectations.
//
// Thread-safe: readers may call any const method while Run() updates.
#ifndef KUBETRAIN_OPERATOR_INFORMER_H_
#define KUBETRAIN_OPERATOR_INFORMER_H_

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube_client.h"

namespace kubetrain {

struct InformerOptions {
  ResourceRef collection;  // name empty; namespace "" = all namespaces
  // How metrics and logs name the kind ("" = collection.plural).
  std::string resource;
  std::string label_selector;
  // Applied to every object before it is stored (and passed to on_change).
  std::function<void(nlohmann::json*)> transform;
  // "namespace/job" the object belongs to, or "" (not indexed).
  std::function<std::string(const nlohmann::json&)> job_of;
  int watch_timeout_seconds = 60;
  absl::Duration max_backoff = absl::Seconds(30);
};

// kAdded, kModified or kDeleted; `object` is the new state (the last known
// one for kDeleted).
using InformerHandler = std::function<void(WatchEventType type, const nlohmann::json& object)>;

class Informer {
 public:
  // `client` must outlive the informer.
  Informer(KubeClient* client, InformerOptions options, InformerHandler on_change);

  // Lists and watches until *stop is true (checked between events and after
  // each watch ends). Blocks.
  void Run(const std::atomic<bool>* stop);

  // True once the first list is in the store.
  bool synced() const { return synced_.load(); }
  // A copy of the stored object "namespace/name" (or "name"), if any.
  std::optional<nlohmann::json> Get(const std::string& ns, const std::string& name) const;
  // Copies of the objects indexed under job key "namespace/job".
  std::vector<nlohmann::json> ByJob(const std::string& job_key) const;
  // Every job key with at least one object (for a TrainingJob informer: every job).
  std::vector<std::string> JobKeys() const;
  size_t size() const;
  // Relists (after the first) and watch restarts so far, for metrics.
  int64_t relists() const { return relists_.load(); }
  int64_t watch_restarts() const { return watch_restarts_.load(); }
  const std::string& resource() const {
    return options_.resource.empty() ? options_.collection.plural : options_.resource;
  }

  // Stores the answer of this operator's own write (e.g. a status update,
  // or a create) at once, so the next reconcile does not decide from the
  // version before it, nor wait a watch round trip for what the write's
  // answer already shows; the watch event that follows brings the same
  // object (and changes nothing). Ignored when the store already holds a
  // newer resourceVersion, or when the watch has already delivered this
  // resourceVersion or a later one (the store is then ahead of the answer:
  // the object may even have been deleted since). True if stored (and
  // on_change called, as for a watch event).
  bool Update(const nlohmann::json& object);

  // The store key of an object: "namespace/name" (or "name").
  static std::string KeyOf(const nlohmann::json& object);

 private:
  absl::Status ListIntoStore(std::string* resource_version);
  // Stores (or removes, for kDeleted) one object; false if nothing changed.
  // own_write: our write's answer (Update), not a watch event: skipped if
  // the store or the watch is already at its resourceVersion or later.
  bool Apply(WatchEventType type, nlohmann::json* object, bool own_write = false);
  // Records that the watch (or a list) has delivered `resource_version`.
  void Delivered(const std::string& resource_version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `key` from the index of job `old_job` to that of `new_job` ("" = none).
  void Index(const std::string& key, const std::string& old_job, const std::string& new_job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  KubeClient* const client_;
  const InformerOptions options_;
  const InformerHandler on_change_;

  std::atomic<bool> synced_{false};
  std::atomic<int64_t> relists_{0}, watch_restarts_{0};

  // One stored object: what is read of it without unpacking, and the packed object.
  struct Entry {
    std::string job;  // job_of(object)
    std::string resource_version;
    std::string packed;  // MessagePack
  };
  static nlohmann::json Unpack(const Entry& e);

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> by_job_ ABSL_GUARDED_BY(mu_);
  // The latest resourceVersion the list or the watch delivered (0: none, or
  // not an integer): a write answered with one at or below it is already
  // reflected in the store.
  int64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_INFORMER_H_
