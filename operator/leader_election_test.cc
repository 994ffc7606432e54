#include "operator/leader_election.h"

#include <gtest/gtest.h>

#include "operator/fake_kube_client.h"

namespace kubetrain {
namespace {

TEST(LeaderElectionTest, OneHolderAtATimeAndTakeoverAfterExpiry) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  LeaseOptions a{"kube-system", "kubetrain", "a", absl::Seconds(15), absl::Seconds(2)};
  LeaseOptions b = a;
  b.identity = "b";
  LeaderElector ea(&kube, &clock, a), eb(&kube, &clock, b);
  ASSERT_TRUE(ea.TryAcquireOrRenew().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(eb.TryAcquireOrRenew()));
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(ea.TryAcquireOrRenew().ok());  // renewal
  clock.Advance(absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(eb.TryAcquireOrRenew()));  // renewed 10 s ago
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(eb.TryAcquireOrRenew().ok());  // a stopped renewing 16 s ago
  EXPECT_TRUE(absl::IsFailedPrecondition(ea.TryAcquireOrRenew()));
  auto lease = kube.Get({"/apis/coordination.k8s.io/v1", "leases", "kube-system", "kubetrain", ""});
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "b");
  EXPECT_EQ((*lease)["spec"]["leaseTransitions"], 1);
}

}  // namespace
}  // namespace kubetrain
