#include "ps/ps_flags.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "core/cluster_spec.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

// Parses `args` (after the program name) with $KUBETRAIN_BULK_PORT set to
// `env` (unset when null); returns Finish()'s status and the flags.
absl::Status ParsePsFlags(const char* env, std::vector<std::string> args, PsFlags* flags) {
  if (env == nullptr) {
    unsetenv(kBulkPortEnv);
  } else {
    setenv(kBulkPortEnv, env, 1);
  }
  args.insert(args.begin(), {"kubetrain-ps", "--config=job.yaml"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  FlagParser parser("kubetrain-ps");
  flags->Register(&parser);
  absl::Status parsed = parser.Parse(static_cast<int>(argv.size()), argv.data(), 1, nullptr);
  unsetenv(kBulkPortEnv);
  if (!parsed.ok()) return parsed;
  return flags->Finish();
}

TEST(PsFlagsTest, TheDataPlaneIsOffByDefault) {
  PsFlags flags;
  ASSERT_TRUE(ParsePsFlags(nullptr, {}, &flags).ok());
  EXPECT_EQ(flags.task.bulk_port, -1);
}

TEST(PsFlagsTest, TheEnvironmentGivesTheBulkPortAndTheFlagWins) {
  PsFlags from_env;
  ASSERT_TRUE(ParsePsFlags("2223", {}, &from_env).ok());
  EXPECT_EQ(from_env.task.bulk_port, 2223);

  PsFlags flag_wins;
  ASSERT_TRUE(ParsePsFlags("2223", {"--bulk_port=-1"}, &flag_wins).ok());
  EXPECT_EQ(flag_wins.task.bulk_port, -1);

  // A bad environment value is overridden by the flag, not reported.
  PsFlags flag_over_bad_env;
  ASSERT_TRUE(ParsePsFlags("twenty", {"--bulk_port=0"}, &flag_over_bad_env).ok());
  EXPECT_EQ(flag_over_bad_env.task.bulk_port, 0);
}

TEST(PsFlagsTest, ABadBulkPortNamesTheVariableOrTheFlag) {
  PsFlags not_a_number;
  absl::Status s = ParsePsFlags("twenty", {}, &not_a_number);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("$KUBETRAIN_BULK_PORT"), std::string::npos) << s;
  EXPECT_NE(s.message().find("\"twenty\""), std::string::npos) << s;

  PsFlags out_of_range;
  s = ParsePsFlags("70000", {}, &out_of_range);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("$KUBETRAIN_BULK_PORT"), std::string::npos) << s;
  EXPECT_NE(s.message().find("70000"), std::string::npos) << s;

  PsFlags bad_flag;
  s = ParsePsFlags(nullptr, {"--bulk_port=-5"}, &bad_flag);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--bulk_port"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("KUBETRAIN_BULK_PORT"), std::string::npos) << s;
}

}  // namespace
}  // namespace kubetrain
