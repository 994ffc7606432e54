// ExporterTask's configuration errors and exit codes; the whole export (a
// job's PS tasks pulled and written) runs in
// tests/integration/test_export_from_ps.py through `kubetrain export`.
#include "worker/exporter_task.h"

#include <gtest/gtest.h>

#include "core/testing/temp_files.h"

namespace kubetrain {
namespace {

CallerChannelFactory NoChannels() {
  return [](const std::string&, int64_t, const CallerCredentials&) {
    return std::unique_ptr<ShardChannel>();
  };
}

TEST(ExporterTaskTest, RefusesToStartWithoutAnOutputFile) {
  RealClock clock;
  ExporterTaskOptions options;
  options.export_options.job_file = "job.yaml";
  options.export_options.ps_addresses = {"127.0.0.1:1"};
  auto task = ExporterTask::Create(options, NoChannels(), &clock);
  ASSERT_FALSE(task.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(task.status()));
  EXPECT_CONTAINS(std::string(task.status().message()), "--export_model");
}

TEST(ExporterTaskTest, CredentialsThatCannotBeReadNameTheDirectory) {
  RealClock clock;
  ExporterTaskOptions options;
  options.export_options.output = "model.ktm";
  options.auth_dir = NewTestDir("no_credentials");
  auto task = ExporterTask::Create(options, NoChannels(), &clock);
  ASSERT_FALSE(task.ok());
  EXPECT_CONTAINS(std::string(task.status().message()), options.auth_dir);
}

TEST(ExporterTaskTest, ExitCodesSeparateBadInputFromFailures) {
  EXPECT_EQ(ExporterTask::ExitCode(absl::OkStatus()), 0);
  // No retry helps: another job's PS, a wrong shape, refused credentials.
  EXPECT_EQ(ExporterTask::ExitCode(absl::InvalidArgumentError("fingerprint")), 2);
  EXPECT_EQ(ExporterTask::ExitCode(absl::FailedPreconditionError("ps count")), 2);
  EXPECT_EQ(ExporterTask::ExitCode(absl::UnauthenticatedError("token")), 2);
  EXPECT_EQ(ExporterTask::ExitCode(absl::PermissionDeniedError("task")), 2);
  // The PS tasks cannot be reached or the file cannot be written.
  EXPECT_EQ(ExporterTask::ExitCode(absl::UnavailableError("connect")), 1);
  EXPECT_EQ(ExporterTask::ExitCode(absl::DeadlineExceededError("pull")), 1);
  EXPECT_EQ(ExporterTask::ExitCode(absl::InternalError("write")), 1);
}

}  // namespace
}  // namespace kubetrain
