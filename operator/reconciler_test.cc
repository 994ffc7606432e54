#include "operator/reconciler.h"

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/job_credentials.h"
#include "operator/fake_kube_client.h"
#include "operator/status.h"

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

const char kPods[] = "/api/v1/namespaces/default/pods";
const char kServices[] = "/api/v1/namespaces/default/services";
const char kConfigMaps[] = "/api/v1/namespaces/default/configmaps";
const char kSecrets[] = "/api/v1/namespaces/default/secrets";
const char kNetworkPolicies[] = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies";
const ResourceRef kAuthSecret{"/api/v1", "secrets", "default", "mnist-auth", ""};

// A reconciler over the fake API server, reading a real informer cache fed by
// the fake's watch.
class ReconcilerTest : public ::testing::Test {
 protected:
  void Start(OperatorConfig config = OperatorConfig{}, TaskMetricsReader metrics = nullptr) {
    cache_ = std::make_unique<JobCache>(&kube_, "", 5, &expectations_);
    reconciler_ = std::make_unique<Reconciler>(&kube_, cache_.get(), &expectations_, config,
                                               &clock_, metrics);
    cache_->Start(&stop_);
    ASSERT_TRUE(WaitFor([&] { return cache_->synced(); }));
  }
  void TearDown() override {
    stop_ = true;
    kube_.Shutdown();
    if (cache_) cache_->Join();
    for (auto& c : retired_caches_) c->Join();
  }
  static bool WaitFor(const std::function<bool()>& pred) {
    for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return pred();
  }
  // Waits until the cache holds what the fake holds for the job, then
  // reconciles once; counts the requests of that reconcile alone.
  ReconcileOutcome Pass() {
    EXPECT_TRUE(WaitFor([&] {
      auto job = kube_.Get(TrainingJobs("default", "mnist"));
      auto cached = cache_->Job("default", "mnist");
      const bool job_same = job.ok() == cached.has_value() &&
                            (!job.ok() || (*job)["metadata"]["resourceVersion"] ==
                                              (*cached)["metadata"]["resourceVersion"]);
      return job_same && expectations_.pending() == 0 &&
             cache_->Pods("default/mnist").size() == kube_.Count(kPods) &&
             cache_->Services("default/mnist").size() == kube_.Count(kServices) &&
             cache_->ConfigMaps("default/mnist").size() == kube_.Count(kConfigMaps) &&
             cache_->Secrets("default/mnist").size() == kube_.Count(kSecrets) &&
             cache_->NetworkPolicies("default/mnist").size() == kube_.Count(kNetworkPolicies) &&
             SecretCached();
    }));
    kube_.ResetCalls();
    ReconcileOutcome out = reconciler_->Reconcile("default", "mnist");
    reconciler_->FlushEvents();
    // The point of the cache: a reconcile never lists and never reads. (The
    // PodGroup informer a reconcile starts after its first PodGroup create
    // lists once, on its own thread.)
    EXPECT_EQ(kube_.calls("list") - kube_.calls("list", "podgroups"), 0);
    EXPECT_LE(kube_.calls("list", "podgroups"), 1);
    EXPECT_EQ(kube_.calls("get"), 0);
    return out;
  }
  // The cache holds the Secret's current keys (a patch may lag).
  bool SecretCached() {
    auto secret = kube_.Get(kAuthSecret);
    for (const auto& s : cache_->Secrets("default/mnist")) {
      if (!secret.ok()) return false;
      return s["metadata"]["resourceVersion"] == (*secret)["metadata"]["resourceVersion"];
    }
    return !secret.ok();
  }
  // A new job's first passes: its Secret (and the rest), then its pods.
  void Launch() {
    ASSERT_TRUE(Pass().status.ok());
    ASSERT_TRUE(Pass().status.ok());
    ASSERT_GT(kube_.Count(kPods), 0u);
  }

  // A restarted operator: a fresh cache (listed anew) and reconciler, nothing
  // remembered. The old ones end with the fixture.
  void Restart(OperatorConfig config = OperatorConfig{}) {
    retired_caches_.push_back(std::move(cache_));
    retired_reconcilers_.push_back(std::move(reconciler_));
    Start(config);
  }

  FakeKubeClient kube_;
  FakeClock clock_{absl::FromUnixSeconds(1800000000)};
  Expectations expectations_{&clock_, absl::Seconds(30)};
  std::atomic<bool> stop_{false};
  std::unique_ptr<JobCache> cache_;
  std::unique_ptr<Reconciler> reconciler_;
  std::vector<std::unique_ptr<JobCache>> retired_caches_;
  std::vector<std::unique_ptr<Reconciler>> retired_reconcilers_;
};

