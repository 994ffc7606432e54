#include "operator/status.h"

#include <gtest/gtest.h>

namespace kubetrain {
namespace {

using nlohmann::json;

const absl::Time kT0 = absl::FromUnixSeconds(1800000000);

TEST(StatusTest, TimesAreWholeSecondRfc3339) {
  EXPECT_EQ(Timestamp(kT0), "2027-01-15T08:00:00Z");
  EXPECT_EQ(*ParseTimestamp(json("2027-01-15T08:00:00Z")), kT0);
  EXPECT_FALSE(ParseTimestamp(json("yesterday")).has_value());
  EXPECT_FALSE(ParseTimestamp(json(5)).has_value());
}

TEST(StatusTest, SetConditionKeepsTransitionTimeUntilTheStatusChanges) {
  json status = json::object();
  SetCondition(&status, condition::kRunning, false, reason::kRunning, "x", kT0);
  EXPECT_EQ(FindCondition(status, condition::kRunning), nullptr);  // absent is already false
  SetCondition(&status, condition::kRunning, true, reason::kRunning, "running", kT0);
  ASSERT_TRUE(IsConditionTrue(status, condition::kRunning));
  SetCondition(&status, condition::kRunning, true, reason::kRunning, "still running",
               kT0 + absl::Seconds(5));
  const json* c = FindCondition(status, condition::kRunning);
  EXPECT_EQ((*c)["lastTransitionTime"], "2027-01-15T08:00:00Z");
  EXPECT_EQ((*c)["lastUpdateTime"], "2027-01-15T08:00:05Z");
  EXPECT_EQ((*c)["message"], "still running");
  SetCondition(&status, condition::kRunning, false, reason::kRestarting, "restarting",
               kT0 + absl::Seconds(9));
  c = FindCondition(status, condition::kRunning);
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], reason::kRestarting);
  EXPECT_EQ((*c)["lastTransitionTime"], "2027-01-15T08:00:09Z");
  EXPECT_EQ(status["conditions"].size(), 1u);
}

TEST(StatusTest, StateAndFinishedFollowTheConditions) {
  json status = json::object();
  EXPECT_EQ(StateOf(status), "Pending");
  SetCondition(&status, condition::kCreated, true, reason::kCreated, "", kT0);
  EXPECT_EQ(StateOf(status), "Created");
  SetCondition(&status, condition::kRunning, true, reason::kRunning, "", kT0);
  EXPECT_EQ(StateOf(status), "Running");
  SetCondition(&status, condition::kRestarting, true, reason::kRestarting, "", kT0);
  EXPECT_EQ(StateOf(status), "Restarting");
  EXPECT_FALSE(IsFinished(status));
  SetCondition(&status, condition::kFailed, true, reason::kBackoffLimitExceeded, "", kT0);
  EXPECT_EQ(StateOf(status), "Failed");
  EXPECT_TRUE(IsFinished(status));
  EXPECT_TRUE(IsFailed(status));
  EXPECT_FALSE(IsSucceeded(status));
  EXPECT_FALSE(IsConditionTrue(json("not an object"), condition::kFailed));
}

TEST(StatusTest, CheckpointFailingFollowsThePsTasksWrites) {
  json status = json::object();
  SetCondition(&status, condition::kRunning, true, reason::kRunning, "", kT0);
  // No write has failed: nothing is added.
  EXPECT_FALSE(SetCheckpointCondition(&status, 0, 0, "", kT0));
  EXPECT_EQ(FindCondition(status, condition::kCheckpointFailing), nullptr);
  // Failing now: True with the OS error, once an Event.
  const std::string msg = "1 checkpoint write failed, 1 PS task failing now; last: ps:0: ENOSPC";
  EXPECT_TRUE(SetCheckpointCondition(&status, 1, 1, msg, kT0));
  const json* c = FindCondition(status, condition::kCheckpointFailing);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], reason::kCheckpointWriteFailed);
  EXPECT_EQ((*c)["message"], msg);
  EXPECT_FALSE(SetCheckpointCondition(&status, 2, 1, msg, kT0 + absl::Seconds(2)));  // still
  // The state is not changed by it: training goes on.
  EXPECT_EQ(StateOf(status), "Running");
  // Written again: False, with what failed before.
  EXPECT_FALSE(SetCheckpointCondition(&status, 2, 0, "2 failed; the latest ones written",
                                      kT0 + absl::Seconds(5)));
  c = FindCondition(status, condition::kCheckpointFailing);
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], reason::kCheckpointsWritten);
  EXPECT_EQ((*c)["message"], "2 failed; the latest ones written");
  EXPECT_EQ((*c)["lastTransitionTime"], "2027-01-15T08:00:05Z");
  // A PS that restarted counts from 0 again: the condition stays, False.
  EXPECT_FALSE(SetCheckpointCondition(&status, 0, 0, "", kT0 + absl::Seconds(9)));
  c = FindCondition(status, condition::kCheckpointFailing);
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["message"], "checkpoints are written");
  // Failing again: a new Event.
  EXPECT_TRUE(SetCheckpointCondition(&status, 1, 1, msg, kT0 + absl::Seconds(12)));
}

}  // namespace
}  // namespace kubetrain
