#include "operator/operator_options.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

TEST(OperatorOptionsTest, DefaultsAndFlags) {
  ::setenv("KUBECONFIG", "/env/kubeconfig", 1);
  OperatorOptions defaults;
  FlagParser p0("op");
  defaults.Register(&p0);
  char prog[] = "op";
  char* none[] = {prog};
  ASSERT_TRUE(p0.Parse(1, none, 1, nullptr).ok());
  defaults.Finish();
  EXPECT_EQ(defaults.kubeconfig, "/env/kubeconfig");
  EXPECT_EQ(defaults.config.port, 2222);
  EXPECT_EQ(defaults.config.bulk_port, 2223);  // PS pods serve the bulk data plane
  EXPECT_EQ(defaults.controller.workers, 8);
  EXPECT_EQ(defaults.kube_api_qps, 100);
  EXPECT_EQ(defaults.kube_api_burst, 200);
  EXPECT_EQ(defaults.reconciler.create_parallelism, 16);
  EXPECT_EQ(defaults.config.pod_group_retry, absl::Seconds(30));
  EXPECT_TRUE(defaults.config.job_tls);  // TLS between a job's tasks unless turned off
  EXPECT_TRUE(defaults.Validate().ok());
  EXPECT_EQ(defaults.health_address, "0.0.0.0:8081");

  OperatorOptions o;
  FlagParser parser("op");
  o.Register(&parser);
  std::vector<std::string> args = {"op",
                                   "--port=3333",
                                   "--bulk-port=-1",
                                   "--workers",
                                   "4",
                                   "--namespace=ml",
                                   "--leader-elect",
                                   "--cluster-domain=cluster.local",
                                   "--runtime-image=r:1",
                                   "--in-cluster",
                                   "--kube-api-qps=7.5",
                                   "--kube-api-burst=9",
                                   "--create-parallelism=3",
                                   "--pod-group-retry-seconds=5",
                                   "--job-tls=false"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_TRUE(parser.Parse(static_cast<int>(argv.size()), argv.data(), 1, nullptr).ok());
  o.Finish();
  EXPECT_EQ(o.config.port, 3333);
  EXPECT_EQ(o.config.bulk_port, -1);
  EXPECT_EQ(o.controller.workers, 4);
  EXPECT_EQ(o.controller.namespace_, "ml");
  EXPECT_TRUE(o.leader_elect);
  EXPECT_TRUE(o.in_cluster);
  EXPECT_EQ(o.config.cluster_domain, "cluster.local");
  EXPECT_EQ(o.config.runtime_image, "r:1");
  EXPECT_EQ(o.kube_api_qps, 7.5);
  EXPECT_EQ(o.kube_api_burst, 9);
  EXPECT_EQ(o.reconciler.create_parallelism, 3);
  EXPECT_EQ(o.config.pod_group_retry, absl::Seconds(5));
  EXPECT_FALSE(o.config.job_tls);
  EXPECT_TRUE(o.Validate().ok());
}

TEST(OperatorOptionsTest, ValidateNamesTheFlag) {
  for (const auto& [arg, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--workers=0", "--workers"},
           {"--port=0", "--port"},
           {"--bulk-port=0", "--bulk-port"},
           {"--bulk-port=70000", "--bulk-port"},
           {"--bulk-port=2222", "--bulk-port"},
           {"--bulk-port=9090", "--bulk-port"},
           {"--kube-api-qps=-1", "--kube-api-qps"},
           {"--kube-api-burst=0", "--kube-api-burst"},
           {"--create-parallelism=0", "--create-parallelism"},
           {"--pod-group-retry-seconds=0", "--pod-group-retry-seconds"}}) {
    OperatorOptions o;
    FlagParser parser("op");
    o.Register(&parser);
    std::vector<std::string> args = {"op", arg};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    ASSERT_TRUE(parser.Parse(2, argv.data(), 1, nullptr).ok()) << arg;
    o.Finish();
    absl::Status s = o.Validate();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << arg;
    EXPECT_NE(s.message().find(flag), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace kubetrain
