// KubeClient: the small Kubernetes API surface the kubetrain operator uses.
//
// The operator's logic talks only to this interface; RestKubeClient
// (rest_kube_client.h) implements it over HTTPS against a real API server and
// a unit test can implement it with an in-memory fake.
//
// Objects are plain JSON (nlohmann::json) exactly as the API server sends
// them; no typed structs.
//
// Error contract (every implementation must follow it; the operator's
// reconcile loop branches on the codes, never on messages):
//   absl::NotFoundError          404: the object (or namespace/type) does not exist
//   absl::AlreadyExistsError     409 reason AlreadyExists: Create of an existing name
//   absl::AbortedError           409 reason Conflict: stale metadata.resourceVersion
//                                on Replace (re-Get, reapply, retry)
//   absl::OutOfRangeError        410 Gone / Expired: a watch resourceVersion or a list
//                                continue token is too old; relist and rewatch
//   absl::PermissionDeniedError  403 (RBAC)
//   absl::UnauthenticatedError   401 (bad or expired credentials)
//   absl::InvalidArgumentError   400 / 422 (validation; the message says which field)
//   absl::UnavailableError       5xx, 429 and transport failures (retry with backoff)
//   absl::DeadlineExceededError  the client-side per-call deadline expired
// The status message always contains the API server's Status.message when
// there was one.
//
// Thread safety: implementations must be safe for concurrent calls from
// multiple threads without external synchronization.
#ifndef KUBETRAIN_OPERATOR_KUBE_CLIENT_H_
#define KUBETRAIN_OPERATOR_KUBE_CLIENT_H_

#include <cctype>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kubetrain {

// Names one object, or a collection when `name` is empty.
//   {"/api/v1", "configmaps", "default", "cfg", ""}
//       -> /api/v1/namespaces/default/configmaps/cfg
//   {"/apis/kubetrain.io/v1", "trainingjobs", "ns", "job", "status"}
//       -> /apis/kubetrain.io/v1/namespaces/ns/trainingjobs/job/status
// An empty namespace_ addresses cluster-scoped objects, or (for List/Watch)
// all namespaces.
struct ResourceRef {
  std::string api_path;     // "/api/v1" or "/apis/<group>/<version>"
  std::string plural;       // "configmaps", "pods", "trainingjobs"
  std::string namespace_;   // "" = cluster scope / all namespaces
  std::string name;         // "" = the collection
  std::string subresource;  // "" or e.g. "status"

  // The request path described above (no query string). Namespace, name and
  // subresource are percent-encoded (valid Kubernetes names never need it).
  std::string Path() const {
    std::string p = api_path;
    if (!namespace_.empty()) p += "/namespaces/" + Escape(namespace_);
    p += "/" + plural;
    if (!name.empty()) p += "/" + Escape(name);
    if (!subresource.empty()) p += "/" + Escape(subresource);
    return p;
  }
  // Human-readable form for log lines and error messages:
  // "configmaps default/cfg", "trainingjobs ns/job/status", "nodes".
  std::string DebugString() const {
    std::string s = plural;
    if (!namespace_.empty() || !name.empty()) s += " ";
    if (!namespace_.empty()) s += namespace_ + (name.empty() ? "" : "/");
    s += name;
    if (!subresource.empty()) s += "/" + subresource;
    return s;
  }

 private:
  static std::string Escape(const std::string& in) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : in) {
      if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == ':') {
        out += static_cast<char>(c);
      } else {
        out += '%';
        out += kHex[c >> 4];
        out += kHex[c & 15];
      }
    }
    return out;
  }
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

// "ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR".
inline const char* WatchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

// One line of a watch stream. For kBookmark, `object` carries only
// metadata.resourceVersion; for kError it is a meta/v1 Status.
struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  nlohmann::json object;
};

// Propagation policy for Delete. The test cluster has no garbage collector,
// so "Foreground"/"Orphan" would leave the owner stuck behind a finalizer;
// use Background (the default of every operator here).
inline constexpr char kPropagationBackground[] = "Background";

class KubeClient {
 public:
  virtual ~KubeClient() = default;

  // GET one object. REQUIRES: ref.name non-empty.
  virtual absl::StatusOr<nlohmann::json> Get(const ResourceRef& ref) = 0;

  // GET a collection (ref.name empty), optionally filtered by a label
  // selector ("app=x,role in (ps,worker)"; "" = everything). Pages internally
  // (limit/continue) and returns one List object: "items" holds every page's
  // items and "metadata.resourceVersion" is the list's resourceVersion, the
  // one to start a Watch from. If a continue token expires mid-way the list
  // is restarted once without paging.
  virtual absl::StatusOr<nlohmann::json> List(const ResourceRef& ref,
                                              const std::string& label_selector) = 0;

  // POST `object` to the collection (ref.name ignored; the name comes from
  // object.metadata.name or generateName). Returns the created object.
  // AlreadyExists if the name is taken.
  virtual absl::StatusOr<nlohmann::json> Create(const ResourceRef& ref,
                                                const nlohmann::json& object) = 0;

  // PUT `object` (including metadata.resourceVersion, for optimistic
  // concurrency). Aborted if the resourceVersion is stale. With
  // ref.subresource == "status" replaces only the status.
  virtual absl::StatusOr<nlohmann::json> Replace(const ResourceRef& ref,
                                                 const nlohmann::json& object) = 0;

  // PATCH with application/merge-patch+json (RFC 7386: null deletes a key,
  // arrays are replaced whole). Use ref.subresource = "status" to patch the
  // status of an object whose type has a status subresource. Returns the
  // patched object.
  virtual absl::StatusOr<nlohmann::json> MergePatch(const ResourceRef& ref,
                                                    const nlohmann::json& patch) = 0;

  // DELETE with the given propagation policy (use kPropagationBackground).
  // OK once the API server accepted the deletion (the object may linger
  // while finalizers run); NotFound if it did not exist.
  virtual absl::Status Delete(const ResourceRef& ref, const std::string& propagation_policy) = 0;

  // Streams changes to the collection `ref` (ref.name empty) that match
  // `label_selector`, starting just after `resource_version` (normally the
  // resourceVersion of a List; "" = synthetic ADDED events for the current
  // state first). Bookmarks are requested. Calls `on_event` for every event,
  // in order, on the calling thread; returning false stops the watch early
  // (the connection is closed) and Watch returns OK.
  //
  // Returns OK when the server ends the stream (after about timeout_seconds)
  // or on_event returned false: the caller resumes from the last
  // resourceVersion it saw. Returns OutOfRange when resource_version is too
  // old (HTTP 410, or an ERROR event with code 410 in the stream, which is
  // then not passed to on_event): the caller must relist. Other ERROR events
  // end the watch with the mapped status. Blocks for up to timeout_seconds
  // plus a grace period. REQUIRES: timeout_seconds > 0.
  virtual absl::Status Watch(const ResourceRef& ref, const std::string& label_selector,
                             const std::string& resource_version,
                             const std::function<bool(const WatchEvent&)>& on_event,
                             int timeout_seconds) = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_KUBE_CLIENT_H_
