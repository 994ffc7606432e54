// The controller over the fake API server: informers, work queue, parallel
// workers and the reconciler together, driven only by watch events.
#include "operator/controller.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"
#include "operator/fake_kube_client.h"

namespace kubetrain {
namespace {

using nlohmann::json;

json Job(const std::string& name, int workers) {
  return {{"apiVersion", "kubetrain.io/v1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"generation", 1}}},
          {"spec",
           {{"replicaSpecs", {{"PS", {{"replicas", 1}}}, {"Worker", {{"replicas", workers}}}}},
            {"training", {{"model", {{"type", "softmax"}}}, {"steps", 10}}}}}};
}

bool WaitFor(const std::function<bool()>& pred) {
  for (absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

TEST(ControllerTest, EventsDriveManyJobsWithoutListsAndDeletedObjectsComeBack) {
  FakeKubeClient kube;
  RealClock clock;
  Expectations expectations(&clock, absl::Seconds(30));
  JobCache cache(&kube, "", 2, &expectations);
  Reconciler reconciler(&kube, &cache, &expectations, OperatorConfig{}, &clock);
  prometheus::Registry registry;
  ControllerOptions options;
  options.workers = 4;
  Controller controller(&cache, &reconciler, &expectations, &clock, options, registry);
  std::atomic<bool> stop{false};
  std::thread run([&] { controller.Run(&stop); });
  ASSERT_TRUE(WaitFor([&] { return controller.synced(); }));
  const int lists_at_sync = kube.calls("list");
  EXPECT_EQ(lists_at_sync, 6);  // one per kind
  constexpr int kJobs = 20;
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(kube.Create(TrainingJobs("default"), Job("j" + std::to_string(i), 4)).ok());
  }
  const char* pods = "/api/v1/namespaces/default/pods";
  const char* services = "/api/v1/namespaces/default/services";
  ASSERT_TRUE(
      WaitFor([&] { return kube.Count(pods) == kJobs * 5 && kube.Count(services) == kJobs * 5; }));
  EXPECT_EQ(kube.calls("create", "pods"), kJobs * 5);  // each exactly once
  // A deleted Service and ConfigMap are recreated from their delete events alone.
  ASSERT_TRUE(kube.Delete({"/api/v1", "services", "default", "j3-worker-2", ""}, "").ok());
  ASSERT_TRUE(kube.Delete({"/api/v1", "configmaps", "default", "j4-config", ""}, "").ok());
  ASSERT_TRUE(WaitFor([&] {
    return kube.Get({"/api/v1", "services", "default", "j3-worker-2", ""}).ok() &&
           kube.Get({"/api/v1", "configmaps", "default", "j4-config", ""}).ok();
  }));
  // A deleted job takes its objects with it.
  ASSERT_TRUE(kube.Delete(TrainingJobs("default", "j0"), "").ok());
  ASSERT_TRUE(WaitFor([&] { return kube.Count(pods) == (kJobs - 1) * 5; }));
  // Idle: nothing changes, so nothing is sent (watches aside).
  absl::SleepFor(absl::Milliseconds(500));
  kube.ResetCalls();
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(kube.calls("create") + kube.calls("update") + kube.calls("patch") +
                kube.calls("delete") + kube.calls("get") + kube.calls("list"),
            0);
  stop = true;
  kube.Shutdown();
  run.join();
  EXPECT_EQ(kube.calls("list"), 0);  // never relisted
}

}  // namespace
}  // namespace kubetrain