TEST_F(ReconcilerTest, CreatesEverythingOnceFromTheCacheAndIsIdempotent) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.Count(kServices), 3u);
  EXPECT_EQ(kube_.Count(kConfigMaps), 1u);
  EXPECT_EQ(kube_.Count(kSecrets), 1u);
  EXPECT_EQ(kube_.Count(kNetworkPolicies), 1u);
  // The pods wait for the cache to show the Secret, which it does from the
  // create's answer: they go in the same pass, with one status write.
  EXPECT_EQ(kube_.Count(kPods), 3u);
  EXPECT_EQ(kube_.calls("create", "pods"), 3);
  EXPECT_EQ(kube_.calls("create", "secrets"), 1);
  EXPECT_EQ(kube_.calls("update", "trainingjobs"), 1);
  auto job = kube_.Get(TrainingJobs("default", "mnist"));
  EXPECT_EQ((*job)["status"]["state"], "Created");
  // Created + one aggregated SuccessfulCreatePod + one SuccessfulCreateService.
  EXPECT_EQ(kube_.Count("/api/v1/namespaces/default/events"), 3u);
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create"), 0);
  EXPECT_EQ(kube_.Count(kPods), 3u);
  // A third pass creates nothing and, with nothing changed, sends nothing.
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create"), 0);
  EXPECT_EQ(kube_.calls("update"), 0);
  EXPECT_EQ(kube_.calls("patch"), 0);
  EXPECT_EQ(kube_.Count(kPods), 3u);
}

// A create's answer goes into the cache at once (it meets its expectation):
// the next pass does not wait for the watch event, and never creates twice.
TEST_F(ReconcilerTest, OwnCreatesShowFromTheirAnswerWithoutAWatchRoundTripNeverTwice) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  ASSERT_TRUE(WaitFor([&] { return cache_->Job("default", "mnist").has_value(); }));
  // No watch event of the Secret, Services or pods arrives.
  for (const char* r : {"secrets", "services", "pods", "configmaps", "networkpolicies"}) {
    kube_.HoldWatches(r, true);
  }
  // The pods wait for the Secret, which the cache shows from its answer.
  ASSERT_TRUE(reconciler_->Reconcile("default", "mnist").status.ok());
  EXPECT_EQ(expectations_.pending(), 0u);
  EXPECT_EQ(kube_.calls("create", "pods"), 3);
  ASSERT_TRUE(reconciler_->Reconcile("default", "mnist").status.ok());
  ASSERT_TRUE(reconciler_->Reconcile("default", "mnist").status.ok());
  EXPECT_EQ(kube_.calls("create", "secrets"), 1);  // not generated twice
  EXPECT_EQ(kube_.calls("create", "pods"), 3);
  EXPECT_EQ(kube_.calls("create", "services"), 3);
  for (const char* r : {"secrets", "services", "pods", "configmaps", "networkpolicies"}) {
    kube_.HoldWatches(r, false);
  }
  ASSERT_TRUE(Pass().status.ok());
  EXPECT_EQ(kube_.calls("create"), 0);
  kube_.ResetCalls();
  ASSERT_TRUE(kube_.Delete({"/api/v1", "pods", "default", "mnist-worker-1", ""}, "").ok());
  ASSERT_TRUE(kube_.Delete({"/api/v1", "services", "default", "mnist-ps-0", ""}, "").ok());
  ASSERT_TRUE(WaitFor([&] {
    return cache_->Pods("default/mnist").size() == 2 &&
           cache_->Services("default/mnist").size() == 2;
  }));
  // The pods' watch events are held back: only the answers show the new ones.
  kube_.HoldWatches("pods", true);
  kube_.HoldWatches("services", true);
  ASSERT_TRUE(reconciler_->Reconcile("default", "mnist").status.ok());
  // Objects only: Events are sent by the recorder's own thread, maybe later.
  auto object_creates = [&] {
    return kube_.calls("create", "pods") + kube_.calls("create", "services") +
           kube_.calls("create", "configmaps") + kube_.calls("create", "secrets");
  };
  EXPECT_EQ(object_creates(), 2);
  // Straight away again: nothing is created twice.
  auto out = reconciler_->Reconcile("default", "mnist");
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(object_creates(), 2);
  kube_.HoldWatches("pods", false);
  kube_.HoldWatches("services", false);
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(object_creates(), 0);
  EXPECT_EQ(kube_.Count(kPods), 3u);
  EXPECT_EQ(kube_.Count(kServices), 3u);
}

