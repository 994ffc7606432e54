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
  EXPECT_EQ(defaults.controller.workers, 2);
  EXPECT_EQ(defaults.health_address, "0.0.0.0:8081");

  OperatorOptions o;
  FlagParser parser("op");
  o.Register(&parser);
  std::vector<std::string> args = {"op",
                                   "--port=3333",
                                   "--workers",
                                   "4",
                                   "--namespace=ml",
                                   "--leader-elect",
                                   "--cluster-domain=cluster.local",
                                   "--runtime-image=r:1",
                                   "--in-cluster"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_TRUE(parser.Parse(static_cast<int>(argv.size()), argv.data(), 1, nullptr).ok());
  o.Finish();
  EXPECT_EQ(o.config.port, 3333);
  EXPECT_EQ(o.controller.workers, 4);
  EXPECT_EQ(o.controller.namespace_, "ml");
  EXPECT_TRUE(o.leader_elect);
  EXPECT_TRUE(o.in_cluster);
  EXPECT_EQ(o.config.cluster_domain, "cluster.local");
  EXPECT_EQ(o.config.runtime_image, "r:1");
}

}  // namespace
}  // namespace kubetrain
