#include "operator/reconciler.h"

#include <gtest/gtest.h>

#include "operator/fake_kube_client.h"

namespace kubetrain {
namespace {

using nlohmann::json;

json Job() {
  return {{"apiVersion", "kubetrain.io/v1"},
          {"kind", "TrainingJob"},
          {"metadata",
           {{"name", "mnist"}, {"namespace", "default"}, {"uid", "job-uid"}, {"generation", 1}}},
          {"spec",
           {{"replicaSpecs", {{"PS", {{"replicas", 1}}}, {"Worker", {{"replicas", 2}}}}},
            {"training", {{"model", {{"type", "softmax"}}}, {"steps", 10}}}}}};
}

TEST(ReconcilerTest, CreatesEverythingOnceAndIsIdempotent) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  ASSERT_TRUE(kube.Create(TrainingJobs("default"), Job()).ok());
  Reconciler r(&kube, OperatorConfig{}, &clock);
  auto out = r.Reconcile("default", "mnist");
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/pods"), 3u);
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/services"), 3u);
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/configmaps"), 1u);
  EXPECT_GE(kube.Count("/api/v1/namespaces/default/events"), 1u);
  auto job = kube.Get(TrainingJobs("default", "mnist"));
  EXPECT_EQ((*job)["status"]["state"], "Created");
  // A second pass (or a restarted operator) creates nothing new.
  int creates = kube.creates();
  out = r.Reconcile("default", "mnist");
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube.creates(), creates);
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/pods"), 3u);
}

TEST(ReconcilerTest, ObservedPodStatusDrivesTheJobAndDeletedJobsLeaveNothing) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  ASSERT_TRUE(kube.Create(TrainingJobs("default"), Job()).ok());
  OperatorConfig config;
  config.cleanup_grace = absl::ZeroDuration();
  Reconciler r(&kube, config, &clock);
  ASSERT_TRUE(r.Reconcile("default", "mnist").status.ok());
  // The chief pod succeeds with a result in its termination message.
  ResourceRef chief{"/api/v1", "pods", "default", "mnist-worker-0", ""};
  ASSERT_TRUE(
      kube.MergePatch(
              chief,
              {{"status",
                {{"phase", "Succeeded"},
                 {"containerStatuses",
                  json::array(
                      {{{"name", "kubetrain"},
                        {"restartCount", 0},
                        {"state",
                         {{"terminated",
                           {{"exitCode", 0}, {"message", "{\"test_accuracy\":0.9}"}}}}}}})}}}})
          .ok());
  auto out = r.Reconcile("default", "mnist");
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.state, "Succeeded");
  auto job = kube.Get(TrainingJobs("default", "mnist"));
  EXPECT_EQ((*job)["status"]["result"]["testAccuracy"], 0.9);
  ASSERT_TRUE(r.Reconcile("default", "mnist").status.ok());  // the cleanup pass
  // cleanPodPolicy Running: pods still Pending/Running were deleted; the chief stays.
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/pods"), 1u);
  // The job is deleted: its children go too (no garbage collector needed).
  ASSERT_TRUE(kube.Delete(TrainingJobs("default", "mnist"), kPropagationBackground).ok());
  ASSERT_TRUE(r.Reconcile("default", "mnist").status.ok());
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/pods"), 0u);
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/services"), 0u);
  EXPECT_EQ(kube.Count("/api/v1/namespaces/default/configmaps"), 0u);
}

TEST(ReconcilerTest, ProgressIsReadFromTheChiefTasksPod) {
  FakeKubeClient kube;
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  json job = Job();
  job["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  ASSERT_TRUE(kube.Create(TrainingJobs("default"), job).ok());
  std::vector<std::string> asked;
  Reconciler r(&kube, OperatorConfig{}, &clock,
               [&](const std::string& ip) -> std::optional<Progress> {
                 asked.push_back(ip);
                 Progress p;
                 p.global_step = 7;
                 return p;
               });
  ASSERT_TRUE(r.Reconcile("default", "mnist").status.ok());
  for (const char* pod : {"mnist-chief-0", "mnist-worker-0"}) {
    ASSERT_TRUE(
        kube.MergePatch({"/api/v1", "pods", "default", pod, ""},
                        {{"status",
                          {{"phase", "Running"},
                           {"podIP", std::string("10.0.0.") + (pod[6] == 'c' ? "1" : "2")}}}})
            .ok());
  }
  ASSERT_TRUE(r.Reconcile("default", "mnist").status.ok());
  EXPECT_EQ(asked, std::vector<std::string>{"10.0.0.1"});  // the Chief, not worker 0
  EXPECT_EQ((*kube.Get(TrainingJobs("default", "mnist")))["status"]["progress"]["globalStep"], 7);
}

TEST(ReconcilerTest, MalformedObjectIsAnErrorNotACrash) {
  FakeKubeClient kube;
  FakeClock clock;
  json bad = Job();
  bad["metadata"]["generation"] = "not-a-number";
  ASSERT_TRUE(kube.Create(TrainingJobs("default"), bad).ok());
  Reconciler r(&kube, OperatorConfig{}, &clock);
  auto out = r.Reconcile("default", "mnist");
  EXPECT_FALSE(out.status.ok());
}

}  // namespace
}  // namespace kubetrain