// Expectations still hold a pass back while its deletes are not observed.
TEST_F(ReconcilerTest, WaitsForItsOwnDeletesToBeObservedBeforeDecidingAgain) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  Launch();
  expectations_.ExpectDelete("default/mnist", "pods/mnist-worker-0");
  kube_.ResetCalls();
  auto out = reconciler_->Reconcile("default", "mnist");
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create"), 0);
  EXPECT_EQ(kube_.calls("update"), 0);
  ASSERT_TRUE(out.requeue_after.has_value());
  expectations_.Observed("default/mnist", "pods/mnist-worker-0", false);
  EXPECT_TRUE(expectations_.Satisfied("default/mnist"));
}

TEST_F(ReconcilerTest, ObservedPodStatusDrivesTheJobAndDeletedJobsLeaveNothing) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  OperatorConfig config;
  config.cleanup_grace = absl::ZeroDuration();
  Start(config);
  Launch();
  // The chief pod succeeds with a result in its termination message.
  ResourceRef chief{"/api/v1", "pods", "default", "mnist-worker-0", ""};
  ASSERT_TRUE(
      kube_
          .MergePatch(
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
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& p : cache_->Pods("default/mnist")) {
      if (p["metadata"]["name"] == "mnist-worker-0")
        return p.value("/status/phase"_json_pointer, std::string()) == "Succeeded";
    }
    return false;
  }));
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.state, "Succeeded");
  auto job = kube_.Get(TrainingJobs("default", "mnist"));
  EXPECT_EQ((*job)["status"]["result"]["testAccuracy"], 0.9);
  ASSERT_TRUE(Pass().status.ok());  // the cleanup pass
  // cleanPodPolicy Running: pods still Pending/Running were deleted; the chief stays.
  EXPECT_EQ(kube_.Count(kPods), 1u);
  // The job is deleted: its children go too (no garbage collector needed).
  ASSERT_TRUE(kube_.Delete(TrainingJobs("default", "mnist"), kPropagationBackground).ok());
  ASSERT_TRUE(Pass().status.ok());
  EXPECT_EQ(kube_.Count(kPods), 0u);
  EXPECT_EQ(kube_.Count(kServices), 0u);
  EXPECT_EQ(kube_.Count(kConfigMaps), 0u);
  EXPECT_EQ(kube_.Count(kSecrets), 0u);
  EXPECT_EQ(kube_.Count(kNetworkPolicies), 0u);
}

TEST_F(ReconcilerTest, ACrashLoopingPodsLastTerminationIsTheRestartingReason) {
  json job = Job();
  job["spec"]["replicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure";
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), job).ok());
  Start();
  Launch();
  // The kubelet restarted worker-1 in place and now holds it back: its
  // reason is in lastState.terminated, state.waiting says CrashLoopBackOff.
  ResourceRef worker{"/api/v1", "pods", "default", "mnist-worker-1", ""};
  ASSERT_TRUE(
      kube_
          .MergePatch(worker,
                      {{"status",
                        {{"phase", "Running"},
                         {"containerStatuses",
                          json::array({{{"name", "kubetrain"},
                                        {"restartCount", 1},
                                        {"state", {{"waiting", {{"reason", "CrashLoopBackOff"}}}}},
                                        {"lastState",
                                         {{"terminated",
                                           {{"exitCode", 2},
                                            {"reason", "Error"},
                                            {"message",
                                             "spec.training.dataset.path: /data/x.csv: "
                                             "no such file\n"}}}}}}})}}}})
          .ok());
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& p : cache_->Pods("default/mnist")) {
      // p is const: operator[] on a key it lacks is undefined (TSan saw a
      // read of freed memory here before the patch reached the cache).
      if (p["metadata"]["name"] == "mnist-worker-1") {
        return p.contains("status") && p["status"].contains("phase");
      }
    }
    return false;
  }));
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.state, "Restarting");
  auto stored = kube_.Get(TrainingJobs("default", "mnist"));
  ASSERT_TRUE(stored.ok());
  const json* c = FindCondition((*stored)["status"], condition::kRestarting);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["message"],
            "TrainingJob mnist is restarting a replica: worker-1 exited 2 (CrashLoopBackOff, 1 "
            "restart): spec.training.dataset.path: /data/x.csv: no such file.");
}

