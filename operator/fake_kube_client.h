// An in-memory KubeClient for unit tests: objects keyed by path, label
// selectors of the form "k=v[,k2=v2]" or "k" (the label exists),
// resourceVersion conflicts on Replace, AlreadyExists on Create, and a watch
// that streams every change (ADDED/MODIFIED/DELETED, in resourceVersion
// order) from the resourceVersion asked for; Compact() makes older
// resourceVersions answer 410 (OutOfRange), as the API server's does after
// its history window. Every call is counted per verb and resource (calls()),
// so a test can prove a code path never LISTs. Thread-safe.
#ifndef KUBETRAIN_OPERATOR_FAKE_KUBE_CLIENT_H_
#define KUBETRAIN_OPERATOR_FAKE_KUBE_CLIENT_H_

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "operator/kube_client.h"

namespace kubetrain {

class FakeKubeClient final : public KubeClient {
 public:
  absl::StatusOr<nlohmann::json> Get(const ResourceRef& ref) override {
    absl::MutexLock l(&mu_);
    Count("get", ref);
    if (auto s = InjectedLocked("get", ref); !s.ok()) return s;
    ResourceRef base = ref;
    base.subresource.clear();
    auto it = objects_.find(base.Path());
    if (it == objects_.end()) return absl::NotFoundError(ref.DebugString() + " not found");
    return it->second;
  }
  absl::StatusOr<nlohmann::json> List(const ResourceRef& ref,
                                      const std::string& selector) override {
    absl::MutexLock l(&mu_);
    Count("list", ref);
    if (auto s = InjectedLocked("list", ref); !s.ok()) return s;
    nlohmann::json items = nlohmann::json::array();
    for (const auto& [path, obj] : objects_) {
      if (InCollection(path, ref) && Matches(obj, selector)) items.push_back(obj);
    }
    return nlohmann::json{{"items", items},
                          {"metadata", {{"resourceVersion", std::to_string(rv_)}}}};
  }
  absl::StatusOr<nlohmann::json> Create(const ResourceRef& ref,
                                        const nlohmann::json& object) override {
    absl::MutexLock l(&mu_);
    Count("create", ref);
    if (auto s = InjectedLocked("create", ref); !s.ok()) return s;
    nlohmann::json obj = object;
    std::string name = obj["metadata"].value("name", "");
    if (name.empty()) name = obj["metadata"].value("generateName", "x") + std::to_string(rv_ + 1);
    obj["metadata"]["name"] = name;
    if (!ref.namespace_.empty()) obj["metadata"]["namespace"] = ref.namespace_;
    ResourceRef r = ref;
    r.name = name;
    if (objects_.count(r.Path()))
      return absl::AlreadyExistsError(r.DebugString() + " already exists");
    obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
    if (!obj["metadata"].contains("uid")) obj["metadata"]["uid"] = "uid-" + std::to_string(rv_);
    objects_[r.Path()] = obj;
    Record(WatchEventType::kAdded, r, obj);
    return obj;
  }
  absl::StatusOr<nlohmann::json> Replace(const ResourceRef& ref,
                                         const nlohmann::json& object) override {
    absl::MutexLock l(&mu_);
    Count("update", ref);
    if (auto s = InjectedLocked("update", ref); !s.ok()) return s;
    ResourceRef base = ref;
    base.subresource.clear();
    auto it = objects_.find(base.Path());
    if (it == objects_.end()) return absl::NotFoundError(ref.DebugString());
    if (object["metadata"].value("resourceVersion", "") !=
        it->second["metadata"].value("resourceVersion", "")) {
      return absl::AbortedError("the object has been modified");
    }
    nlohmann::json obj = it->second;
    if (ref.subresource == "status") {
      obj["status"] = object["status"];
    } else {
      obj = object;
    }
    obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
    it->second = obj;
    Record(WatchEventType::kModified, base, obj);
    return obj;
  }
  absl::StatusOr<nlohmann::json> MergePatch(const ResourceRef& ref,
                                            const nlohmann::json& patch) override {
    absl::MutexLock l(&mu_);
    Count("patch", ref);
    if (auto s = InjectedLocked("patch", ref); !s.ok()) return s;
    ResourceRef base = ref;
    base.subresource.clear();
    auto it = objects_.find(base.Path());
    if (it == objects_.end()) return absl::NotFoundError(ref.DebugString());
    it->second.merge_patch(patch);
    it->second["metadata"]["resourceVersion"] = std::to_string(++rv_);
    Record(WatchEventType::kModified, base, it->second);
    return it->second;
  }
  absl::Status Delete(const ResourceRef& ref, const std::string&) override {
    absl::MutexLock l(&mu_);
    Count("delete", ref);
    if (auto s = InjectedLocked("delete", ref); !s.ok()) return s;
    auto it = objects_.find(ref.Path());
    if (it == objects_.end()) return absl::NotFoundError(ref.DebugString());
    nlohmann::json gone = it->second;
    objects_.erase(it);
    ++deletes_;
    gone["metadata"]["resourceVersion"] = std::to_string(++rv_);
    Record(WatchEventType::kDeleted, ref, gone);
    return absl::OkStatus();
  }
  // Streams the recorded changes after `resource_version` ("" = the current
  // state as ADDED first), waiting up to timeout_seconds (real time) for new
  // ones; ends early once on_event returns false or Shutdown() was called.
  absl::Status Watch(const ResourceRef& ref, const std::string& selector,
                     const std::string& resource_version,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     int timeout_seconds) override {
    std::vector<WatchEvent> batch;
    size_t next = 0;
    {
      absl::MutexLock l(&mu_);
      Count("watch", ref);
      if (auto s = InjectedLocked("watch", ref); !s.ok()) return s;
      if (resource_version.empty()) {
        for (const auto& [path, obj] : objects_) {
          if (InCollection(path, ref) && Matches(obj, selector))
            batch.push_back({WatchEventType::kAdded, obj});
        }
        next = log_.size();
      } else {
        const int64_t from = std::stoll(resource_version);
        if (from < compacted_rv_) {
          return absl::OutOfRangeError("too old resource version: " + resource_version);
        }
        while (next < log_.size() && log_[next].rv <= from) ++next;
      }
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(timeout_seconds);
    while (true) {
      for (const auto& e : batch) {
        if (!on_event(e)) return absl::OkStatus();
      }
      batch.clear();
      absl::MutexLock l(&mu_);
      auto more = [&] { return shutdown_ || (next < log_.size() && !held_.count(ref.plural)); };
      mu_.AwaitWithDeadline(absl::Condition(&more), deadline);
      if (shutdown_ || next >= log_.size() || held_.count(ref.plural)) return absl::OkStatus();
      for (; next < log_.size(); ++next) {
        const LogEntry& e = log_[next];
        if (InCollection(e.path, ref) && Matches(e.object, selector))
          batch.push_back({e.type, e.object});
      }
    }
  }

  // Test helpers.
  int deletes() const {
    absl::MutexLock l(&mu_);
    return deletes_;
  }
  size_t Count(const std::string& collection_path) const {
    absl::MutexLock l(&mu_);
    size_t n = 0;
    for (const auto& [path, obj] : objects_) {
      if (path.rfind(collection_path + "/", 0) == 0 &&
          path.find('/', collection_path.size() + 1) == std::string::npos)
        ++n;
    }
    return n;
  }
  // Calls of `verb` ("get", "list", "create", "update", "patch", "delete",
  // "watch") on `plural` ("" = any) since construction or ResetCalls().
  int calls(const std::string& verb, const std::string& plural = "") const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const auto& [k, c] : calls_) {
      if (k.first == verb && (plural.empty() || k.second == plural)) n += c;
    }
    return n;
  }
  void ResetCalls() {
    absl::MutexLock l(&mu_);
    calls_.clear();
  }
  // Watches from a resourceVersion older than now get OutOfRange (410).
  void Compact() {
    absl::MutexLock l(&mu_);
    compacted_rv_ = rv_ + 1;
  }
  // Every later call of `verb` on `plural` fails with `status` (OK clears).
  void FailCalls(const std::string& verb, const std::string& plural, absl::Status status) {
    absl::MutexLock l(&mu_);
    if (status.ok()) {
      injected_.erase({verb, plural});
    } else {
      injected_[{verb, plural}] = status;
    }
  }
  // While held, watches of `plural` deliver nothing (they end at their
  // timeout; later ones resume from where they were).
  void HoldWatches(const std::string& plural, bool hold) {
    absl::MutexLock l(&mu_);
    if (hold) {
      held_.insert(plural);
    } else {
      held_.erase(plural);
    }
  }
  // Ends every watch now and every later one at once.
  void Shutdown() {
    absl::MutexLock l(&mu_);
    shutdown_ = true;
  }

