#include "operator/leader_election.h"

#include "absl/strings/str_cat.h"
#include "core/log.h"

namespace kubetrain {

using nlohmann::json;

namespace {

// metav1.MicroTime.
std::string MicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

}  // namespace

LeaderElector::LeaderElector(KubeClient* client, const Clock* clock, LeaseOptions options)
    : client_(client), clock_(clock), options_(std::move(options)) {}

LeaderElector::~LeaderElector() {
  if (renewer_.joinable()) renewer_.join();
}

void LeaderElector::StartRenewing(const std::atomic<bool>* stop,
                                  std::function<void(const absl::Status&)> on_lost) {
  renewer_ = std::thread([this, stop, on_lost = std::move(on_lost)] {
    absl::Status s = KeepRenewing(stop);
    if (!s.ok()) on_lost(s);
  });
}

absl::Status LeaderElector::TryAcquireOrRenew() {
  const ResourceRef ref{"/apis/coordination.k8s.io/v1", "leases", options_.namespace_,
                        options_.name, ""};
  const absl::Time now = clock_->Now();
  const int duration = static_cast<int>(absl::ToInt64Seconds(options_.lease_duration));
  auto lease = client_->Get(ref);
  if (absl::IsNotFound(lease.status())) {
    json fresh = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", options_.name}, {"namespace", options_.namespace_}}},
                  {"spec",
                   {{"holderIdentity", options_.identity},
                    {"leaseDurationSeconds", duration},
                    {"acquireTime", MicroTime(now)},
                    {"renewTime", MicroTime(now)},
                    {"leaseTransitions", 0}}}};
    ResourceRef collection = ref;
    collection.name.clear();
    auto created = client_->Create(collection, fresh);
    if (absl::IsAlreadyExists(created.status()))
      return absl::FailedPreconditionError("lost the race");
    return created.status();
  }
  if (!lease.ok()) return lease.status();
  json& spec = (*lease)["spec"];
  if (!spec.is_object()) spec = json::object();
  const std::string holder = spec.value("holderIdentity", "");
  absl::Time renewed = absl::InfinitePast();
  std::string err;
  absl::ParseTime(absl::RFC3339_full, spec.value("renewTime", ""), &renewed, &err);
  const absl::Duration held_for = absl::Seconds(spec.value("leaseDurationSeconds", duration));
  if (holder != options_.identity && !holder.empty() && now < renewed + held_for) {
    return absl::FailedPreconditionError(absl::StrCat("lease held by ", holder));
  }
  if (holder != options_.identity) {
    spec["acquireTime"] = MicroTime(now);
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = duration;
  spec["renewTime"] = MicroTime(now);
  auto replaced =
      client_->Replace(ref, *lease);  // resourceVersion guards against a racing candidate
  if (absl::IsAborted(replaced.status())) return absl::FailedPreconditionError("lost the race");
  return replaced.status();
}

absl::Status LeaderElector::Acquire(const std::atomic<bool>* stop) {
  bool told = false;
  while (!stop->load()) {
    absl::Status s = TryAcquireOrRenew();
    if (s.ok()) {
      Log("operator: ", options_.identity, " is the leader (lease ", options_.namespace_, "/",
          options_.name, ")");
      return s;
    }
    if (!told || !absl::IsFailedPrecondition(s)) {
      Log("operator: waiting for leadership: ", s.message());
      told = true;
    }
    absl::SleepFor(options_.renew_period);
  }
  return absl::CancelledError("stopped");
}

absl::Status LeaderElector::KeepRenewing(const std::atomic<bool>* stop) {
  absl::Time last_ok = clock_->Now();
  while (!stop->load()) {
    absl::SleepFor(options_.renew_period);
    absl::Status s = TryAcquireOrRenew();
    if (s.ok()) {
      last_ok = clock_->Now();
    } else if (absl::IsFailedPrecondition(s) ||
               clock_->Now() - last_ok >= options_.lease_duration) {
      return absl::AbortedError(absl::StrCat("leadership lost: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