TEST_F(ReconcilerTest, ADeletedServiceIsCreatedAgain) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  Launch();
  ASSERT_TRUE(kube_.Delete({"/api/v1", "services", "default", "mnist-ps-0", ""}, "").ok());
  ASSERT_TRUE(kube_.Delete({"/api/v1", "configmaps", "default", "mnist-config", ""}, "").ok());
  ASSERT_TRUE(
      kube_.Delete({kNetworkPolicyApiPath, "networkpolicies", "default", "mnist", ""}, "").ok());
  ASSERT_TRUE(Pass().status.ok());
  EXPECT_EQ(kube_.Count(kServices), 3u);
  EXPECT_EQ(kube_.Count(kConfigMaps), 1u);
  EXPECT_EQ(kube_.Count(kNetworkPolicies), 1u);
  EXPECT_EQ(kube_.calls("create", "pods"), 0);
}

// A pod create that fails otherwise (quota, a webhook) is retried in slow
// start: one pod per template first, not one per task on every retry.
TEST_F(ReconcilerTest, RetriedPodCreatesGoInSlowStartOnePerTemplateFirst) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  kube_.FailCalls("create", "pods", absl::UnavailableError("POST pods: webhook down"));
  Start();
  auto out = Pass();
  EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
  EXPECT_EQ(kube_.calls("create", "pods"), 3);  // the first attempt: all at once
  out = Pass();
  EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
  EXPECT_EQ(kube_.calls("create", "pods"), 2);  // a retry: mnist-ps-0, mnist-worker-0
  kube_.FailCalls("create", "pods", absl::OkStatus());
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create", "pods"), 3);
  EXPECT_EQ(kube_.Count(kPods), 3u);
}

TEST_F(ReconcilerTest, APodTheApiServerRefusesFailsTheJobWithItsMessage) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  kube_.FailCalls("create", "pods",
                  absl::InvalidArgumentError(
                      "POST pods: Pod \"mnist-ps-0\" is invalid: spec.containers[0].image: "
                      "Required value"));
  Start();
  auto out = Pass();  // the job's Secret first, then (same pass) its pods
  EXPECT_TRUE(absl::IsInvalidArgument(out.status)) << out.status;
  EXPECT_EQ(kube_.calls("create", "secrets"), 1);
  // All at once: an invalid template fails the job, so it costs one request per task, once.
  EXPECT_EQ(kube_.calls("create", "pods"), 3);
  ASSERT_TRUE(out.requeue_after.has_value());
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.state, "Failed");
  auto job = kube_.Get(TrainingJobs("default", "mnist"));
  const json* failed = FindCondition((*job)["status"], condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], reason::kCreateRejected);
  EXPECT_NE((*failed)["message"].get<std::string>().find("spec.containers[0].image: Required"),
            std::string::npos)
      << *failed;
  // Finished: no more attempts, and the repeated Warning is one Event with a count.
  EXPECT_EQ(kube_.calls("create", "pods"), 0);
  out = Pass();
  EXPECT_EQ(kube_.calls("create", "pods"), 0);
}

