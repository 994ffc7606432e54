#include "operator/throttled_kube_client.h"

#include "absl/status/status.h"

namespace kubetrain {

ThrottledKubeClient::ThrottledKubeClient(KubeClient* base, TokenBucket* bucket,
                                         prometheus::Registry& registry)
    : base_(base),
      bucket_(bucket),
      requests_(prometheus::BuildCounter()
                    .Name("kubetrain_operator_api_requests_total")
                    .Help("Requests to the API server by verb, resource and result code")
                    .Register(registry)),
      throttle_seconds_(prometheus::BuildCounter()
                            .Name("kubetrain_operator_api_throttle_seconds_total")
                            .Help("Time requests waited for the client-side rate limit "
                                  "(--kube-api-qps, --kube-api-burst)")
                            .Register(registry)
                            .Add({})),
      throttled_(prometheus::BuildCounter()
                     .Name("kubetrain_operator_api_throttled_requests_total")
                     .Help("Requests that had to wait for the client-side rate limit")
                     .Register(registry)
                     .Add({})) {}

void ThrottledKubeClient::Throttle() {
  const absl::Duration waited = bucket_->Wait();
  if (waited > absl::ZeroDuration()) {
    throttled_.Increment();
    throttle_seconds_.Increment(absl::ToDoubleSeconds(waited));
  }
}

void ThrottledKubeClient::Count(const char* verb, const ResourceRef& ref,
                                const absl::Status& status) {
  const std::string resource =
      ref.subresource.empty() ? ref.plural : ref.plural + "/" + ref.subresource;
  requests_
      .Add({{"verb", verb},
            {"resource", resource},
            {"code", absl::StatusCodeToString(status.code())}})
      .Increment();
}

absl::StatusOr<nlohmann::json> ThrottledKubeClient::Get(const ResourceRef& ref) {
  Throttle();
  auto r = base_->Get(ref);
  Count("get", ref, r.status());
  return r;
}

absl::StatusOr<nlohmann::json> ThrottledKubeClient::List(const ResourceRef& ref,
                                                         const std::string& label_selector) {
  Throttle();
  auto r = base_->List(ref, label_selector);
  Count("list", ref, r.status());
  return r;
}

absl::StatusOr<nlohmann::json> ThrottledKubeClient::Create(const ResourceRef& ref,
                                                           const nlohmann::json& object) {
  Throttle();
  auto r = base_->Create(ref, object);
  Count("create", ref, r.status());
  return r;
}

absl::StatusOr<nlohmann::json> ThrottledKubeClient::Replace(const ResourceRef& ref,
                                                            const nlohmann::json& object) {
  Throttle();
  auto r = base_->Replace(ref, object);
  Count("update", ref, r.status());
  return r;
}

absl::StatusOr<nlohmann::json> ThrottledKubeClient::MergePatch(const ResourceRef& ref,
                                                               const nlohmann::json& patch) {
  Throttle();
  auto r = base_->MergePatch(ref, patch);
  Count("patch", ref, r.status());
  return r;
}

absl::Status ThrottledKubeClient::Delete(const ResourceRef& ref,
                                         const std::string& propagation_policy) {
  Throttle();
  absl::Status s = base_->Delete(ref, propagation_policy);
  Count("delete", ref, s);
  return s;
}

absl::Status ThrottledKubeClient::Watch(const ResourceRef& ref, const std::string& label_selector,
                                        const std::string& resource_version,
                                        const std::function<bool(const WatchEvent&)>& on_event,
                                        int timeout_seconds) {
  Throttle();
  absl::Status s = base_->Watch(ref, label_selector, resource_version, on_event, timeout_seconds);
  Count("watch", ref, s);
  return s;
}

}  // namespace kubetrain
