#include "operator/desired.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "operator/status.h"

namespace kubetrain {
namespace {

using nlohmann::json;

const absl::Time kT0 = absl::FromUnixSeconds(1800000000);

json JobJson(const std::string& extra_run_policy = "", const std::string& worker_policy = "Never",
             int workers = 2) {
  json j = {{"apiVersion", "kubetrain.io/v1"},
            {"kind", "TrainingJob"},
            {"metadata",
             {{"name", "mnist"}, {"namespace", "ns3"}, {"uid", "u-1"}, {"resourceVersion", "7"}}},
            {"spec",
             {{"replicaSpecs",
               {{"PS", {{"replicas", 2}}},
                {"Worker", {{"replicas", workers}, {"restartPolicy", worker_policy}}}}},
              {"training", {{"model", {{"type", "softmax"}}}, {"steps", 100}}}}}};
  if (!extra_run_policy.empty()) j["spec"]["runPolicy"] = json::parse(extra_run_policy);
  return j;
}

JobObject Job(json object, json status = json()) {
  JobObject job;
  job.name = object["metadata"]["name"];
  job.namespace_ = object["metadata"]["namespace"];
  job.uid = object["metadata"]["uid"];
  job.generation = 1;
  job.object = object;
  job.status = status;
  return job;
}

ObservedPod Pod(const std::string& type, int index, const std::string& phase,
                std::optional<int> exit_code = {}) {
  ObservedPod p;
  p.name = "mnist-" + type + "-" + std::to_string(index);
  p.type = type;
  p.index = index;
  p.phase = phase;
  p.exit_code = exit_code;
  p.uses_auth_secret = true;  // a runtime pod
  return p;
}

const std::string kJobKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// The job's Secret as the cache shows it once created: the job key, every
// non-PS task's token and, with `tls`, the TLS files.
Observed::AuthSecret SecretOf(const json& object, bool tls = true) {
  Observed::AuthSecret s;
  s.job_key = kJobKey;
  s.keys = {kJobKeyFile};
  if (tls) s.keys.insert({kCaCertFile, kCertFile, kKeyFile});
  for (const JobTask& t : JobTasks(*ParseTrainingJob(object.dump()))) {
    if (t.type != "ps") s.keys.insert(TokenKey(t.type, t.index));
  }
  return s;
}

// What a new job's second pass sees: its Secret exists, nothing else yet.
Observed Fresh(const json& object, absl::Time now = kT0) {
  Observed o;
  o.now = now;
  o.auth_secret = SecretOf(object);
  return o;
}

Observed AllPods(const std::string& phase, absl::Time now = kT0) {
  Observed o;
  o.now = now;
  o.config_map_exists = true;
  o.network_policy_exists = true;
  o.auth_secret = SecretOf(JobJson());
  for (int i = 0; i < 2; ++i) {
    o.pods.push_back(Pod("ps", i, phase));
    o.pods.push_back(Pod("worker", i, phase));
    o.services.push_back("mnist-ps-" + std::to_string(i));
    o.services.push_back("mnist-worker-" + std::to_string(i));
  }
  return o;
}

ObservedPod* Find(Observed& o, const std::string& name) {
  for (auto& p : o.pods) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string Condition(const json& status, const std::string& type) {
  for (const auto& c : status["conditions"]) {
    if (c["type"] == type)
      return c["status"].get<std::string>() + "/" + c["reason"].get<std::string>();
  }
  return "absent";
}

const json* PodNamed(const Actions& a, const std::string& name) {
  for (const auto& p : a.create_pods) {
    if (p["metadata"]["name"] == name) return &p;
  }
  return nullptr;
}

std::string EnvOf(const json& pod, const std::string& name) {
  for (const auto& e : pod["spec"]["containers"][0]["env"]) {
    if (e["name"] == name) return e.contains("value") ? e["value"].get<std::string>() : e.dump();
  }
  return "";
}

TEST(DesiredTest, NewJobGetsConfigMapServicesAndPodsWithTfConfig) {
  Observed first;
  first.now = kT0;
  Actions a = Desired(Job(JobJson()), first, OperatorConfig{});
  ASSERT_TRUE(a.create_config_map.has_value());
  EXPECT_EQ((*a.create_config_map)["metadata"]["name"], "mnist-config");
  ASSERT_EQ(a.create_services.size(), 4u);
  // The pods wait for the job's Secret.
  EXPECT_TRUE(a.create_auth_secret.has_value());
  EXPECT_TRUE(a.create_pods.empty());
  Observed o = Fresh(JobJson());
  a = Desired(Job(JobJson(), a.status), o, OperatorConfig{});
  EXPECT_FALSE(a.create_auth_secret.has_value());
  ASSERT_EQ(a.create_pods.size(), 4u);
  for (const auto& svc : a.create_services) {
    EXPECT_EQ(svc["spec"]["clusterIP"], "None");
    EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
    EXPECT_EQ(svc["spec"]["ports"][0]["name"], "kubetrain");
    EXPECT_EQ(svc["spec"]["ports"][0]["port"], 2222);
  }
  const json* w1 = PodNamed(a, "mnist-worker-1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ((*w1)["metadata"]["labels"]["kubetrain.io/job-name"], "mnist");
  EXPECT_EQ((*w1)["metadata"]["labels"]["kubetrain.io/replica-type"], "worker");
  EXPECT_EQ((*w1)["metadata"]["labels"]["kubetrain.io/replica-index"], "1");
  const json& owner = (*w1)["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["kind"], "TrainingJob");
  EXPECT_EQ(owner["uid"], "u-1");
  EXPECT_EQ(owner["controller"], true);
  EXPECT_EQ(EnvOf(*w1, "TF_CONFIG"),
            "{\"cluster\":{\"ps\":[\"mnist-ps-0.ns3.svc:2222\",\"mnist-ps-1.ns3.svc:2222\"],"
            "\"worker\":[\"mnist-worker-0.ns3.svc:2222\",\"mnist-worker-1.ns3.svc:2222\"]},"
            "\"task\":{\"type\":\"worker\",\"index\":1},\"environment\":\"cloud\"}");
  auto tf = ParseTfConfig(EnvOf(*w1, "TF_CONFIG"));
  ASSERT_TRUE(tf.ok());
  EXPECT_EQ(tf->self_address(), "mnist-worker-1.ns3.svc:2222");
  EXPECT_EQ((*w1)["spec"]["restartPolicy"], "Never");
  EXPECT_EQ((*w1)["spec"]["containers"][0]["command"][0], "kubetrain-worker");
  EXPECT_EQ(Condition(a.status, "Created"), "True/TrainingJobCreated");
  EXPECT_EQ(a.status["state"], "Created");
  EXPECT_EQ(a.status["startTime"], "2027-01-15T08:00:00Z");
  // The chief reports its result through the termination message.
  const json* w0 = PodNamed(a, "mnist-worker-0");
  auto args = (*w0)["spec"]["containers"][0]["args"].dump();
  EXPECT_NE(args.find("--result_file=/dev/termination-log"), std::string::npos);
}

TEST(DesiredTest, ClusterDomainAndUserContainersAreRespected) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Worker"]["template"] = {
      {"metadata", {{"labels", {{"team", "ml"}}}}},
      {"spec",
       {{"containers", json::array({{{"name", "sidecar"}, {"image", "busybox"}},
                                    {{"name", "tensorflow"},
                                     {"image", "tensorflow/tensorflow:2.15.0"},
                                     {"command", json::array({"python", "train.py"})}}})}}}};
  OperatorConfig cfg;
  cfg.cluster_domain = "tf.training.org";
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, cfg);
  const json* w0 = PodNamed(a, "mnist-worker-0");
  ASSERT_NE(w0, nullptr);
  const json& containers = (*w0)["spec"]["containers"];
  ASSERT_EQ(containers.size(), 2u);
  EXPECT_EQ(containers[1]["command"][0], "python");  // run as given
  EXPECT_FALSE(containers[0].contains("env"));       // only the training container gets TF_CONFIG
  std::string tf;
  for (const auto& e : containers[1]["env"]) {
    if (e["name"] == "TF_CONFIG") tf = e["value"];
  }
  EXPECT_NE(tf.find("mnist-ps-0.ns3.svc.tf.training.org:2222"), std::string::npos) << tf;
  EXPECT_EQ((*w0)["metadata"]["labels"]["team"], "ml");
  EXPECT_FALSE((*w0)["spec"].contains("volumes"));
}

// A `kubetrain` container without a command customises the runtime: the data
// volume is mounted beside the job file, the user's env, resources and extra
// flags are kept, the operator's image stands in for a missing one.
TEST(DesiredTest, RuntimeContainerInTheTemplateIsCustomisedNotReplaced) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Worker"]["template"] = {
      {"spec",
       {{"containers",
         json::array(
             {{{"name", "kubetrain"},
               {"args", json::array({"--log_level=debug"})},
               {"env", json::array({{{"name", "OMP_NUM_THREADS"}, {"value", "1"}}})},
               {"resources", {{"limits", {{"memory", "2Gi"}}}}},
               {"volumeMounts",
                json::array({{{"name", "data"}, {"mountPath", "/data"}, {"readOnly", true}}})}}})},
        {"volumes", json::array({{{"name", "data"}, {"hostPath", {{"path", "/srv/census"}}}}})}}}};
  OperatorConfig cfg;
  cfg.runtime_image = "kubetrain-runtime:1";
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, cfg);
  const json* w1 = PodNamed(a, "mnist-worker-1");
  ASSERT_NE(w1, nullptr);
  const json& containers = (*w1)["spec"]["containers"];
  ASSERT_EQ(containers.size(), 1u);
  const json& c = containers[0];
  EXPECT_EQ(c["command"], json::array({"kubetrain-worker"}));
  EXPECT_EQ(c["image"], "kubetrain-runtime:1");
  EXPECT_EQ(c["args"].back(), "--log_level=debug");
  EXPECT_EQ(c["args"][0].get<std::string>().rfind("--config=", 0), 0u) << c["args"];
  EXPECT_EQ(c["resources"]["limits"]["memory"], "2Gi");
  ASSERT_EQ(c["volumeMounts"].size(), 3u);
  EXPECT_EQ(c["volumeMounts"][0]["name"], "kubetrain-config");
  EXPECT_EQ(c["volumeMounts"][1]["name"], "kubetrain-auth");  // its credentials stay too
  EXPECT_EQ(c["volumeMounts"][2]["mountPath"], "/data");
  ASSERT_EQ(c["ports"].size(), 2u);
  std::vector<std::string> env;
  for (const auto& e : c["env"]) env.push_back(e["name"]);
  EXPECT_EQ(env, (std::vector<std::string>{"POD_IP", "KUBETRAIN_TERMINATION_LOG",
                                           "KUBETRAIN_AUTH_DIR", "OMP_NUM_THREADS", "TF_CONFIG"}));
  EXPECT_EQ(c["terminationMessagePolicy"], "FallbackToLogsOnError");
  const json& volumes = (*w1)["spec"]["volumes"];
  ASSERT_EQ(volumes.size(), 3u);
  EXPECT_EQ(volumes[0]["name"], "data");
  EXPECT_EQ(volumes[1]["configMap"]["name"], "mnist-config");
  EXPECT_EQ(volumes[2]["secret"]["secretName"], "mnist-auth");
  // An image of the user's own is kept.
  j["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] = "mine:2";
  a = Desired(Job(j), o, cfg);
  EXPECT_EQ((*PodNamed(a, "mnist-worker-1"))["spec"]["containers"][0]["image"], "mine:2");
}

