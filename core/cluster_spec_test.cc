#include "core/cluster_spec.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

TEST(TfConfigTest, RoundTripMatchesTfJobBytes) {
  // The exact string TFJob's pod_test.go expects (keys sorted, task type before index).
  TfConfig c;
  c.cluster["ps"] = {"test-tfjob-ps-0.ns3.svc:2222"};
  c.cluster["worker"] = {"test-tfjob-worker-0.ns3.svc:2222"};
  c.cluster["evaluator"] = {"test-tfjob-evaluator-0.ns3.svc:2222"};
  c.task_type = "worker";
  c.task_index = 0;
  std::string s = SerializeTfConfig(c);
  EXPECT_EQ(s,
            "{\"cluster\":{\"evaluator\":[\"test-tfjob-evaluator-0.ns3.svc:2222\"],"
            "\"ps\":[\"test-tfjob-ps-0.ns3.svc:2222\"],\"worker\":[\"test-tfjob-worker-0.ns3."
            "svc:2222\"]},\"environment\":\"cloud\",\"task\":{\"index\":0,\"type\":\"worker\"}}");
  auto parsed = ParseTfConfig(s);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster, c.cluster);
  EXPECT_EQ(parsed->task_type, "worker");
  EXPECT_EQ(parsed->self_address(), "test-tfjob-worker-0.ns3.svc:2222");
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
      "", "[]", "{\"task\":{\"type\":\"ps\",\"index\":0}}",
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
    if (!c.ok()) EXPECT_NE(c.status().message().find("TF_CONFIG"), std::string::npos);
  }
}

}  // namespace
}  // namespace kubetrain
