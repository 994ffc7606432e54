// An in-memory KubeClient for unit tests: objects keyed by path, label
// selectors of the form "k=v[,k2=v2]", resourceVersion conflicts on Replace,
// AlreadyExists on Create. No watch (returns OK at once). Thread-safe.
#ifndef KUBETRAIN_OPERATOR_FAKE_KUBE_CLIENT_H_
#define KUBETRAIN_OPERATOR_FAKE_KUBE_CLIENT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "operator/kube_client.h"

namespace kubetrain {

class FakeKubeClient final : public KubeClient {
 public:
  absl::StatusOr<nlohmann::json> Get(const ResourceRef& ref) override {
    absl::MutexLock l(&mu_);
    ResourceRef base = ref;
    base.subresource.clear();
    auto it = objects_.find(base.Path());
    if (it == objects_.end()) return absl::NotFoundError(ref.DebugString() + " not found");
    return it->second;
  }
  absl::StatusOr<nlohmann::json> List(const ResourceRef& ref,
                                      const std::string& selector) override {
    absl::MutexLock l(&mu_);
    nlohmann::json items = nlohmann::json::array();
    const std::string prefix = ref.Path() + "/";
    for (const auto& [path, obj] : objects_) {
      if (path.rfind(prefix, 0) != 0 || path.find('/', prefix.size()) != std::string::npos)
        continue;
      if (Matches(obj, selector)) items.push_back(obj);
    }
    return nlohmann::json{{"items", items},
                          {"metadata", {{"resourceVersion", std::to_string(rv_)}}}};
  }
  absl::StatusOr<nlohmann::json> Create(const ResourceRef& ref,
                                        const nlohmann::json& object) override {
    absl::MutexLock l(&mu_);
    ++creates_;
    nlohmann::json obj = object;
    std::string name = obj["metadata"].value("name", "");
    if (name.empty()) name = obj["metadata"].value("generateName", "x") + std::to_string(rv_ + 1);
    obj["metadata"]["name"] = name;
    ResourceRef r = ref;
    r.name = name;
    if (objects_.count(r.Path()))
      return absl::AlreadyExistsError(r.DebugString() + " already exists");
    obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
    if (!obj["metadata"].contains("uid")) obj["metadata"]["uid"] = "uid-" + std::to_string(rv_);
    objects_[r.Path()] = obj;
    return obj;
  }
  absl::StatusOr<nlohmann::json> Replace(const ResourceRef& ref,
                                         const nlohmann::json& object) override {
    absl::MutexLock l(&mu_);
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
    return obj;
  }
  absl::StatusOr<nlohmann::json> MergePatch(const ResourceRef& ref,
                                            const nlohmann::json& patch) override {
    absl::MutexLock l(&mu_);
    ResourceRef base = ref;
    base.subresource.clear();
    auto it = objects_.find(base.Path());
    if (it == objects_.end()) return absl::NotFoundError(ref.DebugString());
    it->second.merge_patch(patch);
    it->second["metadata"]["resourceVersion"] = std::to_string(++rv_);
    return it->second;
  }
  absl::Status Delete(const ResourceRef& ref, const std::string&) override {
    absl::MutexLock l(&mu_);
    if (objects_.erase(ref.Path()) == 0) return absl::NotFoundError(ref.DebugString());
    ++deletes_;
    return absl::OkStatus();
  }
  absl::Status Watch(const ResourceRef&, const std::string&, const std::string&,
                     const std::function<bool(const WatchEvent&)>&, int) override {
    return absl::OkStatus();
  }

  // Test helpers.
  int creates() const {
    absl::MutexLock l(&mu_);
    return creates_;
  }
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

 private:
  static bool Matches(const nlohmann::json& obj, const std::string& selector) {
    if (selector.empty()) return true;
    const auto& labels = obj["metadata"].value("labels", nlohmann::json::object());
    for (absl::string_view term : absl::StrSplit(selector, ',')) {
      std::vector<std::string> kv = absl::StrSplit(term, '=');
      if (kv.size() != 2 || labels.value(kv[0], "") != kv[1]) return false;
    }
    return true;
  }
  mutable absl::Mutex mu_;
  std::map<std::string, nlohmann::json> objects_ ABSL_GUARDED_BY(mu_);
  int64_t rv_ ABSL_GUARDED_BY(mu_) = 100;
  int creates_ ABSL_GUARDED_BY(mu_) = 0;
  int deletes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_FAKE_KUBE_CLIENT_H_