TEST(DesiredTest, RunningPodsMakeTheJobRunningWithCounts) {
  Observed o = AllPods("Running");
  Actions a = Desired(Job(JobJson()), o, OperatorConfig{});
  EXPECT_TRUE(a.create_pods.empty());
  EXPECT_TRUE(a.create_services.empty());
  EXPECT_TRUE(a.delete_pods.empty());
  EXPECT_EQ(Condition(a.status, "Running"), "True/TrainingJobRunning");
  EXPECT_EQ(a.status["state"], "Running");
  EXPECT_EQ(a.status["replicaStatuses"]["Worker"]["active"], 2);
  EXPECT_EQ(a.status["replicaStatuses"]["PS"]["active"], 2);
}

TEST(DesiredTest, WorkerFailingUnderNeverFailsTheJobNamingTheReplica) {
  Observed o = AllPods("Running");
  *Find(o, "mnist-worker-1") = Pod("worker", 1, "Failed", 1);
  Actions a = Desired(Job(JobJson("{\"cleanPodPolicy\": \"None\"}")), o, OperatorConfig{});
  EXPECT_EQ(Condition(a.status, "Failed"), "True/TrainingJobFailed");
  EXPECT_EQ(Condition(a.status, "Running"), "absent");
  std::string msg;
  for (const auto& c : a.status["conditions"]) {
    if (c["type"] == "Failed") msg = c["message"];
  }
  EXPECT_NE(msg.find("Worker replica 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exited with code 1"), std::string::npos) << msg;
  EXPECT_TRUE(a.create_pods.empty());
  EXPECT_TRUE(a.delete_pods.empty());  // cleanPodPolicy None
  EXPECT_EQ(a.status["state"], "Failed");
  EXPECT_TRUE(a.status.contains("completionTime"));
}

TEST(DesiredTest, ExitCodePolicyRecreatesOnSignalThenRunsAgain) {
  json job = JobJson("", "ExitCode");
  Observed o = AllPods("Running");
  *Find(o, "mnist-worker-1") = Pod("worker", 1, "Failed", 137);
  Actions a = Desired(Job(job), o, OperatorConfig{});
  EXPECT_EQ(a.delete_pods, std::vector<std::string>{"mnist-worker-1"});
  EXPECT_EQ(Condition(a.status, "Restarting"), "True/TrainingJobRestarting");
  EXPECT_EQ(a.status["state"], "Restarting");
  EXPECT_EQ(a.status["replicaStatuses"]["Worker"]["restarts"], 1);
  ASSERT_FALSE(a.events.empty());
  EXPECT_EQ(a.events.back().reason, "TrainingJobRestarting");
  // Next round: the pod is gone and is created again with the same name.
  o.pods.erase(std::remove_if(o.pods.begin(), o.pods.end(),
                              [](auto& p) { return p.name == "mnist-worker-1"; }),
               o.pods.end());
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  ASSERT_EQ(b.create_pods.size(), 1u);
  EXPECT_EQ(b.create_pods[0]["metadata"]["name"], "mnist-worker-1");
  EXPECT_EQ(b.status["replicaStatuses"]["Worker"]["restarts"], 1);
  // Exit 1 under ExitCode is permanent.
  *Find(o, "mnist-worker-0") = Pod("worker", 0, "Failed", 1);
  Actions c = Desired(Job(job, b.status), o, OperatorConfig{});
  EXPECT_EQ(Condition(c.status, "Failed"), "True/TrainingJobFailed");
}

TEST(DesiredTest, BackoffLimitFailsTheJob) {
  json job = JobJson("{\"backoffLimit\": 1}", "ExitCode");
  Observed o = AllPods("Running");
  *Find(o, "mnist-worker-1") = Pod("worker", 1, "Failed", 137);
  Actions a = Desired(Job(job), o, OperatorConfig{});
  EXPECT_EQ(a.status["state"], "Restarting");  // 1 restart: at the limit, not over it
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});  // it failed again
  EXPECT_EQ(Condition(b.status, "Failed"), "True/BackoffLimitExceeded");
  // In-place kubelet restarts (OnFailure) count too.
  json onfailure = JobJson("{\"backoffLimit\": 2}", "OnFailure");
  Observed o2 = AllPods("Running");
  Find(o2, "mnist-worker-0")->restart_count = 3;
  EXPECT_EQ(Condition(Desired(Job(onfailure), o2, OperatorConfig{}).status, "Failed"),
            "True/BackoffLimitExceeded");
}

TEST(DesiredTest, ActiveDeadlineIsATimerAndKillsRunningPods) {
  json job = JobJson("{\"activeDeadlineSeconds\": 60, \"cleanPodPolicy\": \"None\"}");
  json status = {{"startTime", "2027-01-15T08:00:00Z"}};
  Observed o = AllPods("Running", kT0 + absl::Seconds(45));
  Actions a = Desired(Job(job, status), o, OperatorConfig{});
  ASSERT_TRUE(a.requeue_after.has_value());
  EXPECT_LE(*a.requeue_after, absl::Seconds(15));  // the deadline (or an earlier progress refresh)
  EXPECT_GT(*a.requeue_after, absl::ZeroDuration());
  o.now = kT0 + absl::Seconds(60);
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  EXPECT_EQ(Condition(b.status, "Failed"), "True/DeadlineExceeded");
  EXPECT_EQ(b.delete_pods.size(), 4u);
}

TEST(DesiredTest, SuspendDeletesPodsAndResumeRecreatesThem) {
  json job = JobJson("{\"suspend\": true}");
  Observed o = AllPods("Running");
  Actions a = Desired(Job(job, json{{"startTime", "2027-01-15T07:00:00Z"}}), o, OperatorConfig{});
  EXPECT_EQ(a.delete_pods.size(), 4u);
  EXPECT_EQ(a.status["state"], "Suspended");
  EXPECT_FALSE(a.status.contains("startTime"));
  EXPECT_TRUE(a.create_pods.empty());
  Observed empty = Fresh(JobJson(), kT0 + absl::Seconds(30));
  empty.config_map_exists = true;
  empty.services = o.services;
  Actions b = Desired(Job(JobJson("{\"suspend\": false}"), a.status), empty, OperatorConfig{});
  EXPECT_EQ(b.create_pods.size(), 4u);
  EXPECT_EQ(Condition(b.status, "Suspended"), "False/TrainingJobResumed");
  EXPECT_EQ(b.status["startTime"], "2027-01-15T08:00:30Z");
}

TEST(DesiredTest, ChiefSuccessSucceedsCleansUpAndReportsTheResult) {
  Observed o = AllPods("Running");
  *Find(o, "mnist-worker-0") = Pod("worker", 0, "Succeeded", 0);
  Find(o, "mnist-worker-0")->termination_message = "{\"test_accuracy\":0.88,\"global_step\":100}";
  Actions a = Desired(Job(JobJson()), o, OperatorConfig{});
  EXPECT_EQ(Condition(a.status, "Succeeded"), "True/TrainingJobSucceeded");
  // .status.result is the camelCase projection of the chief's JobResult.
  EXPECT_EQ(a.status["result"]["testAccuracy"], 0.88);
  EXPECT_EQ(a.status["result"]["globalStep"], 100);
  EXPECT_FALSE(a.status["result"].contains("test_accuracy"));
  EXPECT_EQ(a.status["progress"]["accuracy"], 0.88);
  EXPECT_EQ(a.status["progress"]["globalStep"], 100);
  EXPECT_TRUE(a.create_pods.empty());
  // PS tasks get the grace period to exit by themselves...
  EXPECT_TRUE(a.delete_pods.empty());
  EXPECT_EQ(*a.requeue_after, OperatorConfig{}.cleanup_grace);
  // ...then cleanPodPolicy Running (the default) removes the still-running PS pods and worker 1.
  o.now = kT0 + OperatorConfig{}.cleanup_grace;
  EXPECT_EQ(Desired(Job(JobJson(), a.status), o, OperatorConfig{}).delete_pods.size(), 3u);
  // AllWorkers waits for worker 1 as well.
  json all = JobJson();
  all["spec"]["successPolicy"] = "AllWorkers";
  EXPECT_NE(Desired(Job(all), o, OperatorConfig{}).status["state"], "Succeeded");
}

