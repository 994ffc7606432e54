// ThrottledKubeClient: a forwarding KubeClient (leveldb's EnvWrapper style)
// that takes a token from a TokenBucket before every request, a watch's
// start included (--kube-api-qps / --kube-api-burst), and counts requests by
// verb and resource, errors by code, and the time spent waiting for tokens
// (kubetrain_operator_api_requests_total{verb,resource,code},
// kubetrain_operator_api_throttle_seconds_total). Thread-safe if `base` is.
#ifndef KUBETRAIN_OPERATOR_THROTTLED_KUBE_CLIENT_H_
#define KUBETRAIN_OPERATOR_THROTTLED_KUBE_CLIENT_H_

#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "operator/kube_client.h"
#include "operator/rate_limiter.h"

namespace kubetrain {

class ThrottledKubeClient final : public KubeClient {
 public:
  // `base` and `bucket` must outlive this object; metrics go to `registry`.
  ThrottledKubeClient(KubeClient* base, TokenBucket* bucket, prometheus::Registry& registry);

  absl::StatusOr<nlohmann::json> Get(const ResourceRef& ref) override;
  absl::StatusOr<nlohmann::json> List(const ResourceRef& ref,
                                      const std::string& label_selector) override;
  absl::StatusOr<nlohmann::json> Create(const ResourceRef& ref,
                                        const nlohmann::json& object) override;
  absl::StatusOr<nlohmann::json> Replace(const ResourceRef& ref,
                                         const nlohmann::json& object) override;
  absl::StatusOr<nlohmann::json> MergePatch(const ResourceRef& ref,
                                            const nlohmann::json& patch) override;
  absl::Status Delete(const ResourceRef& ref, const std::string& propagation_policy) override;
  absl::Status Watch(const ResourceRef& ref, const std::string& label_selector,
                     const std::string& resource_version,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     int timeout_seconds) override;

 private:
  void Throttle();
  void Count(const char* verb, const ResourceRef& ref, const absl::Status& status);

  // Constant after construction.
  KubeClient* const base_;
  TokenBucket* const bucket_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& throttle_seconds_;
  prometheus::Counter& throttled_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_THROTTLED_KUBE_CLIENT_H_