TEST_F(ReconcilerTest, ProgressIsReadFromTheChiefTasksPod) {
  json job = Job();
  job["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), job).ok());
  std::vector<std::string> asked;
  Start(OperatorConfig{}, [&](const std::string& ip) -> std::optional<std::string> {
    asked.push_back(ip);
    return "kubetrain_global_step 7\n";
  });
  Launch();
  for (const char* pod : {"mnist-chief-0", "mnist-worker-0"}) {
    ASSERT_TRUE(
        kube_
            .MergePatch({"/api/v1", "pods", "default", pod, ""},
                        {{"status",
                          {{"phase", "Running"},
                           {"podIP", std::string("10.0.0.") + (pod[6] == 'c' ? "1" : "2")}}}})
            .ok());
  }
  ASSERT_TRUE(WaitFor([&] {
    int running = 0;
    for (const auto& p : cache_->Pods("default/mnist"))
      running += p.value("/status/phase"_json_pointer, std::string()) == "Running";
    return running == 2;
  }));
  ASSERT_TRUE(Pass().status.ok());
  EXPECT_EQ(asked, std::vector<std::string>{"10.0.0.1"});  // the Chief, not worker 0
  EXPECT_EQ((*kube_.Get(TrainingJobs("default", "mnist")))["status"]["progress"]["globalStep"], 7);
  // Same progress again: no status write.
  auto out = Pass();
  EXPECT_EQ(kube_.calls("update"), 0);
}

TEST_F(ReconcilerTest, StoppingPsTasksOfAFailedCheckpointingJobAreAskedWhetherTheyHold) {
  json job = Job();
  job["spec"]["training"]["checkpoint"] = {{"directory", "/ckpt"}};
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), job).ok());
  std::vector<std::string> asked;
  bool holding = false;
  Start(OperatorConfig{}, [&](const std::string& ip) -> std::optional<std::string> {
    asked.push_back(ip);
    if (ip == "10.0.0.9") return "kubetrain_global_step 10\n";  // the chief, worker 0
    return absl::StrCat("kubetrain_ps_holding_unsaved_parameters ", holding ? 1 : 0, "\n");
  });
  Launch();
  auto patch_pod = [&](const std::string& pod, const json& patch) {
    ASSERT_TRUE(kube_.MergePatch({"/api/v1", "pods", "default", pod, ""}, patch).ok());
  };
  patch_pod("mnist-ps-0", {{"status", {{"phase", "Running"}, {"podIP", "10.0.0.1"}}}});
  patch_pod("mnist-worker-0", {{"status", {{"phase", "Running"}, {"podIP", "10.0.0.9"}}}});
  ASSERT_TRUE(WaitFor([&] {
    int running = 0;
    for (const auto& p : cache_->Pods("default/mnist"))
      running += p.value("/status/phase"_json_pointer, std::string()) == "Running";
    return running == 2;
  }));
  ASSERT_TRUE(Pass().status.ok());
  // While the job runs only the chief is asked (its progress).
  EXPECT_EQ(asked, std::vector<std::string>{"10.0.0.9"});

  // The chief failed (it could not export the model): the job fails, and
  // cleanPodPolicy stops the PS task (being deleted, it still runs).
  patch_pod(
      "mnist-worker-0",
      {{"status",
        {{"phase", "Failed"},
         {"containerStatuses",
          json::array({{{"name", "kubetrain"},
                        {"state",
                         {{"terminated",
                           {{"exitCode", 1}, {"message", "cannot export the model"}}}}}}})}}}});
  ASSERT_TRUE(WaitFor([&] {
    auto pods = cache_->Pods("default/mnist");
    for (const auto& p : pods)
      if (p["metadata"]["name"] == "mnist-worker-0")
        return p.value("/status/phase"_json_pointer, std::string()) == "Failed";
    return false;
  }));
  ASSERT_TRUE(Pass().status.ok());
  ASSERT_EQ((*kube_.Get(TrainingJobs("default", "mnist")))["status"]["state"], "Failed");
  EXPECT_GE(kube_.calls("delete", "pods"), 1);
  // The fake deletes at once; a real pod lingers while it terminates.
  ASSERT_TRUE(
      kube_
          .Create({"/api/v1", "pods", "default", "", ""},
                  {{"metadata",
                    {{"name", "mnist-ps-0"},
                     {"labels",
                      {{"kubetrain.io/job-name", "mnist"},
                       {"kubetrain.io/replica-type", "ps"},
                       {"kubetrain.io/replica-index", "0"}}},
                     {"ownerReferences", json::array({{{"uid", "job-uid"}, {"controller", true}}})},
                     {"deletionTimestamp", "2027-01-15T08:12:00Z"}}},
                   {"status", {{"phase", "Running"}, {"podIP", "10.0.0.1"}}}})
          .ok());
  asked.clear();
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(asked, std::vector<std::string>{"10.0.0.1"});  // the PS task, not the failed chief
  EXPECT_EQ(out.requeue_after, OperatorConfig{}.progress_interval);
  holding = true;
  out = Pass();
  const json status = (*kube_.Get(TrainingJobs("default", "mnist")))["status"];
  bool held = false;
  for (const auto& c : status["conditions"]) {
    if (c["type"] == "ParametersHeld") {
      held = c["status"] == "True";
      EXPECT_NE(c["message"].get<std::string>().find("until 2027-01-15T08:12:00Z"),
                std::string::npos)
          << c["message"];
    }
  }
  EXPECT_TRUE(held) << status.dump();
}

TEST_F(ReconcilerTest, CountOnlyStatusChangesAreCoalesced) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  Launch();  // Created: written at once
  auto run = [&](const std::string& pod) {
    ASSERT_TRUE(kube_
                    .MergePatch({"/api/v1", "pods", "default", pod, ""},
                                {{"status", {{"phase", "Running"}}}})
                    .ok());
    ASSERT_TRUE(WaitFor([&] {
      for (const auto& p : cache_->Pods("default/mnist"))
        if (p["metadata"]["name"] == pod)
          return p.value("/status/phase"_json_pointer, std::string()) == "Running";
      return false;
    }));
  };
  run("mnist-ps-0");
  auto out = Pass();  // the Running condition: written at once
  EXPECT_EQ(kube_.calls("update"), 1);
  run("mnist-worker-0");
  // One task more active, within a second of the last write: deferred.
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("update"), 0);
  ASSERT_TRUE(out.requeue_after.has_value());
  EXPECT_LE(*out.requeue_after, absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  out = Pass();
  EXPECT_EQ(kube_.calls("update"), 1);
  EXPECT_EQ((*kube_.Get(
                TrainingJobs("default", "mnist")))["status"]["replicaStatuses"]["Worker"]["active"],
            1);
}