TEST(DesiredTest, TtlDeletesTheFinishedJobOnTime) {
  json job = JobJson("{\"ttlSecondsAfterFinished\": 30}");
  json status = {
      {"conditions",
       json::array(
           {{{"type", "Succeeded"}, {"status", "True"}, {"reason", "x"}, {"message", ""}}})},
      {"completionTime", "2027-01-15T08:00:00Z"}};
  Observed o;
  o.now = kT0 + absl::Seconds(10);
  Actions a = Desired(Job(job, status), o, OperatorConfig{});
  EXPECT_FALSE(a.delete_job);
  EXPECT_EQ(*a.requeue_after, absl::Seconds(20));
  o.now = kT0 + absl::Seconds(30);
  EXPECT_TRUE(Desired(Job(job, status), o, OperatorConfig{}).delete_job);
}

TEST(DesiredTest, InvalidSpecFailsWithTheParsersMessageAndCreatesNothing) {
  json job = JobJson();
  job["spec"]["training"]["replicasToAggregate"] = 5;
  Observed o;
  o.now = kT0;
  Actions a = Desired(Job(job), o, OperatorConfig{});
  EXPECT_EQ(Condition(a.status, "Failed"), "True/InvalidSpec");
  std::string msg;
  for (const auto& c : a.status["conditions"]) {
    if (c["type"] == "Failed") msg = c["message"];
  }
  EXPECT_NE(msg.find("spec.training.replicasToAggregate"), std::string::npos) << msg;
  EXPECT_TRUE(a.create_pods.empty());
  EXPECT_TRUE(a.create_services.empty());
}

TEST(DesiredTest, ScaleDownDeletesPodsBeyondReplicas) {
  Observed o = AllPods("Running");
  Actions a = Desired(Job(JobJson("", "Never", /*workers=*/1)), o, OperatorConfig{});
  EXPECT_EQ(a.delete_pods, std::vector<std::string>{"mnist-worker-1"});
}

TEST(DesiredTest, PodTfConfigIsByteForByteTfJobs) {
  // training-operator's pkg/controller.v1/tensorflow/pod_test.go ("Test
  // ClusterSpec"): job test-tfjob in ns3 with 1 worker, 1 PS, 1 evaluator and
  // cluster domain tf.training.io; this is the string it expects for worker 0.
  json j = {{"apiVersion", "kubetrain.io/v1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", "test-tfjob"}, {"namespace", "ns3"}, {"uid", "u"}}},
            {"spec",
             {{"replicaSpecs",
               {{"Worker", {{"replicas", 1}}},
                {"PS", {{"replicas", 1}}},
                {"Evaluator", {{"replicas", 1}}}}},
              {"training", {{"steps", 10}}}}}};
  OperatorConfig cfg;
  cfg.cluster_domain = "tf.training.io";
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, cfg);
  const json* w0 = PodNamed(a, "test-tfjob-worker-0");
  ASSERT_NE(w0, nullptr);
  EXPECT_EQ(
      EnvOf(*w0, "TF_CONFIG"),
      R"({"cluster":{"evaluator":["test-tfjob-evaluator-0.ns3.svc.tf.training.io:2222"],"ps":["test-tfjob-ps-0.ns3.svc.tf.training.io:2222"],"worker":["test-tfjob-worker-0.ns3.svc.tf.training.io:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"})");
}

TEST(DesiredTest, EveryReplicaTypeRunsTheRightCommandAndOnlyTheChiefReports) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  j["spec"]["replicaSpecs"]["Evaluator"] = {{"replicas", 1}};
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, OperatorConfig{});
  ASSERT_EQ(a.create_pods.size(), 6u);
  auto command = [&](const std::string& pod) {
    return (*PodNamed(a, pod))["spec"]["containers"][0]["command"][0];
  };
  auto args = [&](const std::string& pod) {
    return (*PodNamed(a, pod))["spec"]["containers"][0]["args"].dump();
  };
  EXPECT_EQ(command("mnist-ps-1"), "kubetrain-ps");
  EXPECT_EQ(command("mnist-chief-0"), "kubetrain-worker");
  EXPECT_EQ(command("mnist-worker-0"), "kubetrain-worker");
  EXPECT_EQ(command("mnist-evaluator-0"), "kubetrain-worker");
  EXPECT_NE(args("mnist-chief-0").find("--result_file=/dev/termination-log"), std::string::npos);
  for (const char* other :
       {"mnist-worker-0", "mnist-worker-1", "mnist-ps-0", "mnist-evaluator-0"}) {
    EXPECT_EQ(args(other).find("--result_file"), std::string::npos) << other;
  }
  auto tf = ParseTfConfig(EnvOf(*PodNamed(a, "mnist-evaluator-0"), "TF_CONFIG"));
  ASSERT_TRUE(tf.ok());
  EXPECT_EQ(tf->task_type, "evaluator");
  EXPECT_EQ(tf->tasks("chief"), std::vector<std::string>{"mnist-chief-0.ns3.svc:2222"});
}

TEST(DesiredTest, PsPodsServeTheBulkDataPlaneUnlessTurnedOff) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, OperatorConfig{});
  ASSERT_EQ(a.create_pods.size(), 5u);
  auto port_names = [](const json& pod) {
    std::vector<std::string> names;
    for (const json& p : pod["spec"]["containers"][0]["ports"]) names.push_back(p["name"]);
    return names;
  };
  for (const json& pod : a.create_pods) {
    SCOPED_TRACE(pod["metadata"]["name"].dump());
    if (pod["metadata"]["labels"]["kubetrain.io/replica-type"] == "ps") {
      EXPECT_EQ(EnvOf(pod, "KUBETRAIN_BULK_PORT"), "2223");
      EXPECT_EQ(pod["spec"]["containers"][0]["ports"][2],
                (json{{"name", "bulk"}, {"containerPort", 2223}}));
    } else {
      // Workers learn the port from the PS; they serve none.
      EXPECT_EQ(EnvOf(pod, "KUBETRAIN_BULK_PORT"), "");
      EXPECT_EQ(port_names(pod), (std::vector<std::string>{"kubetrain", "metrics"}));
    }
  }

  OperatorConfig grpc_only;
  grpc_only.bulk_port = -1;
  Actions b = Desired(Job(j), o, grpc_only);
  const json& ps = *PodNamed(b, "mnist-ps-0");
  EXPECT_EQ(EnvOf(ps, "KUBETRAIN_BULK_PORT"), "");
  EXPECT_EQ(port_names(ps), (std::vector<std::string>{"kubetrain", "metrics"}));
}

TEST(DesiredTest, WithAChiefReplicaTheChiefDecidesAndReports) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  Observed o = AllPods("Running");
  o.pods.push_back(Pod("chief", 0, "Running"));
  o.services.push_back("mnist-chief-0");
  *Find(o, "mnist-worker-0") = Pod("worker", 0, "Succeeded", 0);
  Actions a = Desired(Job(j), o, OperatorConfig{});
  EXPECT_EQ(a.status["state"], "Running");  // worker 0 is a plain worker now
  *Find(o, "mnist-chief-0") = Pod("chief", 0, "Succeeded", 0);
  Find(o, "mnist-chief-0")->termination_message = "{\"test_accuracy\":0.87,\"global_step\":100}\n";
  Actions b = Desired(Job(j, a.status), o, OperatorConfig{});
  EXPECT_EQ(b.status["state"], "Succeeded");
  EXPECT_EQ(b.status["result"]["testAccuracy"], 0.87);
}

TEST(DesiredTest, LiveProgressIsTheCamelCaseProjection) {
  Observed o = AllPods("Running");
  Progress p;
  p.global_step = 120;
  p.target_steps = 3750;
  p.loss = 0.5;
  o.progress = p;
  Actions a = Desired(Job(JobJson()), o, OperatorConfig{});
  // absentWorkers and the checkpoint figures are always known (0: every
  // worker is at the barrier, no checkpoint write failed).
  EXPECT_EQ(a.status["progress"], (json{{"globalStep", 120},
                                        {"targetSteps", 3750},
                                        {"loss", 0.5},
                                        {"absentWorkers", 0},
                                        {"checkpointFailures", 0},
                                        {"checkpointsFailing", 0},
                                        {"checkpointError", ""}}));
  EXPECT_EQ(FindCondition(a.status, condition::kCheckpointFailing), nullptr);
}

TEST(DesiredTest, CheckpointFailuresBecomeAConditionWithTheOsErrorAndAnEvent) {
  Observed o = AllPods("Running");
  Progress p;
  p.global_step = 400;
  p.target_steps = 3750;
  p.absent_workers = 1;
  p.checkpoint_failures = 2;
  p.checkpoints_failing = 1;
  p.checkpoint_error = "ps:0 at version 400: cannot create /ckpt/ps-0/x: No space left on device";
  o.progress = p;
  Actions a = Desired(Job(JobJson()), o, OperatorConfig{});
  EXPECT_EQ(a.status["state"], "Running");  // training goes on
  EXPECT_EQ(a.status["progress"]["absentWorkers"], 1);
  EXPECT_EQ(a.status["progress"]["checkpointFailures"], 2);
  EXPECT_EQ(a.status["progress"]["checkpointError"], p.checkpoint_error);
  const json* c = FindCondition(a.status, condition::kCheckpointFailing);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], reason::kCheckpointWriteFailed);
  EXPECT_EQ((*c)["message"],
            "2 checkpoint writes failed, 1 PS task failing now; last: " + p.checkpoint_error);
  int events = 0;
  for (const JobEvent& e : a.events) {
    if (e.reason != reason::kCheckpointWriteFailed) continue;
    ++events;
    EXPECT_EQ(e.type, "Warning");
    EXPECT_TRUE(absl::StrContains(e.message, "No space left on device")) << e.message;
  }
  EXPECT_EQ(events, 1);
  // Still failing on the next pass: no new Event.
  Actions b = Desired(Job(JobJson(), a.status), o, OperatorConfig{});
  for (const JobEvent& e : b.events) EXPECT_NE(e.reason, reason::kCheckpointWriteFailed);
  // Written again: False, the count and the last error kept in the message.
  o.progress->checkpoints_failing = 0;
  Actions c2 = Desired(Job(JobJson(), b.status), o, OperatorConfig{});
  c = FindCondition(c2.status, condition::kCheckpointFailing);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], reason::kCheckpointsWritten);
  EXPECT_TRUE(absl::StrContains((*c)["message"].get<std::string>(), "No space left on device"));
  // The chief's final result carries the figures too.
  JobResult r;
  r.status = "Succeeded";
  r.global_step = 3750;
  r.checkpoint_failures = 3;
  r.checkpoints_failing = 1;
  r.checkpoint_error = "ps:1 at version 3700: cannot create /ckpt/ps-1/y: Read-only file system";
  *Find(o, "mnist-worker-0") = Pod("worker", 0, "Succeeded", 0);
  Find(o, "mnist-worker-0")->termination_message = ToJson(r).dump();
  Actions d = Desired(Job(JobJson(), c2.status), o, OperatorConfig{});
  EXPECT_EQ(d.status["state"], "Succeeded");
  EXPECT_EQ(d.status["result"]["checkpointFailures"], 3);
  c = FindCondition(d.status, condition::kCheckpointFailing);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_TRUE(absl::StrContains((*c)["message"].get<std::string>(), "Read-only file system"));
}

