#include "core/cluster_spec.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

// The exact strings Kubeflow training-operator's own test expects for the same
// jobs: pkg/controller.v1/tensorflow/pod_test.go, "Test ClusterSpec"
// (TestTFJobName "test-tfjob", one PS, one worker, optionally one evaluator,
// TF_CONFIG of worker 0, with and without a custom cluster domain).
TrainingJob TfJobTestJob(int workers, int ps, int evaluators, const std::string& ns) {
  TrainingJob job;
  job.name = "test-tfjob";
  job.namespace_ = ns;
  job.replica_specs["Worker"].replicas = workers;
  job.replica_specs["PS"].replicas = ps;
  if (evaluators > 0) job.replica_specs["Evaluator"].replicas = evaluators;
  return job;
}

std::string TfJobTfConfig(const TrainingJob& job, const std::string& domain) {
  // TFJob's genClusterSpec: {job}-{type}-{i}.{ns}.svc[.{domain}]:{port}.
  auto address = [&](const JobTask& t) {
    return absl::StrCat(job.name, "-", t.name(), ".", job.namespace_, ".svc",
                        domain.empty() ? "" : ".", domain, ":2222");
  };
  return SerializeTfConfig(BuildTfConfig(job, address, JobTask{"worker", 0}));
}

TEST(TfConfigTest, SerializesExactlyAsTfJobsOwnTest) {
  EXPECT_EQ(
      TfJobTfConfig(TfJobTestJob(1, 1, 0, "ns2"), "tf.training.org"),
      R"({"cluster":{"ps":["test-tfjob-ps-0.ns2.svc.tf.training.org:2222"],"worker":["test-tfjob-worker-0.ns2.svc.tf.training.org:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"})");
  EXPECT_EQ(
      TfJobTfConfig(TfJobTestJob(1, 1, 1, "ns3"), "tf.training.io"),
      R"({"cluster":{"evaluator":["test-tfjob-evaluator-0.ns3.svc.tf.training.io:2222"],"ps":["test-tfjob-ps-0.ns3.svc.tf.training.io:2222"],"worker":["test-tfjob-worker-0.ns3.svc.tf.training.io:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"})");
  EXPECT_EQ(
      TfJobTfConfig(TfJobTestJob(1, 1, 1, "ns3"), ""),
      R"({"cluster":{"evaluator":["test-tfjob-evaluator-0.ns3.svc:2222"],"ps":["test-tfjob-ps-0.ns3.svc:2222"],"worker":["test-tfjob-worker-0.ns3.svc:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"})");
}

TEST(TfConfigTest, RoundTrips) {
  TrainingJob job = TfJobTestJob(2, 1, 1, "ns3");
  job.replica_specs["Chief"].replicas = 1;
  auto address = [](const JobTask& t) { return absl::StrCat(t.name(), ":2222"); };
  TfConfig c = BuildTfConfig(job, address, JobTask{"worker", 1});
  auto parsed = ParseTfConfig(SerializeTfConfig(c));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster, c.cluster);
  EXPECT_EQ(parsed->task_type, "worker");
  EXPECT_EQ(parsed->task_index, 1);
  EXPECT_EQ(parsed->environment, "cloud");
  EXPECT_EQ(parsed->self_address(), "worker-1:2222");
  EXPECT_EQ(parsed->tasks("chief"), std::vector<std::string>{"chief-0:2222"});
}

TEST(TfConfigTest, JobTasksListChiefPsWorkerEvaluator) {
  TrainingJob job = TfJobTestJob(2, 2, 1, "ns");
  job.replica_specs["Chief"].replicas = 1;
  std::vector<std::string> names;
  for (const JobTask& t : JobTasks(job)) names.push_back(t.name());
  EXPECT_EQ(names, (std::vector<std::string>{"chief-0", "ps-0", "ps-1", "worker-0", "worker-1",
                                             "evaluator-0"}));
  EXPECT_EQ(TaskTypeOf("PS"), "ps");
  EXPECT_EQ(TaskTypeOf("Evaluator"), "evaluator");
  EXPECT_EQ(ReplicaKeyOf("chief"), "Chief");
  EXPECT_EQ(ReplicaKeyOf("master"), "");
}

TEST(TfConfigTest, ParsesTensorFlowExample) {
  auto c = ParseTfConfig(
      R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222","host2:2222"],
          "ps": ["host3:2222","host4:2222"]}, "task": {"type": "ps", "index": 1},
          "environment": "cloud", "rpc_layer": "grpc"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tasks("ps").size(), 2u);
  EXPECT_EQ(c->self_address(), "host4:2222");
  EXPECT_EQ(*PortOf(c->self_address()), 2222);
}

TEST(TfConfigTest, RejectsMalformed) {
  const char* bad[] = {
      "",
      "[]",
      "{\"task\":{\"type\":\"ps\",\"index\":0}}",
      R"({"cluster":{"ps":"h:1"},"task":{"type":"ps","index":0}})",
      R"({"cluster":{"ps":["h"]},"task":{"type":"ps","index":0}})",
      R"({"cluster":{"ps":["h:1"]},"task":{"type":"ps","index":3}})",
      R"({"cluster":{"ps":["h:1"]},"task":{"type":"worker","index":0}})",
      R"({"cluster":{"ps":["h:1"]},"task":{"type":"ps","index":"0"}})",
      R"({"cluster":{"ps":["h:99999"]},"task":{"type":"ps","index":0}})",
  };
  for (const char* b : bad) {
    auto c = ParseTfConfig(b);
    EXPECT_FALSE(c.ok()) << b;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find("TF_CONFIG"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kubetrain