TEST_F(ReconcilerTest, MalformedObjectIsAnErrorNotACrash) {
  json bad = Job();
  bad["metadata"]["generation"] = "not-a-number";
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), bad).ok());
  Start();
  auto out = Pass();
  EXPECT_FALSE(out.status.ok());
}

json GangJob(const std::string& scheduler) {
  json j = Job();
  j["spec"]["runPolicy"] = {{"schedulingPolicy", {{"minAvailable", 2}}}};
  j["spec"]["replicaSpecs"]["Worker"]["template"] = {{"spec", {{"schedulerName", scheduler}}}};
  return j;
}

TEST_F(ReconcilerTest, AGangJobGetsItsPodGroupBeforeItsPodsOnce) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), GangJob("volcano")).ok());
  Start();
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  auto pg = kube_.Get({"/apis/scheduling.volcano.sh/v1beta1", "podgroups", "default", "mnist", ""});
  ASSERT_TRUE(pg.ok()) << pg.status();
  EXPECT_EQ((*pg)["spec"]["minMember"], 2);
  EXPECT_EQ((*pg)["metadata"]["ownerReferences"][0]["uid"], "job-uid");
  EXPECT_EQ(kube_.calls("create", "podgroups"), 1);
  out = Pass();  // the pods, once the cache shows the job's Secret
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create", "podgroups"), 0);
  EXPECT_EQ(kube_.Count(kPods), 3u);
  // Created, SuccessfulCreatePodGroup, SuccessfulCreatePod, SuccessfulCreateService.
  EXPECT_EQ(kube_.Count("/api/v1/namespaces/default/events"), 4u);
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create"), 0);  // known to exist: not asked again
  // A deleted job takes its PodGroup along (clusters without a garbage collector).
  ASSERT_TRUE(kube_.Delete(TrainingJobs("default", "mnist"), kPropagationBackground).ok());
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.Count("/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups"), 0u);
}

TEST_F(ReconcilerTest, APodGroupIsKeptAsTheJobAsksWhileItRuns) {
  const std::string api = "scheduling.volcano.sh/v1beta1";
  const ResourceRef pg{"/apis/" + api, "podgroups", "default", "mnist", ""};
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), GangJob("volcano")).ok());
  Start();
  ASSERT_TRUE(Pass().status.ok());
  // Created: from now on the PodGroups of that API are watched.
  ASSERT_TRUE(WaitFor([&] { return cache_->PodGroupsSynced(api); }));
  auto cached_spec = [&] {
    auto got = cache_->PodGroup(api, "default", "mnist");
    return got ? got->value("spec", json()) : json();
  };
  // The user asks for more of the gang and a queue.
  ASSERT_TRUE(kube_
                  .MergePatch(TrainingJobs("default", "mnist"),
                              json::parse(R"({"spec": {"runPolicy": {"schedulingPolicy":
                                  {"minAvailable": 3, "queue": "research"}}}})"))
                  .ok());
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("patch", "podgroups"), 1);
  const json want = json::parse(R"({"minMember": 3, "queue": "research"})");
  EXPECT_EQ((*kube_.Get(pg))["spec"], want);
  ASSERT_TRUE(WaitFor([&] { return cached_spec() == want; }));
  out = Pass();
  EXPECT_EQ(kube_.calls("patch"), 0);  // settled
  EXPECT_EQ(kube_.calls("create", "podgroups"), 0);

  // Someone edits it: put back.
  ASSERT_TRUE(kube_.MergePatch(pg, json::parse(R"({"spec": {"minMember": 1}})")).ok());
  ASSERT_TRUE(WaitFor([&] { return cached_spec().value("minMember", 0) == 1; }));
  out = Pass();
  EXPECT_EQ((*kube_.Get(pg))["spec"], want);

  // Someone deletes it: created again, from its watch event.
  ASSERT_TRUE(kube_.Delete(pg, kPropagationBackground).ok());
  ASSERT_TRUE(WaitFor([&] { return !cache_->PodGroup(api, "default", "mnist").has_value(); }));
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create", "podgroups"), 1);
  auto again = kube_.Get(pg);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["spec"], want);
  EXPECT_EQ((*again)["metadata"]["ownerReferences"][0]["uid"], "job-uid");
}