TEST(DesiredTest, RecreatedPodsBackOffLikeTheKubelet) {
  json job = JobJson("", "ExitCode");
  Observed o = AllPods("Running");
  ObservedPod failed = Pod("worker", 1, "Failed", 137);
  failed.started = kT0 - absl::Seconds(20);
  failed.finished = kT0;
  *Find(o, "mnist-worker-1") = failed;
  Actions a = Desired(Job(job), o, OperatorConfig{});  // the first restart is at once
  EXPECT_EQ(a.delete_pods, std::vector<std::string>{"mnist-worker-1"});
  EXPECT_EQ(a.status["taskRestarts"]["worker-1"],
            (json{{"restarts", 1}, {"consecutiveFailures", 1}}));
  // It fails again 5 s into its new run: the next recreation waits 10 s.
  failed.started = kT0 + absl::Seconds(1);
  failed.finished = kT0 + absl::Seconds(6);
  *Find(o, "mnist-worker-1") = failed;
  o.now = kT0 + absl::Seconds(6);
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  EXPECT_TRUE(b.delete_pods.empty());
  EXPECT_EQ(b.status["state"], "Restarting");
  EXPECT_EQ(*b.requeue_after, absl::Seconds(10));
  o.now = kT0 + absl::Seconds(16);
  Actions c = Desired(Job(job, b.status), o, OperatorConfig{});
  EXPECT_EQ(c.delete_pods, std::vector<std::string>{"mnist-worker-1"});
  EXPECT_EQ(c.status["taskRestarts"]["worker-1"],
            (json{{"restarts", 2}, {"consecutiveFailures", 2}}));
  EXPECT_EQ(c.status["replicaStatuses"]["Worker"]["recreated"], 2);
}

TEST(DesiredTest, ConditionTransitionTimesOnlyMoveOnChange) {
  Observed o = AllPods("Running");
  Actions a = Desired(Job(JobJson()), o, OperatorConfig{});
  o.now = kT0 + absl::Seconds(100);
  Actions b = Desired(Job(JobJson(), a.status), o, OperatorConfig{});
  EXPECT_EQ(a.status["conditions"], b.status["conditions"]);
}

std::string ConditionMessage(const json& status, const std::string& type) {
  for (const auto& c : status["conditions"]) {
    if (c["type"] == type) return c["message"];
  }
  return "";
}

ObservedPod::Termination Terminated(int code, const std::string& reason,
                                    const std::string& message) {
  return ObservedPod::Termination{code, reason, message};
}

TEST(DesiredTest, TasksWriteTheirReasonAndPodsFallBackToTheirLogs) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Evaluator"] = {
      {"replicas", 1},
      {"template",
       {{"spec",
         {{"containers", json::array({{{"name", "tensorflow"},
                                       {"image", "mine"},
                                       {"terminationMessagePolicy", "File"}}})}}}}}};
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, OperatorConfig{});
  for (const char* name : {"mnist-ps-0", "mnist-ps-1", "mnist-worker-0", "mnist-worker-1"}) {
    const json& c = (*PodNamed(a, name))["spec"]["containers"][0];
    EXPECT_EQ(c["terminationMessagePolicy"], "FallbackToLogsOnError") << name;
    EXPECT_EQ(EnvOf(*PodNamed(a, name), "KUBETRAIN_TERMINATION_LOG"), "/dev/termination-log")
        << name;
  }
  // A user's container keeps the policy it asks for.
  EXPECT_EQ(
      (*PodNamed(a, "mnist-evaluator-0"))["spec"]["containers"][0]["terminationMessagePolicy"],
      "File");
}

TEST(DesiredTest, DescribeTerminationQuotesTheLastLineOrTheKubeletsReason) {
  ObservedPod p = Pod("worker", 0, "Running");
  EXPECT_EQ(DescribeTermination(p), "");
  p.last_termination =
      Terminated(2, "Error", "spec.training.dataset.path: /data/x.csv: no such file\n");
  EXPECT_EQ(DescribeTermination(p),
            "worker-0 exited 2: spec.training.dataset.path: /data/x.csv: no such file");
  // FallbackToLogsOnError: the log's tail; its last line says why.
  p.last_termination = Terminated(134, "Error", "12:00:00.001 starting\r\n12:00:01.002 boom\n\n");
  EXPECT_EQ(DescribeTermination(p), "worker-0 exited 134: 12:00:01.002 boom");
  p.last_termination = Terminated(137, "OOMKilled", "");
  EXPECT_EQ(DescribeTermination(p), "worker-0 exited 137 (OOMKilled)");
  p.last_termination = Terminated(1, "Error", std::string(2000, 'x'));
  EXPECT_EQ(DescribeTermination(p), "worker-0 exited 1: " + std::string(512, 'x') + "...");
}

TEST(DesiredTest, ARecreatedPodsRestartSaysWhichTaskAndWhy) {
  json job = JobJson("", "ExitCode");
  Observed o = AllPods("Running");
  ObservedPod failed = Pod("worker", 1, "Failed", 137);
  failed.last_termination = Terminated(137, "OOMKilled", "");
  *Find(o, "mnist-worker-1") = failed;
  Actions a = Desired(Job(job), o, OperatorConfig{});
  EXPECT_EQ(Condition(a.status, "Restarting"), "True/TrainingJobRestarting");
  EXPECT_EQ(ConditionMessage(a.status, "Restarting"),
            "TrainingJob mnist is restarting a replica: worker-1 exited 137 (OOMKilled).");
  // It fails again at once, now with a message: the next recreation waits,
  // and the condition says why meanwhile.
  failed.last_termination = Terminated(143, "Error", "worker-1: lost ps-0: UNAVAILABLE\n");
  failed.exit_code = 143;
  failed.started = kT0 + absl::Seconds(1);
  failed.finished = kT0 + absl::Seconds(2);
  *Find(o, "mnist-worker-1") = failed;
  o.now = kT0 + absl::Seconds(2);
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  EXPECT_TRUE(b.delete_pods.empty());
  EXPECT_EQ(ConditionMessage(b.status, "Restarting"),
            "TrainingJob mnist is restarting a replica: worker-1 exited 143: worker-1: lost ps-0: "
            "UNAVAILABLE.");
  o.now = kT0 + absl::Seconds(12);
  Actions c = Desired(Job(job, b.status), o, OperatorConfig{});
  ASSERT_EQ(c.delete_pods, std::vector<std::string>{"mnist-worker-1"});
  ASSERT_FALSE(c.events.empty());
  EXPECT_EQ(c.events.back().message,
            "Pod mnist-worker-1 exited with code 143; recreating it (restartPolicy ExitCode): "
            "worker-1: lost ps-0: UNAVAILABLE");
}

TEST(DesiredTest, ACrashLoopingContainerIsRestartingWithItsReason) {
  json job = JobJson("", "OnFailure");
  Observed o = AllPods("Running");
  const json running = Desired(Job(job), o, OperatorConfig{}).status;
  ObservedPod* w = Find(o, "mnist-worker-0");
  w->restart_count = 2;
  w->waiting_reason = "CrashLoopBackOff";
  w->last_termination =
      Terminated(2, "Error", "spec.training.dataset.path: /data/x.csv: no such file\n");
  Actions a = Desired(Job(job, running), o, OperatorConfig{});
  EXPECT_EQ(Condition(a.status, "Restarting"), "True/TrainingJobRestarting");
  EXPECT_EQ(Condition(a.status, "Running"), "False/TrainingJobRestarting");
  EXPECT_EQ(a.status["state"], "Restarting");
  EXPECT_EQ(ConditionMessage(a.status, "Restarting"),
            "TrainingJob mnist is restarting a replica: worker-0 exited 2 (CrashLoopBackOff, 2 "
            "restarts): spec.training.dataset.path: /data/x.csv: no such file.");
  EXPECT_TRUE(a.delete_pods.empty());  // the kubelet restarts it in place
  ASSERT_TRUE(a.requeue_after.has_value());
  // Its next run gets going: running again, the reason stays in lastState only.
  w->waiting_reason = "";
  w->restart_count = 3;
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  EXPECT_EQ(Condition(b.status, "Restarting"), "False/TrainingJobRunning");
  EXPECT_EQ(Condition(b.status, "Running"), "True/TrainingJobRunning");
}