 private:
  struct LogEntry {
    int64_t rv;
    WatchEventType type;
    std::string path;
    nlohmann::json object;
  };
  // True if the object at `path` belongs to the collection `ref` (all
  // namespaces when ref.namespace_ is empty).
  static bool InCollection(const std::string& path, const ResourceRef& ref) {
    const std::string tail = "/" + ref.plural + "/";
    if (!ref.namespace_.empty()) {
      const std::string prefix = ref.Path() + "/";
      return path.rfind(prefix, 0) == 0 && path.find('/', prefix.size()) == std::string::npos;
    }
    const size_t at = path.rfind(tail);
    if (at == std::string::npos || path.rfind(ref.api_path + "/", 0) != 0) return false;
    const std::string middle = path.substr(ref.api_path.size(), at - ref.api_path.size());
    return middle.empty() || (middle.rfind("/namespaces/", 0) == 0 &&
                              middle.find('/', sizeof("/namespaces/") - 1) == std::string::npos);
  }
  static bool Matches(const nlohmann::json& obj, const std::string& selector) {
    if (selector.empty()) return true;
    const auto& labels = obj["metadata"].value("labels", nlohmann::json::object());
    for (absl::string_view term : absl::StrSplit(selector, ',')) {
      std::vector<std::string> kv = absl::StrSplit(term, '=');
      if (kv.size() == 1) {
        if (!labels.contains(kv[0])) return false;
      } else if (kv.size() != 2 || labels.value(kv[0], "") != kv[1]) {
        return false;
      }
    }
    return true;
  }
  void Count(const std::string& verb, const ResourceRef& ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls_[{verb, ref.plural}]++;
  }
  absl::Status InjectedLocked(const std::string& verb, const ResourceRef& ref) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = injected_.find({verb, ref.plural});
    return it == injected_.end() ? absl::OkStatus() : it->second;
  }
  void Record(WatchEventType type, const ResourceRef& ref, const nlohmann::json& obj)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ResourceRef r = ref;
    r.subresource.clear();
    log_.push_back({rv_, type, r.Path(), obj});
  }

  mutable absl::Mutex mu_;
  std::map<std::string, nlohmann::json> objects_ ABSL_GUARDED_BY(mu_);
  std::vector<LogEntry> log_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, int> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, absl::Status> injected_ ABSL_GUARDED_BY(mu_);
  int64_t rv_ ABSL_GUARDED_BY(mu_) = 100;
  int64_t compacted_rv_ ABSL_GUARDED_BY(mu_) = 0;
  int deletes_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> held_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_FAKE_KUBE_CLIENT_H_
