#include "operator/informer.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "core/log.h"

namespace kubetrain {
namespace {

using nlohmann::json;

std::string ResourceVersionOf(const json& object) {
  return object.value("/metadata/resourceVersion"_json_pointer, std::string());
}

// resourceVersions are opaque, but every API server here (etcd-backed)
// issues increasing integers: when both parse, an older one never replaces
// a newer one (our own write's answer may arrive before the watch event of
// an earlier change).
bool Older(const std::string& a, const std::string& b) {
  int64_t x, y;
  return absl::SimpleAtoi(a, &x) && absl::SimpleAtoi(b, &y) && x < y;
}

}  // namespace

Informer::Informer(KubeClient* client, InformerOptions options, InformerHandler on_change)
    : client_(client), options_(std::move(options)), on_change_(std::move(on_change)) {}

std::string Informer::KeyOf(const json& object) {
  const json& md = object.value("metadata", json::object());
  const std::string ns = md.value("namespace", "");
  const std::string name = md.value("name", "");
  return ns.empty() ? name : ns + "/" + name;
}

nlohmann::json Informer::Unpack(const Entry& e) { return json::from_msgpack(e.packed); }

void Informer::Index(const std::string& key, const std::string& old_job,
                     const std::string& new_job) {
  if (old_job == new_job) return;
  if (!old_job.empty()) {
    auto it = by_job_.find(old_job);
    if (it != by_job_.end()) {
      it->second.erase(key);
      if (it->second.empty()) by_job_.erase(it);
    }
  }
  if (!new_job.empty()) by_job_[new_job].insert(key);
}

void Informer::Delivered(const std::string& resource_version) {
  int64_t v;
  if (absl::SimpleAtoi(resource_version, &v) && v > delivered_) delivered_ = v;
}

bool Informer::Apply(WatchEventType type, json* object, bool own_write) {
  const std::string rv = ResourceVersionOf(*object);
  if (options_.transform) options_.transform(object);
  const std::string key = KeyOf(*object);
  if (key.empty()) return false;
  Entry entry;
  if (type != WatchEventType::kDeleted) {
    if (options_.job_of) entry.job = options_.job_of(*object);
    entry.resource_version = rv;
    const std::vector<std::uint8_t> packed = json::to_msgpack(*object);
    entry.packed.assign(packed.begin(), packed.end());
  }
  absl::MutexLock l(&mu_);
  auto it = store_.find(key);
  if (own_write) {
    // Checked under the lock the watch applies its events under: either the
    // answer goes in first (and the watch's event for it changes nothing)
    // or the watch got there first and the answer is dropped.
    int64_t v;
    if (!absl::SimpleAtoi(rv, &v) || v <= delivered_) return false;
    if (it != store_.end() && !Older(it->second.resource_version, rv)) return false;
  } else if (!rv.empty()) {
    Delivered(rv);
  }
  if (type == WatchEventType::kDeleted) {
    if (it == store_.end()) return false;
    Index(key, it->second.job, "");
    store_.erase(it);
    return true;
  }
  if (it != store_.end()) {
    if (it->second.packed == entry.packed) return false;
    Index(key, it->second.job, entry.job);
    it->second = std::move(entry);
  } else {
    Index(key, "", entry.job);
    store_.emplace(key, std::move(entry));
  }
  return true;
}

bool Informer::Update(const json& object) {
  json copy = object;
  if (!Apply(WatchEventType::kModified, &copy, /*own_write=*/true)) return false;
  on_change_(WatchEventType::kModified, copy);
  return true;
}

absl::Status Informer::ListIntoStore(std::string* resource_version) {
  auto list = client_->List(options_.collection, options_.label_selector);
  if (!list.ok()) return list.status();
  *resource_version = (*list)["metadata"].value("resourceVersion", "");
  std::set<std::string> seen;
  std::vector<std::pair<WatchEventType, json>> changes;
  for (auto& item : (*list)["items"]) {
    json obj = std::move(item);
    const std::string key = KeyOf(obj);
    seen.insert(key);
    bool existed;
    {
      absl::MutexLock l(&mu_);
      existed = store_.count(key) > 0;
    }
    if (Apply(WatchEventType::kModified, &obj))
      changes.emplace_back(existed ? WatchEventType::kModified : WatchEventType::kAdded, obj);
  }
  // What vanished while we were not watching is deleted now (not our own
  // write answered after the list was taken: the watch brings it).
  std::vector<json> gone;
  {
    absl::MutexLock l(&mu_);
    Delivered(*resource_version);
    for (auto it = store_.begin(); it != store_.end();) {
      if (seen.count(it->first) || Older(*resource_version, it->second.resource_version)) {
        ++it;
        continue;
      }
      Index(it->first, it->second.job, "");
      gone.push_back(Unpack(it->second));
      it = store_.erase(it);
    }
  }
  for (auto& g : gone) changes.emplace_back(WatchEventType::kDeleted, std::move(g));
  synced_.store(true);
  for (const auto& [type, obj] : changes) on_change_(type, obj);
  return absl::OkStatus();
}

void Informer::Run(const std::atomic<bool>* stop) {
  const std::string& what = resource();
  absl::Duration backoff = absl::Milliseconds(200);
  std::string rv;
  bool listed = false;
  while (!stop->load()) {
    if (rv.empty()) {
      if (listed) relists_++;
      if (absl::Status s = ListIntoStore(&rv); !s.ok()) {
        Log("operator: list ", what, " failed: ", s.message(), "; retrying in ",
            absl::FormatDuration(backoff));
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, options_.max_backoff);
        rv.clear();
        continue;
      }
      listed = true;
    }
    absl::Status s = client_->Watch(
        options_.collection, options_.label_selector, rv,
        [&](const WatchEvent& e) {
          const std::string new_rv = ResourceVersionOf(e.object);
          if (!new_rv.empty()) rv = new_rv;
          if (e.type == WatchEventType::kBookmark) {
            absl::MutexLock l(&mu_);
            Delivered(new_rv);
            return !stop->load();
          }
          if (e.type == WatchEventType::kError) return !stop->load();
          try {
            json obj = e.object;
            if (Apply(e.type, &obj)) on_change_(e.type, obj);
          } catch (const std::exception& ex) {
            Log("operator: ignoring a malformed ", what, " event: ", ex.what());
          }
          return !stop->load();
        },
        options_.watch_timeout_seconds);
    if (stop->load()) break;
    watch_restarts_++;
    if (absl::IsOutOfRange(s)) {
      Log("operator: watch of ", what, " expired (", s.message(), "); relisting");
      rv.clear();
    } else if (!s.ok()) {
      Log("operator: watch of ", what, " failed: ", s.message(), "; relisting in ",
          absl::FormatDuration(backoff));
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff);
      rv.clear();  // no event is lost: the relist reports what changed
    } else {
      backoff = absl::Milliseconds(200);  // the server ended a healthy watch: resume from rv
    }
  }
}

std::optional<json> Informer::Get(const std::string& ns, const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = store_.find(ns.empty() ? name : ns + "/" + name);
  if (it == store_.end()) return std::nullopt;
  return Unpack(it->second);
}

std::vector<json> Informer::ByJob(const std::string& job_key) const {
  std::vector<json> out;
  absl::MutexLock l(&mu_);
  auto it = by_job_.find(job_key);
  if (it == by_job_.end()) return out;
  out.reserve(it->second.size());
  for (const auto& key : it->second) out.push_back(Unpack(store_.at(key)));
  return out;
}

std::vector<std::string> Informer::JobKeys() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const auto& [job, keys] : by_job_) out.push_back(job);
  return out;
}

size_t Informer::size() const {
  absl::MutexLock l(&mu_);
  return store_.size();
}

}  // namespace kubetrain