TEST(DesiredTest, TheFailedConditionSaysWhy) {
  Observed o = AllPods("Running");
  ObservedPod failed = Pod("worker", 1, "Failed", 2);
  failed.last_termination =
      Terminated(2, "Error", "spec.training.dataset.path: /data/x.csv: no such file\n");
  *Find(o, "mnist-worker-1") = failed;
  Actions a = Desired(Job(JobJson()), o, OperatorConfig{});
  EXPECT_EQ(Condition(a.status, "Failed"), "True/TrainingJobFailed");
  EXPECT_EQ(ConditionMessage(a.status, "Failed"),
            "TrainingJob mnist has failed because Worker replica 1 (pod mnist-worker-1) exited "
            "with code 2 (restartPolicy Never): spec.training.dataset.path: /data/x.csv: no such "
            "file.");
  // backoffLimit, with in-place restarts: the last one's reason.
  json onfailure = JobJson("{\"backoffLimit\": 2}", "OnFailure");
  Observed o2 = AllPods("Running");
  ObservedPod* w = Find(o2, "mnist-worker-0");
  w->restart_count = 3;
  w->waiting_reason = "CrashLoopBackOff";
  w->last_termination = Terminated(2, "Error", "worker-0: spec.training.model: too big\n");
  Actions b = Desired(Job(onfailure), o2, OperatorConfig{});
  EXPECT_EQ(Condition(b.status, "Failed"), "True/BackoffLimitExceeded");
  EXPECT_TRUE(absl::EndsWith(ConditionMessage(b.status, "Failed"),
                             "the last for pod mnist-worker-0): worker-0 exited 2: worker-0: "
                             "spec.training.model: too big."))
      << ConditionMessage(b.status, "Failed");
}

// Gang scheduling: JobJson with runPolicy.schedulingPolicy and the Worker
// template naming `scheduler` (PS names none: it inherits the job's).
JobObject GangJob(const std::string& scheduler, const json& policy) {
  json j = JobJson();
  j["spec"]["runPolicy"] = {{"schedulingPolicy", policy}};
  j["spec"]["replicaSpecs"]["Worker"]["template"] = {{"spec", {{"schedulerName", scheduler}}}};
  return Job(j);
}

TEST(DesiredTest, VolcanoGangGetsAPodGroupAndAnnotatedPods) {
  Observed o = Fresh(JobJson());
  Actions a = Desired(
      GangJob("volcano", {{"minAvailable", 3}, {"queue", "research"}, {"priorityClass", "high"}}),
      o, OperatorConfig{});
  ASSERT_TRUE(a.create_pod_group.has_value()) << a.status.dump();
  EXPECT_EQ(*a.create_pod_group,
            json::parse(R"({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
              "metadata": {"name": "mnist", "namespace": "ns3",
                           "labels": {"kubetrain.io/job-name": "mnist"},
                           "ownerReferences": [{"apiVersion": "kubetrain.io/v1",
                             "kind": "TrainingJob", "name": "mnist", "uid": "u-1",
                             "controller": true, "blockOwnerDeletion": true}]},
              "spec": {"minMember": 3, "queue": "research", "priorityClassName": "high"}})"));
  ASSERT_EQ(a.create_pods.size(), 4u);
  for (const auto& pod : a.create_pods) {
    SCOPED_TRACE(pod["metadata"]["name"].dump());
    EXPECT_EQ(pod["spec"]["schedulerName"], "volcano");  // PS inherits the Worker's
    EXPECT_EQ(pod["spec"]["priorityClassName"], "high");
    EXPECT_EQ(pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "mnist");
    EXPECT_EQ(pod["metadata"]["annotations"]["volcano.sh/task-spec"],
              pod["metadata"]["labels"]["kubetrain.io/replica-type"]);
    EXPECT_FALSE(pod["metadata"]["labels"].contains("scheduling.x-k8s.io/pod-group"));
  }
}

TEST(DesiredTest, SchedulerPluginsGangDefaultsToEveryTaskAndLabelsPods) {
  Observed o = Fresh(JobJson());
  json pod_template = {{"metadata", {{"labels", {{"team", "ml"}}}}},
                       {"spec", {{"schedulerName", "sched-x"}, {"priorityClassName", "low"}}}};
  JobObject job = GangJob("sched-x", {{"scheduleTimeoutSeconds", 90}, {"priorityClass", "high"}});
  job.object["spec"]["replicaSpecs"]["PS"]["template"] = pod_template;
  Actions a = Desired(job, o, OperatorConfig{});
  ASSERT_TRUE(a.create_pod_group.has_value()) << a.status.dump();
  EXPECT_EQ((*a.create_pod_group)["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ((*a.create_pod_group)["spec"],
            json::parse(R"({"minMember": 4, "scheduleTimeoutSeconds": 90})"));
  ASSERT_EQ(a.create_pods.size(), 4u);
  for (const auto& pod : a.create_pods) {
    SCOPED_TRACE(pod["metadata"]["name"].dump());
    EXPECT_EQ(pod["spec"]["schedulerName"], "sched-x");
    EXPECT_EQ(pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "mnist");
    EXPECT_FALSE(pod["metadata"]["annotations"].contains("scheduling.k8s.io/group-name"));
  }
  // The template's own priorityClassName wins over the policy's.
  EXPECT_EQ((*PodNamed(a, "mnist-ps-0"))["spec"]["priorityClassName"], "low");
  EXPECT_EQ((*PodNamed(a, "mnist-ps-0"))["metadata"]["labels"]["team"], "ml");
  EXPECT_EQ((*PodNamed(a, "mnist-worker-0"))["spec"]["priorityClassName"], "high");
}

TEST(DesiredTest, ThePodGroupAsksForTheRequestsOfTheGangsTasks) {
  Observed o;
  o.now = kT0;
  JobObject job = GangJob("volcano", {{"minAvailable", 3}});
  job.object["spec"]["replicaSpecs"]["PS"]["template"] = json::parse(R"({"spec": {"containers": [
      {"name": "kubetrain", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}})");
  // A worker: 500m + 100m of CPU in its containers, but its init container
  // needs 1 (the scheduler counts the larger); a GPU by its limit alone.
  job.object["spec"]["replicaSpecs"]["Worker"]["template"]["spec"].update(json::parse(R"({
      "containers": [
        {"name": "kubetrain", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                            "limits": {"cpu": "4", "nvidia.com/gpu": 1}}},
        {"name": "sidecar", "image": "x", "resources": {"requests": {"cpu": "100m"}}}],
      "initContainers": [{"name": "fetch", "image": "y", "resources": {"requests": {"cpu": 1}}}]})"));
  Actions a = Desired(job, o, OperatorConfig{});
  ASSERT_TRUE(a.create_pod_group.has_value()) << a.status.dump();
  // minAvailable 3 = the two PS tasks and one worker.
  EXPECT_EQ((*a.create_pod_group)["spec"]["minResources"],
            json::parse(R"({"cpu": "5", "memory": "9663676416", "nvidia.com/gpu": "1"})"));
  // Given in the policy: as given.
  JobObject given = GangJob("volcano", {{"minResources", {{"cpu", "10"}, {"memory", "1Ti"}}}});
  Actions b = Desired(given, o, OperatorConfig{});
  ASSERT_TRUE(b.create_pod_group.has_value());
  EXPECT_EQ((*b.create_pod_group)["spec"]["minResources"],
            json::parse(R"({"cpu": "10", "memory": "1Ti"})"));
  // Nothing requested: no minResources.
  Actions c = Desired(GangJob("volcano", json::object()), o, OperatorConfig{});
  ASSERT_TRUE(c.create_pod_group.has_value());
  EXPECT_FALSE((*c.create_pod_group)["spec"].contains("minResources"));
}

TEST(DesiredTest, AnExistingPodGroupIsNotCreatedAgain) {
  Observed o = Fresh(JobJson());
  o.pod_group_exists = true;
  Actions a = Desired(GangJob("volcano", json::object()), o, OperatorConfig{});
  EXPECT_FALSE(a.create_pod_group.has_value());
  EXPECT_EQ(a.create_pods.size(), 4u);
  EXPECT_EQ(Condition(a.status, "PodGroupFailing"), "absent");
}

TEST(DesiredTest, AnExistingPodGroupIsPatchedToWhatTheJobAsksForAndADeletedOneCreated) {
  Observed o = Fresh(JobJson());
  o.pod_group_exists = true;
  const JobObject job = GangJob("volcano", {{"minAvailable", 3}, {"queue", "research"}});
  // Not cached yet: nothing to compare with.
  EXPECT_FALSE(Desired(job, o, OperatorConfig{}).patch_pod_group.has_value());
  // As created: nothing to do (a queue Volcano defaulted is left alone elsewhere).
  o.pod_group_spec = json::parse(R"({"minMember": 3, "queue": "research"})");
  EXPECT_FALSE(Desired(job, o, OperatorConfig{}).patch_pod_group.has_value());
  // Edited (here by someone else): patched back.
  o.pod_group_spec = json::parse(R"({"minMember": 1, "queue": "research"})");
  Actions a = Desired(job, o, OperatorConfig{});
  ASSERT_TRUE(a.patch_pod_group.has_value());
  EXPECT_EQ(*a.patch_pod_group, json::parse(R"({"apiVersion": "scheduling.volcano.sh/v1beta1",
      "metadata": {"name": "mnist", "namespace": "ns3"}, "spec": {"minMember": 3}})"));
  EXPECT_FALSE(a.create_pod_group.has_value());
  EXPECT_EQ(a.create_pods.size(), 4u);
  // Deleted: created again.
  o.pod_group_exists = false;
  o.pod_group_spec.reset();
  EXPECT_TRUE(Desired(job, o, OperatorConfig{}).create_pod_group.has_value());
}

TEST(DesiredTest, APodGroupSpecPatchKeepsWhatTheOperatorSetsAndLeavesTheRest) {
  const json desired = json::parse(R"({"minMember": 4, "minResources": {"cpu": "2"}})");
  EXPECT_EQ(PodGroupSpecPatch(desired, desired), json::object());
  // A queue the scheduler's admission defaulted is not the operator's to remove.
  EXPECT_EQ(PodGroupSpecPatch(desired, json::parse(R"({"minMember": 4, "queue": "default",
                                                        "minResources": {"cpu": "2"}})")),
            json::object());
  // minResources is replaced whole (a merge patch merges objects).
  EXPECT_EQ(PodGroupSpecPatch(desired, json::parse(R"({"minMember": 2,
                                  "minResources": {"cpu": "1", "memory": "1Gi"}})")),
            json::parse(R"({"minMember": 4, "minResources": {"cpu": "2", "memory": null}})"));
  // What it no longer sets goes.
  EXPECT_EQ(PodGroupSpecPatch(json::parse(R"({"minMember": 4})"),
                              json::parse(R"({"minMember": 4, "scheduleTimeoutSeconds": 60,
                                              "minResources": {"cpu": "2"}})")),
            json::parse(R"({"scheduleTimeoutSeconds": null, "minResources": null})"));
  EXPECT_EQ(PodGroupSpecPatch(desired, json()), desired);
}

