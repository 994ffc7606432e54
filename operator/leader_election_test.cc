#include "operator/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/notification.h"

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

TEST(LeaderElectionTest, RenewingInTheBackgroundReportsALostLease) {
  FakeKubeClient kube;
  RealClock clock;
  LeaseOptions a{"kube-system", "kubetrain", "a", absl::Seconds(15), absl::Milliseconds(10)};
  std::atomic<bool> stop{false};
  absl::Notification lost;
  absl::Status why;
  {
    LeaderElector elector(&kube, &clock, a);
    ASSERT_TRUE(elector.Acquire(&stop).ok());
    elector.StartRenewing(&stop, [&](const absl::Status& s) {
      why = s;
      lost.Notify();
    });
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_FALSE(lost.HasBeenNotified());  // renewing fine
    // Another replica takes the lease over (as after a partition).
    const ResourceRef ref{"/apis/coordination.k8s.io/v1", "leases", "kube-system", "kubetrain", ""};
    absl::Status taken = absl::AbortedError("not tried");
    for (int i = 0; i < 100 && absl::IsAborted(taken); ++i) {  // a conflict with a's renewal: again
      auto lease = kube.Get(ref);
      ASSERT_TRUE(lease.ok());
      (*lease)["spec"]["holderIdentity"] = "b";
      (*lease)["spec"]["renewTime"] =
          absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
      taken = kube.Replace(ref, *lease).status();
    }
    ASSERT_TRUE(taken.ok()) << taken;
    ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(absl::IsAborted(why)) << why;
  }  // the destructor joins the (ended) renewer
}

TEST(LeaderElectionTest, StopEndsTheRenewerQuietly) {
  FakeKubeClient kube;
  RealClock clock;
  LeaseOptions a{"kube-system", "kubetrain", "a", absl::Seconds(15), absl::Milliseconds(10)};
  std::atomic<bool> stop{false};
  bool lost = false;
  {
    LeaderElector elector(&kube, &clock, a);
    ASSERT_TRUE(elector.Acquire(&stop).ok());
    elector.StartRenewing(&stop, [&](const absl::Status&) { lost = true; });
    absl::SleepFor(absl::Milliseconds(30));
    stop = true;
  }
  EXPECT_FALSE(lost);
}

}  // namespace
}  // namespace kubetrain
