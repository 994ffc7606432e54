#include "cli/process.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <set>

#include "absl/synchronization/mutex.h"

namespace kubetrain {
namespace {

TEST(ProcessTest, DeliversLinesEnvAndExitCode) {
  absl::Mutex mu;
  std::vector<std::string> out, err;
  auto p = Process::Start(
      {{"/bin/sh", "-c", "echo one; echo \"$GREETING\"; echo oops >&2; printf tail; exit 3"},
       {{"GREETING", "hello"}}},
      [&](const std::string& line, bool is_stderr) {
        absl::MutexLock l(&mu);
        (is_stderr ? err : out).push_back(line);
      });
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Wait(), 3);
  EXPECT_EQ(out, (std::vector<std::string>{"one", "hello", "tail"}));
  EXPECT_EQ(err, (std::vector<std::string>{"oops"}));
}

TEST(ProcessTest, SignalReportsShellStyleExitCode) {
  auto p = Process::Start({{"/bin/sleep", "30"}, {}}, [](const std::string&, bool) {});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*p)->Poll().has_value());
  (*p)->Signal(SIGKILL);
  EXPECT_EQ((*p)->Wait(), 137);
}

TEST(ProcessTest, MissingExecutableIsAClearError) {
  auto p = Process::Start({{"/nonexistent/kubetrain-ps"}, {}}, [](const std::string&, bool) {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("/nonexistent/kubetrain-ps"), std::string::npos);
}

TEST(ProcessTest, FreePortsAreDistinct) {
  auto ports = PickFreePorts(20);
  ASSERT_TRUE(ports.ok());
  EXPECT_EQ(std::set<int>(ports->begin(), ports->end()).size(), 20u);
}

}  // namespace
}  // namespace kubetrain