TEST(DesiredTest, PodsWaitWhileThePodGroupCannotBeCreatedThenStart) {
  Observed o = Fresh(JobJson());
  o.pod_group_blocked_reason = "PodGroupAPIMissing";
  o.pod_group_blocked = "the API server does not serve podgroups.scheduling.volcano.sh";
  OperatorConfig config;
  JobObject job = GangJob("volcano", json::object());
  Actions a = Desired(job, o, config);
  EXPECT_FALSE(a.create_pod_group.has_value());
  EXPECT_TRUE(a.create_pods.empty());
  EXPECT_EQ(a.create_services.size(), 4u);  // the rest of the job is there when it can start
  EXPECT_EQ(Condition(a.status, "PodGroupFailing"), "True/PodGroupAPIMissing");
  EXPECT_EQ(a.requeue_after, config.pod_group_retry);
  ASSERT_EQ(a.events.size(), 2u);  // Created, and the warning
  EXPECT_EQ(a.events[1].type, "Warning");
  EXPECT_EQ(a.events[1].reason, "PodGroupAPIMissing");
  EXPECT_TRUE(absl::StrContains(a.events[1].message,
                                "PodGroup mnist (scheduling.volcano.sh/v1beta1) cannot be "
                                "created, so no pod is: the API server does not serve"))
      << a.events[1].message;
  EXPECT_EQ(a.status["state"], "Created");

  // Still blocked: no second warning.
  job.status = a.status;
  Actions b = Desired(job, o, config);
  EXPECT_TRUE(b.create_pods.empty());
  EXPECT_TRUE(b.events.empty());

  // The retry finds no obstacle: the PodGroup is asked for first, then it exists.
  Observed retry = Fresh(JobJson(), kT0 + config.pod_group_retry);
  Actions c = Desired(job, retry, config);
  EXPECT_TRUE(c.create_pod_group.has_value());
  EXPECT_EQ(c.create_pods.size(), 4u);  // created only after it (reconciler.cc)
  retry.pod_group_exists = true;
  Actions d = Desired(job, retry, config);
  EXPECT_FALSE(d.create_pod_group.has_value());
  EXPECT_EQ(Condition(d.status, "PodGroupFailing"), "False/PodGroupCreated");
}

TEST(DesiredTest, SchedulerNameWithoutSchedulingPolicyOnlyPassesThrough) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Worker"]["template"] = {{"spec", {{"schedulerName", "volcano"}}}};
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, OperatorConfig{});
  EXPECT_FALSE(a.create_pod_group.has_value());
  EXPECT_EQ((*PodNamed(a, "mnist-worker-0"))["spec"]["schedulerName"], "volcano");
  EXPECT_FALSE((*PodNamed(a, "mnist-ps-0"))["spec"].contains("schedulerName"));
  EXPECT_EQ((*PodNamed(a, "mnist-worker-0"))["metadata"]["annotations"],
            (json{{"kubetrain.io/auth-secret", "mnist-auth"}}));
}

TEST(DesiredTest, ASuspendedGangJobCreatesNoPodGroup) {
  JobObject job = GangJob("volcano", json::object());
  job.object["spec"]["runPolicy"]["suspend"] = true;
  Observed o;
  o.now = kT0;
  Actions a = Desired(job, o, OperatorConfig{});
  EXPECT_FALSE(a.create_pod_group.has_value());
  EXPECT_TRUE(a.create_pods.empty());
  EXPECT_EQ(a.status["state"], "Suspended");
}

// --- The end of a job never destroys the only copy of the parameters (desired_hold.cc) ---------

json CheckpointingJob(const std::string& run_policy = "") {
  json j = JobJson(run_policy);
  j["spec"]["training"]["checkpoint"] = {{"directory", "/ckpt"}};
  return j;
}

// The chief could not export the model: the job failed at kT0.
json FailedStatus() {
  return {{"conditions", json::array({{{"type", "Failed"},
                                       {"status", "True"},
                                       {"reason", "TrainingJobFailed"},
                                       {"message", "worker-0 exited 1: cannot export"}},
                                      {{"type", "Created"},
                                       {"status", "True"},
                                       {"reason", "TrainingJobCreated"},
                                       {"message", ""}}})},
          {"completionTime", "2027-01-15T08:00:00Z"}};
}

TEST(DesiredTest, PsPodsOfACheckpointingJobMayTakeTheirTimeToSaveOrHold) {
  Observed o = Fresh(JobJson());
  Actions a = Desired(Job(CheckpointingJob()), o, OperatorConfig{});
  EXPECT_EQ((*PodNamed(a, "mnist-ps-0"))["spec"]["terminationGracePeriodSeconds"], 720);
  // It listens on every address of its pod: kubectl port-forward reaches its localhost.
  for (const auto& arg : (*PodNamed(a, "mnist-ps-0"))["spec"]["containers"][0]["args"]) {
    EXPECT_FALSE(absl::StartsWith(arg.get<std::string>(), "--bind_host")) << arg;
  }
  EXPECT_EQ(kPsTerminationGraceSeconds, kDefaultKeepServingAfterCheckpointFailureSeconds + 120);
  EXPECT_FALSE((*PodNamed(a, "mnist-worker-0"))["spec"].contains("terminationGracePeriodSeconds"));
  // No checkpoint directory: nothing to save, the default grace.
  Actions b = Desired(Job(JobJson()), o, OperatorConfig{});
  EXPECT_FALSE((*PodNamed(b, "mnist-ps-0"))["spec"].contains("terminationGracePeriodSeconds"));
  // The template's own grace period wins (it bounds the hold).
  json own = CheckpointingJob();
  own["spec"]["replicaSpecs"]["PS"]["template"] = {
      {"spec", {{"terminationGracePeriodSeconds", 60}}}};
  Actions c = Desired(Job(own), o, OperatorConfig{});
  EXPECT_EQ((*PodNamed(c, "mnist-ps-0"))["spec"]["terminationGracePeriodSeconds"], 60);
}

TEST(DesiredTest, PsTasksHoldingUnsavedParametersKeepTheJobAndSayHowToSaveTheModel) {
  const OperatorConfig config;
  const JobObject job = Job(CheckpointingJob("{\"ttlSecondsAfterFinished\": 0}"), FailedStatus());
  ASSERT_TRUE(PsTasksMayHoldParameters(*ParseTrainingJob(job.object.dump()), job.status));
  // cleanPodPolicy stopped the PS tasks: they are writing their final checkpoint.
  Observed o = AllPods("Running", kT0 + absl::Seconds(5));
  o.pods.erase(o.pods.begin() + 3);  // worker-1 is gone
  o.pods.erase(o.pods.begin() + 1);  // worker-0 too
  for (auto& p : o.pods) {
    p.deleting = true;
    p.deletion_deadline = kT0 + absl::Seconds(kPsTerminationGraceSeconds);
  }
  Actions a = Desired(job, o, config);
  EXPECT_FALSE(a.delete_job);  // the TTL waits for them
  EXPECT_TRUE(a.delete_pods.empty());
  EXPECT_EQ(a.requeue_after, config.progress_interval);  // to read their metrics again
  EXPECT_EQ(Condition(a.status, "ParametersHeld"), "absent");

  // They could not: they hold the parameters.
  for (auto& p : o.pods) p.holds_unsaved_parameters = true;
  Actions b = Desired(job, o, config);
  EXPECT_FALSE(b.delete_job);
  EXPECT_EQ(Condition(b.status, "ParametersHeld"), "True/FinalCheckpointFailed");
  EXPECT_EQ(b.status["state"], "Failed");  // not a state: the job failed
  const std::string message = ConditionMessage(b.status, "ParametersHeld");
  EXPECT_EQ(message,
            "mnist-ps-0, mnist-ps-1 could not write the final checkpoint to "
            "spec.training.checkpoint.directory /ckpt and hold the trained parameters read-only "
            "until 2027-01-15T08:12:00Z; then they are gone. Save the model now "
            "(docs/trainingjob.md, \"Full, read-only and failing disks\"), with every PS task:\n"
            "  kubectl -n ns3 port-forward pod/mnist-ps-0 22220:2222 &\n"
            "  kubectl -n ns3 port-forward pod/mnist-ps-1 22221:2222 &\n"
            "  kubectl -n ns3 get configmap mnist-config -o "
            "jsonpath='{.data.trainingjob\\.yaml}' > mnist.yaml\n"
            "  mkdir -m 700 mnist-auth\n"
            "  kubectl -n ns3 get secret mnist-auth -o jsonpath='{.data.job\\.key}' | base64 -d > "
            "mnist-auth/job.key\n"
            "  kubectl -n ns3 get secret mnist-auth -o jsonpath='{.data.ca\\.crt}' | base64 -d > "
            "mnist-auth/ca.crt\n"
            "  kubectl -n ns3 get secret mnist-auth -o jsonpath='{.data.tls\\.crt}' | base64 -d > "
            "mnist-auth/tls.crt\n"
            "  kubectl -n ns3 get secret mnist-auth -o jsonpath='{.data.tls\\.key}' | base64 -d > "
            "mnist-auth/tls.key\n"
            "  kubetrain export --from-ps 127.0.0.1:22220,127.0.0.1:22221 --job mnist.yaml "
            "--output mnist-model.ktm --auth-dir mnist-auth\n"
            "then end the hold: kubectl -n ns3 delete pod mnist-ps-0 mnist-ps-1 --grace-period=1");
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].type, "Warning");
  EXPECT_EQ(b.events[0].reason, "FinalCheckpointFailed");
  EXPECT_EQ(b.events[0].message, message);
  // Holding on: nothing new, no second Event, no polling (their exit is a pod event).
  Actions c = Desired(Job(job.object, b.status), o, config);
  EXPECT_TRUE(c.events.empty());
  EXPECT_FALSE(c.delete_job);
  EXPECT_FALSE(c.requeue_after.has_value());

  // The hold is over (ended or timed out): they exited. The job goes now.
  Observed gone;
  gone.now = kT0 + absl::Seconds(300);
  for (int i = 0; i < 2; ++i) {
    gone.pods.push_back(Pod("ps", i, "Failed", 1));
    gone.pods.back().last_termination = ObservedPod::Termination{
        1, "Error",
        "the final checkpoint of ps:" + std::to_string(i) +
            " at version 300 could not be written to spec.training.checkpoint.directory /ckpt"};
  }
  Actions d = Desired(Job(job.object, c.status), gone, config);
  EXPECT_EQ(Condition(d.status, "ParametersHeld"), "False/ParametersReleased");
  EXPECT_EQ(ConditionMessage(d.status, "ParametersHeld"),
            "The PS tasks no longer hold the parameters: ps-0 exited 1: the final checkpoint of "
            "ps:0 at version 300 could not be written to spec.training.checkpoint.directory "
            "/ckpt; ps-1 exited 1: the final checkpoint of ps:1 at version 300 could not be "
            "written to spec.training.checkpoint.directory /ckpt");
  EXPECT_TRUE(d.delete_job);
}

