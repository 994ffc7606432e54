#include "cli/export.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

TEST(ExportArgvTest, RunsTheExporterOfKubetrainWorkerWithTheFlags) {
  auto argv = ExportArgv({"127.0.0.1:1,127.0.0.1:2", "job.yaml", "/other/model.ktm", "/opt/bin"});
  ASSERT_TRUE(argv.ok()) << argv.status();
  EXPECT_EQ(*argv,
            (std::vector<std::string>{"/opt/bin/kubetrain-worker", "--config=job.yaml",
                                      "--export_from_ps=127.0.0.1:1,127.0.0.1:2",
                                      "--export_model=/other/model.ktm", "--metrics_address="}));
}

TEST(ExportArgvTest, TheAuthDirGoesToTheExporter) {
  ExportOptions options{"127.0.0.1:1", "job.yaml", "m.ktm", "/opt/bin"};
  options.auth_dir = "/run/auth";
  auto argv = ExportArgv(options);
  ASSERT_TRUE(argv.ok()) << argv.status();
  EXPECT_EQ(argv->back(), "--auth_dir=/run/auth");
}

TEST(ExportArgvTest, AMissingFlagIsNamed) {
  EXPECT_NE(ExportArgv({"", "job.yaml", "m.ktm", "b"}).status().message().find("--from-ps"),
            std::string::npos);
  EXPECT_NE(ExportArgv({"h:1", "", "m.ktm", "b"}).status().message().find("--job"),
            std::string::npos);
  EXPECT_NE(ExportArgv({"h:1", "job.yaml", "", "b"}).status().message().find("--output"),
            std::string::npos);
}

TEST(ExportCommandLineTest, QuotesWhatAShellWouldSplit) {
  EXPECT_EQ(ExportCommandLine({"127.0.0.1:5", "127.0.0.1:6"}, "/jobs/a.yaml", "/tmp/m.ktm"),
            "kubetrain export --from-ps 127.0.0.1:5,127.0.0.1:6 --job /jobs/a.yaml --output "
            "/tmp/m.ktm");
  EXPECT_EQ(ExportCommandLine({"h:1"}, "my job.yaml", "it's.ktm"),
            "kubetrain export --from-ps h:1 --job 'my job.yaml' --output 'it'\\''s.ktm'");
  EXPECT_EQ(ExportCommandLine({"h:1"}, "a.yaml", "m.ktm", "/tmp/kubetrain-a-auth-x1/export"),
            "kubetrain export --from-ps h:1 --job a.yaml --output m.ktm --auth-dir "
            "/tmp/kubetrain-a-auth-x1/export");
}

}  // namespace
}  // namespace kubetrain