TEST_F(ReconcilerTest, WithoutThePodGroupCrdPodsWaitAndTheApiIsNotAskedUntilTheRetry) {
  OperatorConfig config;
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), GangJob("scheduler-plugins-scheduler")).ok());
  kube_.FailCalls("create", "podgroups",
                  absl::NotFoundError("POST podgroups: the server could not find the requested "
                                      "resource"));
  Start(config);
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;  // not an error to back off from
  EXPECT_EQ(out.requeue_after, absl::ZeroDuration());
  EXPECT_EQ(kube_.Count(kPods), 0u);
  EXPECT_EQ(kube_.Count(kServices), 3u);
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create"), 1);  // only the Warning Event: the API is known missing
  EXPECT_EQ(kube_.calls("create", "events"), 1);
  EXPECT_EQ(out.requeue_after, config.pod_group_retry);
  auto job = kube_.Get(TrainingJobs("default", "mnist"));
  const json* failing = FindCondition((*job)["status"], condition::kPodGroupFailing);
  ASSERT_NE(failing, nullptr) << (*job)["status"];
  EXPECT_EQ((*failing)["status"], "True");
  EXPECT_EQ((*failing)["reason"], reason::kPodGroupAPIMissing);
  EXPECT_NE((*failing)["message"].get<std::string>().find(
                "does not serve podgroups in scheduling.x-k8s.io/v1alpha1"),
            std::string::npos)
      << *failing;
  // The CRD is installed meanwhile: at the retry, the PodGroup, then the pods.
  kube_.FailCalls("create", "podgroups", absl::OkStatus());
  clock_.Advance(config.pod_group_retry);
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.Count("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"), 1u);
  EXPECT_EQ(kube_.Count(kPods), 3u);
  out = Pass();
  job = kube_.Get(TrainingJobs("default", "mnist"));
  failing = FindCondition((*job)["status"], condition::kPodGroupFailing);
  ASSERT_NE(failing, nullptr);
  EXPECT_EQ((*failing)["status"], "False");
  EXPECT_EQ((*failing)["reason"], reason::kPodGroupCreated);
}

std::string Decoded(const json& secret, const std::string& key) {
  std::string out;
  EXPECT_TRUE(absl::Base64Unescape(secret["data"].value(key, ""), &out)) << key;
  return out;
}

TEST_F(ReconcilerTest, TheJobsSecretIsGeneratedOnceAndNeverAgainAfterAnOperatorRestart) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  Launch();
  auto secret = kube_.Get(kAuthSecret);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ((*secret)["type"], "Opaque");
  EXPECT_EQ((*secret)["metadata"]["labels"]["kubetrain.io/job-name"], "mnist");
  EXPECT_EQ((*secret)["metadata"]["ownerReferences"][0]["uid"], "job-uid");
  std::vector<std::string> keys;
  for (const auto& [k, v] : (*secret)["data"].items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"ca.crt", "job.key", "tls.crt", "tls.key",
                                            "token.worker-0", "token.worker-1"}));
  const std::string job_key = Decoded(*secret, "job.key");
  EXPECT_EQ(job_key.size(), 64u);
  EXPECT_EQ(Decoded(*secret, "token.worker-1"), TaskToken(job_key, "worker", 1));
  EXPECT_NE(Decoded(*secret, "ca.crt").find("BEGIN CERTIFICATE"), std::string::npos);
  // The cache keeps the job key (for tokens of new tasks) and no other value.
  const std::vector<json> cached = cache_->Secrets("default/mnist");
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_EQ(cached[0]["data"]["job.key"], (*secret)["data"]["job.key"]);
  EXPECT_EQ(cached[0]["data"]["tls.key"], "");
  EXPECT_EQ(cached[0]["data"]["token.worker-0"], "");
  // A restarted operator finds it in its new cache: nothing is generated or created again.
  Restart();
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create"), 0);
  EXPECT_EQ(kube_.calls("patch"), 0);
  EXPECT_EQ((*kube_.Get(kAuthSecret))["metadata"]["resourceVersion"],
            (*secret)["metadata"]["resourceVersion"]);
}

TEST_F(ReconcilerTest, WithoutTlsTheSecretHoldsTokensOnly) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  OperatorConfig config;
  config.job_tls = false;
  Start(config);
  Launch();
  auto secret = kube_.Get(kAuthSecret);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_FALSE((*secret)["data"].contains("ca.crt"));
  EXPECT_FALSE((*secret)["data"].contains("tls.key"));
  auto pod = kube_.Get({"/api/v1", "pods", "default", "mnist-worker-0", ""});
  ASSERT_TRUE(pod.ok());
  for (const auto& v : (*pod)["spec"]["volumes"]) {
    if (v["name"] == "kubetrain-auth") {
      EXPECT_EQ(v["secret"]["items"],
                json::parse(R"([{"key": "token.worker-0", "path": "token"}])"));
    }
  }
}