TEST(DesiredTest, TheTtlStopsPsTasksThatMayHoldParametersBeforeDeletingTheJob) {
  // cleanPodPolicy None kept the PS tasks running (serving, not read-only).
  const JobObject job =
      Job(CheckpointingJob("{\"ttlSecondsAfterFinished\": 60, \"cleanPodPolicy\": \"None\"}"),
          FailedStatus());
  Observed o = AllPods("Running", kT0 + absl::Seconds(30));
  Actions a = Desired(job, o, OperatorConfig{});
  EXPECT_TRUE(a.delete_pods.empty());
  EXPECT_EQ(a.requeue_after, absl::Seconds(30));  // the TTL
  o.now = kT0 + absl::Seconds(60);
  Actions b = Desired(job, o, OperatorConfig{});
  EXPECT_FALSE(b.delete_job);
  EXPECT_EQ(b.delete_pods, (std::vector<std::string>{"mnist-ps-0", "mnist-ps-1"}));
  // Without a checkpoint directory there is nothing to save: the job goes.
  const JobObject plain = Job(
      JobJson("{\"ttlSecondsAfterFinished\": 60, \"cleanPodPolicy\": \"None\"}"), FailedStatus());
  EXPECT_TRUE(Desired(plain, o, OperatorConfig{}).delete_job);
}

TEST(DesiredTest, ASucceededJobsModelIsSavedSoItsPsTasksAreNotKept) {
  json status = FailedStatus();
  status["conditions"][0]["type"] = "Succeeded";
  const JobObject job = Job(CheckpointingJob("{\"ttlSecondsAfterFinished\": 0}"), status);
  EXPECT_FALSE(PsTasksMayHoldParameters(*ParseTrainingJob(job.object.dump()), job.status));
  Observed o = AllPods("Running", kT0 + absl::Seconds(60));
  for (auto& p : o.pods) p.holds_unsaved_parameters = true;
  Actions a = Desired(job, o, OperatorConfig{});
  EXPECT_TRUE(a.delete_job);
  EXPECT_EQ(Condition(a.status, "ParametersHeld"), "absent");
}

// --- authentication and isolation ---------------------------------------------------------

const json* VolumeNamed(const json& pod, const std::string& name) {
  if (!pod["spec"].contains("volumes")) return nullptr;
  for (const auto& v : pod["spec"]["volumes"]) {
    if (v["name"] == name) return &v;
  }
  return nullptr;
}

// The files a pod's credentials volume gives it: "key->path" in order.
std::vector<std::string> AuthItems(const json& pod) {
  std::vector<std::string> out;
  const json* v = VolumeNamed(pod, "kubetrain-auth");
  if (v == nullptr) return out;
  for (const auto& item : (*v)["secret"]["items"]) {
    out.push_back(item["key"].get<std::string>() + "->" + item["path"].get<std::string>());
  }
  return out;
}

std::string Unbase64(const json& v) {
  std::string out;
  EXPECT_TRUE(absl::Base64Unescape(v.get<std::string>(), &out)) << v;
  return out;
}

TEST(DesiredTest, TheSecretIsAskedForBeforeAnyPodWithEveryTasksToken) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  j["spec"]["replicaSpecs"]["Evaluator"] = {{"replicas", 1}};
  Observed o;
  o.now = kT0;
  Actions a = Desired(Job(j), o, OperatorConfig{});
  ASSERT_TRUE(a.create_auth_secret.has_value());
  EXPECT_TRUE(a.create_auth_secret->tls);  // on by default
  EXPECT_EQ(a.create_auth_secret->token_tasks,
            (std::vector<JobTask>{{"chief", 0}, {"worker", 0}, {"worker", 1}, {"evaluator", 0}}));
  EXPECT_TRUE(a.create_pods.empty());
  EXPECT_EQ(a.create_services.size(), 6u);  // the rest is there when the pods come
  ASSERT_TRUE(a.create_network_policy.has_value());
  EXPECT_FALSE(a.patch_auth_secret.has_value());

  // What the apply layer builds from it, with the credentials it generated.
  JobCredentials creds;
  creds.job_key = kJobKey;
  creds.ca_cert_pem = "CA PEM";
  creds.cert_pem = "CERT PEM";
  creds.key_pem = "KEY PEM";
  const json secret = BuildAuthSecret(Job(j), creds, a.create_auth_secret->token_tasks);
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["type"], "Opaque");
  EXPECT_EQ(secret["metadata"]["name"], "mnist-auth");
  EXPECT_EQ(secret["metadata"]["namespace"], "ns3");
  EXPECT_EQ(secret["metadata"]["labels"], (json{{"kubetrain.io/job-name", "mnist"}}));
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["controller"], true);
  std::vector<std::string> keys;
  for (const auto& [k, v] : secret["data"].items()) keys.push_back(k);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"ca.crt", "job.key", "tls.crt", "tls.key", "token.chief-0",
                                      "token.evaluator-0", "token.worker-0", "token.worker-1"}));
  EXPECT_EQ(Unbase64(secret["data"]["job.key"]), kJobKey);
  EXPECT_EQ(Unbase64(secret["data"]["tls.key"]), "KEY PEM");
  for (const JobTask& t : a.create_auth_secret->token_tasks) {
    EXPECT_EQ(Unbase64(secret["data"][TokenKey(t.type, t.index)]),
              TaskToken(kJobKey, t.type, t.index))
        << t.name();
  }
  EXPECT_NE(TaskToken(kJobKey, "worker", 0), TaskToken(kJobKey, "worker", 1));
}

TEST(DesiredTest, EachPodMountsOnlyItsOwnFilesReadOnly) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Chief"] = {{"replicas", 1}};
  Observed o = Fresh(j);
  Actions a = Desired(Job(j), o, OperatorConfig{});
  ASSERT_EQ(a.create_pods.size(), 5u);
  const std::vector<std::string> tls = {"ca.crt->ca.crt", "tls.crt->tls.crt", "tls.key->tls.key"};
  auto with_tls = [&](std::string first) {
    std::vector<std::string> v = {std::move(first)};
    v.insert(v.end(), tls.begin(), tls.end());
    return v;
  };
  EXPECT_EQ(AuthItems(*PodNamed(a, "mnist-ps-1")), with_tls("job.key->job.key"));
  EXPECT_EQ(AuthItems(*PodNamed(a, "mnist-worker-1")), with_tls("token.worker-1->token"));
  EXPECT_EQ(AuthItems(*PodNamed(a, "mnist-chief-0")), with_tls("token.chief-0->token"));
  for (const json& pod : a.create_pods) {
    SCOPED_TRACE(pod["metadata"]["name"].dump());
    const json& v = *VolumeNamed(pod, "kubetrain-auth");
    EXPECT_EQ(v["secret"]["secretName"], "mnist-auth");
    EXPECT_EQ(v["secret"]["defaultMode"], 0444);  // the runtime's user is not the kubelet's
    const json& c = pod["spec"]["containers"][0];
    EXPECT_EQ(c["volumeMounts"][1], (json{{"name", "kubetrain-auth"},
                                          {"mountPath", "/var/run/kubetrain/auth"},
                                          {"readOnly", true}}));
    EXPECT_EQ(EnvOf(pod, "KUBETRAIN_AUTH_DIR"), "/var/run/kubetrain/auth");
    EXPECT_EQ(EnvOf(pod, "KUBETRAIN_INSECURE"), "");  // with credentials: never told to run open
    EXPECT_EQ(pod["metadata"]["annotations"]["kubetrain.io/auth-secret"], "mnist-auth");
    // No task but a PS ever sees the job key.
    if (pod["metadata"]["labels"]["kubetrain.io/replica-type"] != "ps") {
      EXPECT_EQ(v.dump().find("job.key"), std::string::npos);
    }
  }
}

TEST(DesiredTest, AUsersOwnContainersGetNoCredentialsButWaitForTheSecretToo) {
  json j = JobJson();
  j["spec"]["replicaSpecs"]["Worker"]["template"] = {
      {"spec",
       {{"containers", json::array({{{"name", "tensorflow"},
                                     {"image", "tf"},
                                     {"command", json::array({"python", "train.py"})}}})}}}};
  Observed first;
  first.now = kT0;
  EXPECT_TRUE(Desired(Job(j), first, OperatorConfig{}).create_pods.empty());
  Actions a = Desired(Job(j), Fresh(j), OperatorConfig{});
  const json& w0 = *PodNamed(a, "mnist-worker-0");
  EXPECT_EQ(VolumeNamed(w0, "kubetrain-auth"), nullptr);
  EXPECT_EQ(EnvOf(w0, "KUBETRAIN_AUTH_DIR"), "");
  EXPECT_FALSE(w0["metadata"].contains("annotations"));
  EXPECT_NE(VolumeNamed(*PodNamed(a, "mnist-ps-0"), "kubetrain-auth"), nullptr);
}

