#include "core/flags.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <new>
#include <thread>
#include <vector>

namespace kubetrain {
namespace {

absl::Status ParseArgs(FlagParser& p, std::vector<std::string> args,
                       std::vector<std::string>* positional = nullptr) {
  std::vector<char*> argv = {const_cast<char*>("prog")};
  for (auto& a : args) argv.push_back(a.data());
  return p.Parse(static_cast<int>(argv.size()), argv.data(), 1, positional);
}

TEST(FlagsTest, ParsesFormsAndRejectsBadInput) {
  std::string s = "x";
  int64_t n = 1;
  double d = 0;
  bool b = false;
  FlagParser p("prog");
  p.String("config", &s, "");
  p.Int("metrics_port", &n, "");
  p.Double("rate", &d, "");
  p.Bool("verbose", &b, "");
  ASSERT_TRUE(
      ParseArgs(p, {"--config=a.yaml", "--metrics-port", "9", "--rate=0.5", "--verbose"}).ok());
  EXPECT_EQ(s, "a.yaml");
  EXPECT_EQ(n, 9);
  EXPECT_EQ(d, 0.5);
  EXPECT_TRUE(b);
  auto st = ParseArgs(p, {"--metrics_port=nine"});
  EXPECT_NE(st.message().find("--metrics-port"), std::string::npos) << st;
  EXPECT_NE(ParseArgs(p, {"--confgi=x"}).message().find("unknown flag --confgi"),
            std::string::npos);
  EXPECT_FALSE(ParseArgs(p, {"--config"}).ok());
  EXPECT_FALSE(ParseArgs(p, {"stray"}).ok());
  std::vector<std::string> pos;
  ASSERT_TRUE(ParseArgs(p, {"run", "job.yaml"}, &pos).ok());
  EXPECT_EQ(pos, (std::vector<std::string>{"run", "job.yaml"}));
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

TEST(FlagsTest, ParseMainReturnsExitCodes) {
  std::string name;
  FlagParser ok("prog");
  ok.String("name", &name, "a name");
  char a0[] = "prog", a1[] = "--name=x";
  char* good[] = {a0, a1};
  EXPECT_EQ(ok.ParseMain(2, good), std::nullopt);
  EXPECT_EQ(name, "x");

  FlagParser help("prog");
  char h[] = "--help";
  char* want_help[] = {a0, h};
  EXPECT_EQ(help.ParseMain(2, want_help), 0);

  FlagParser bad("prog");
  char u[] = "--unknown=1";
  char* unknown[] = {a0, u};
  EXPECT_EQ(bad.ParseMain(2, unknown), 2);
}

// std::bad_alloc escaping on any thread ends the task with exit code 2 and a
// message, not an abort (SIGABRT, 134) with a core dump.
TEST(InitProcessDeathTest, BadAllocExitsWithCodeTwo) {
  EXPECT_EXIT(
      {
        InitProcess(ProcessProfile::kTensorBuffers);
        std::thread([] { throw std::bad_alloc(); }).join();
      },
      ::testing::ExitedWithCode(2), "error: out of memory \\(std::bad_alloc\\)");
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
  // Sanitizers' operator new reports a failed allocation and dies instead of
  // throwing (whatever allocator_may_return_null says), so only the thrown
  // bad_alloc above is checked in `make tsan`/`make asan`.
  EXPECT_EXIT(
      {
        InitProcess(ProcessProfile::kDefault);
        // A real failed allocation, not only a thrown one (on a thread: gtest
        // would catch it on its own).
        std::thread([] {
          std::vector<float> huge(std::numeric_limits<size_t>::max() / 8);
          std::printf("%f\n", huge[0]);
        }).join();
      },
      ::testing::ExitedWithCode(2), "out of memory");
#endif
}

}  // namespace
}  // namespace kubetrain