TEST_F(ReconcilerTest, ASecretOfThatNameNotTheJobsKeepsThePodsWaiting) {
  // A deleted job's of the same name, not yet collected.
  ASSERT_TRUE(
      kube_
          .Create(
              {"/api/v1", "secrets", "default", "", ""},
              {{"metadata",
                {{"name", "mnist-auth"},
                 {"labels", {{"kubetrain.io/job-name", "mnist"}}},
                 {"ownerReferences", json::array({{{"uid", "old-uid"}, {"controller", true}}})}}},
               {"data", {{"job.key", absl::Base64Escape(std::string(64, 'e'))}}}})
          .ok());
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  ASSERT_TRUE(Pass().status.ok());
  ASSERT_TRUE(Pass().status.ok());
  EXPECT_EQ(kube_.Count(kPods), 0u);  // never with another job's key
  bool warned = false;
  const auto events = kube_.List({"/api/v1", "events", "default", "", ""}, "");
  for (const auto& e : (*events)["items"]) {
    warned = warned || e["message"].get<std::string>().find(
                           "Secret mnist-auth already exists and does not belong to this "
                           "TrainingJob") != std::string::npos;
  }
  EXPECT_TRUE(warned);
  // Once it is gone, the job's own, then the pods.
  ASSERT_TRUE(kube_.Delete(kAuthSecret, "").ok());
  ASSERT_TRUE(Pass().status.ok());
  ASSERT_TRUE(Pass().status.ok());
  EXPECT_EQ((*kube_.Get(kAuthSecret))["metadata"]["ownerReferences"][0]["uid"], "job-uid");
  EXPECT_EQ(kube_.Count(kPods), 3u);
}

TEST_F(ReconcilerTest, ASecretTheApiServerRefusesFailsTheJobWithItsMessage) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  kube_.FailCalls("create", "secrets",
                  absl::InvalidArgumentError("POST secrets: Secret \"mnist-auth\" is invalid: "
                                             "exceeded quota"));
  Start();
  EXPECT_TRUE(absl::IsInvalidArgument(Pass().status));
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.state, "Failed");
  const auto job = kube_.Get(TrainingJobs("default", "mnist"));
  const json* failed = FindCondition((*job)["status"], condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], reason::kCreateRejected);
  EXPECT_NE((*failed)["message"].get<std::string>().find("refused secrets mnist-auth"),
            std::string::npos)
      << *failed;
  EXPECT_EQ(kube_.Count(kPods), 0u);
}

TEST_F(ReconcilerTest, ADeletedSecretIsNotReplacedAndATaskThatMustStartAgainFailsTheJob) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  Launch();
  ASSERT_TRUE(kube_.Delete(kAuthSecret, "").ok());
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("create", "secrets"), 0);
  const auto job = kube_.Get(TrainingJobs("default", "mnist"));
  const json* missing = FindCondition((*job)["status"], condition::kAuthSecretMissing);
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ((*missing)["status"], "True");
  EXPECT_NE(out.state, "Failed");
  ASSERT_TRUE(kube_.Delete({"/api/v1", "pods", "default", "mnist-worker-1", ""}, "").ok());
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.state, "Failed");
  EXPECT_EQ(kube_.calls("create"), kube_.calls("create", "events"));  // nothing but Events
  const auto ended = kube_.Get(TrainingJobs("default", "mnist"));
  const json* failed = FindCondition((*ended)["status"], condition::kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], reason::kAuthSecretLost);
}

TEST_F(ReconcilerTest, ANewWorkerGetsItsTokenBeforeItsPod) {
  ASSERT_TRUE(kube_.Create(TrainingJobs("default"), Job()).ok());
  Start();
  Launch();
  ASSERT_TRUE(kube_
                  .MergePatch(TrainingJobs("default", "mnist"),
                              {{"spec", {{"replicaSpecs", {{"Worker", {{"replicas", 3}}}}}}}})
                  .ok());
  auto out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("patch", "secrets"), 1);
  EXPECT_EQ(kube_.calls("create", "pods"), 0);
  out = Pass();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(kube_.calls("patch", "secrets"), 0);
  EXPECT_EQ(kube_.calls("create", "pods"), 1);
  auto secret = kube_.Get(kAuthSecret);
  EXPECT_EQ(Decoded(*secret, "token.worker-2"),
            TaskToken(Decoded(*secret, "job.key"), "worker", 2));
}

}  // namespace
}  // namespace kubetrain