TEST(DesiredTest, TlsOffGivesTokensOnlyButAnExistingSecretKeepsItsTls) {
  OperatorConfig no_tls;
  no_tls.job_tls = false;
  Observed first;
  first.now = kT0;
  Actions a = Desired(Job(JobJson()), first, no_tls);
  ASSERT_TRUE(a.create_auth_secret.has_value());
  EXPECT_FALSE(a.create_auth_secret->tls);
  JobCredentials creds;
  creds.job_key = kJobKey;  // no CA: GenerateJobCredentials(name, false)
  const json secret = BuildAuthSecret(Job(JobJson()), creds, a.create_auth_secret->token_tasks);
  EXPECT_FALSE(secret["data"].contains("ca.crt"));
  EXPECT_FALSE(secret["data"].contains("tls.key"));
  Observed o = Fresh(JobJson());
  o.auth_secret = SecretOf(JobJson(), /*tls=*/false);
  Actions b = Desired(Job(JobJson()), o, no_tls);
  EXPECT_EQ(AuthItems(*PodNamed(b, "mnist-ps-0")), std::vector<std::string>{"job.key->job.key"});
  EXPECT_EQ(AuthItems(*PodNamed(b, "mnist-worker-0")),
            std::vector<std::string>{"token.worker-0->token"});
  // The flag is for new Secrets: a job created with TLS keeps it.
  Actions c = Desired(Job(JobJson()), Fresh(JobJson()), no_tls);
  EXPECT_EQ(AuthItems(*PodNamed(c, "mnist-worker-0")).size(), 4u);
}

TEST(DesiredTest, NewTasksGetATokenBeforeTheirPodAndRemovedOnesLoseIt) {
  json three = JobJson("", "Never", /*workers=*/3);
  Observed o = AllPods("Running");  // its Secret has tokens for workers 0 and 1
  Actions a = Desired(Job(three), o, OperatorConfig{});
  ASSERT_TRUE(a.patch_auth_secret.has_value());
  EXPECT_EQ(
      *a.patch_auth_secret,
      (json{{"data", {{"token.worker-2", absl::Base64Escape(TaskToken(kJobKey, "worker", 2))}}}}));
  EXPECT_TRUE(a.create_pods.empty());  // worker 2 waits for the cache to show its token
  o.auth_secret->keys.insert("token.worker-2");
  Actions b = Desired(Job(three), o, OperatorConfig{});
  EXPECT_FALSE(b.patch_auth_secret.has_value());
  ASSERT_EQ(b.create_pods.size(), 1u);
  EXPECT_EQ(b.create_pods[0]["metadata"]["name"], "mnist-worker-2");
  // Back to one worker: the tokens of workers 1 and 2 go.
  Actions c = Desired(Job(JobJson("", "Never", 1)), o, OperatorConfig{});
  ASSERT_TRUE(c.patch_auth_secret.has_value());
  EXPECT_EQ(*c.patch_auth_secret,
            (json{{"data", {{"token.worker-1", nullptr}, {"token.worker-2", nullptr}}}}));
}

TEST(DesiredTest, ASecretDeletedUnderRunningTasksIsNeverReplacedAndFailsTheJobOnARestart) {
  json job = JobJson("", "ExitCode");
  Observed o = AllPods("Running");
  o.auth_secret.reset();
  Actions a = Desired(Job(job), o, OperatorConfig{});
  EXPECT_FALSE(a.create_auth_secret.has_value());  // a new key would lock out restarted tasks
  EXPECT_EQ(a.status["state"], "Running");         // the running tasks keep their copy
  EXPECT_EQ(Condition(a.status, "AuthSecretMissing"), "True/AuthSecretLost");
  ASSERT_FALSE(a.events.empty());
  EXPECT_EQ(a.events.back().type, "Warning");
  EXPECT_TRUE(absl::StrContains(a.events.back().message, "Secret mnist-auth was deleted"))
      << a.events.back().message;
  // Still gone: no second Event.
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  for (const JobEvent& e : b.events) EXPECT_NE(e.reason, "AuthSecretLost");
  // Worker 1 is killed and must be recreated: it could not join the PS tasks.
  o.pods.erase(std::remove_if(o.pods.begin(), o.pods.end(),
                              [](auto& p) { return p.name == "mnist-worker-1"; }),
               o.pods.end());
  Actions c = Desired(Job(job, b.status), o, OperatorConfig{});
  EXPECT_EQ(Condition(c.status, "Failed"), "True/AuthSecretLost");
  EXPECT_TRUE(c.create_pods.empty());
  EXPECT_EQ(ConditionMessage(c.status, "Failed"),
            "TrainingJob mnist has failed because Secret mnist-auth was deleted while it ran, "
            "and pod mnist-worker-1 cannot be started without it (a new key would lock it out "
            "of the running PS tasks); delete and re-create the TrainingJob to run it again.");
  // With no pod left that holds the old key (e.g. suspended), a new Secret is fine.
  Observed none;
  none.now = kT0;
  none.config_map_exists = true;
  EXPECT_TRUE(Desired(Job(job, b.status), none, OperatorConfig{}).create_auth_secret);
  // A Secret whose job.key was spoiled is lost as well.
  Observed spoiled = AllPods("Running");
  spoiled.auth_secret->job_key.clear();
  EXPECT_EQ(Condition(Desired(Job(job), spoiled, OperatorConfig{}).status, "AuthSecretMissing"),
            "True/AuthSecretLost");
}

TEST(DesiredTest, AJobStartedWithoutCredentialsRunsOnWithoutThem) {
  // An operator that gave jobs no credentials created these pods; this one
  // took over while they ran (an upgrade).
  json job = JobJson("", "ExitCode");
  Observed o = AllPods("Running");
  o.auth_secret.reset();
  for (ObservedPod& p : o.pods) p.uses_auth_secret = false;
  o.pods.erase(std::remove_if(o.pods.begin(), o.pods.end(),
                              [](auto& p) { return p.name == "mnist-worker-1"; }),
               o.pods.end());
  Actions a = Desired(Job(job), o, OperatorConfig{});
  // A key now would lock the running workers out of the open PS tasks.
  EXPECT_FALSE(a.create_auth_secret.has_value());
  EXPECT_EQ(a.status["state"], "Running");
  EXPECT_EQ(Condition(a.status, "RunningWithoutCredentials"), "True/StartedWithoutCredentials");
  EXPECT_EQ(Condition(a.status, "AuthSecretMissing"), "absent");
  // The recreated worker runs as its peers do: nothing of a Secret.
  ASSERT_EQ(a.create_pods.size(), 1u);
  const json& pod = a.create_pods[0];
  EXPECT_EQ(pod["metadata"]["name"], "mnist-worker-1");
  EXPECT_FALSE(
      pod["metadata"].value("annotations", json::object()).contains(kAuthSecretAnnotation));
  for (const json& v : pod["spec"]["volumes"]) EXPECT_NE(v["name"], "kubetrain-auth") << v;
  const json& c = pod["spec"]["containers"][0];
  for (const json& m : c["volumeMounts"]) EXPECT_NE(m["name"], "kubetrain-auth") << m;
  for (const json& e : c["env"]) EXPECT_NE(e["name"], kAuthDirEnv) << e;
  // Only a worker: not told to run open (kubetrain-ps only needs that).
  EXPECT_EQ(EnvOf(pod, "KUBETRAIN_INSECURE"), "");
  // A PS task started again runs open as its peers do, and says so explicitly.
  Observed ps_gone = o;
  ps_gone.pods.erase(std::remove_if(ps_gone.pods.begin(), ps_gone.pods.end(),
                                    [](auto& p) { return p.name == "mnist-ps-1"; }),
                     ps_gone.pods.end());
  Actions again = Desired(Job(job), ps_gone, OperatorConfig{});
  const json* ps = PodNamed(again, "mnist-ps-1");
  ASSERT_NE(ps, nullptr);
  EXPECT_EQ(EnvOf(*ps, "KUBETRAIN_INSECURE"), "1");
  EXPECT_EQ(EnvOf(*ps, "KUBETRAIN_AUTH_DIR"), "");
  // A pod being deleted does not count, and a job with no pods left gets a Secret.
  for (ObservedPod& p : o.pods) p.deleting = true;
  Actions b = Desired(Job(job, a.status), o, OperatorConfig{});
  EXPECT_TRUE(b.create_auth_secret.has_value());
  EXPECT_EQ(Condition(b.status, "RunningWithoutCredentials"), "False/CredentialsIssued");
}

TEST(DesiredTest, TheNetworkPolicyAdmitsOnlyTheJobsPodsExceptToMetrics) {
  Observed o = Fresh(JobJson());
  OperatorConfig config;
  config.metrics_port = 9191;
  Actions a = Desired(Job(JobJson()), o, config);
  ASSERT_TRUE(a.create_network_policy.has_value());
  EXPECT_EQ(*a.create_network_policy, json::parse(R"({
      "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
      "metadata": {"name": "mnist", "namespace": "ns3",
                   "labels": {"kubetrain.io/job-name": "mnist"},
                   "ownerReferences": [{"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob",
                     "name": "mnist", "uid": "u-1", "controller": true,
                     "blockOwnerDeletion": true}]},
      "spec": {"podSelector": {"matchLabels": {"kubetrain.io/job-name": "mnist"}},
               "policyTypes": ["Ingress"],
               "ingress": [
                 {"from": [{"podSelector": {"matchLabels": {"kubetrain.io/job-name": "mnist"}}}]},
                 {"ports": [{"protocol": "TCP", "port": 9191}]}]}})"));
  o.network_policy_exists = true;
  EXPECT_FALSE(Desired(Job(JobJson()), o, config).create_network_policy.has_value());
}

}  // namespace
}  // namespace kubetrain
