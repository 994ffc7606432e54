// A TrainingJob's .status, typed: condition types and reasons as constants,
// and the helpers every part of Desired() reads and changes conditions with
// (after TFJob's JobStatus and its pkg/util/status.go helpers).
//
// Conditions (type: reason when it turns True):
//   Created     TrainingJobCreated
//   Running     TrainingJobRunning
//   Restarting  TrainingJobRestarting
//   Suspended   TrainingJobSuspended   (False again: TrainingJobResumed)
//   Succeeded   TrainingJobSucceeded
//   Failed      TrainingJobFailed | BackoffLimitExceeded | DeadlineExceeded | InvalidSpec
//               | CreateRejected | AuthSecretLost
//   CheckpointFailing  CheckpointWriteFailed (False again: CheckpointsWritten); not part of
//               the state: training goes on while checkpoints fail (SetCheckpointCondition)
//   PodGroupFailing  PodGroupAPIMissing | PodGroupRejected (False again: PodGroupCreated);
//               gang scheduling: the job's PodGroup cannot be created, so no pod is
//               created either (retried); not part of the state
//   ParametersHeld  FinalCheckpointFailed (False again: ParametersReleased); a job that
//               did not succeed: its PS tasks could not write their final checkpoint
//               and hold the parameters for `kubetrain export --from-ps`; the message
//               says how to save the model (desired_hold.cc); not part of the state
//   AuthSecretMissing  AuthSecretLost: the job's Secret {job}-auth was deleted (or its
//               job.key spoiled) while tasks that use it run; not part of the state (the
//               job fails, reason AuthSecretLost, once such a task must be started again)
// `.status.state` (the State printer column) is StateOf(status).
#ifndef KUBETRAIN_OPERATOR_STATUS_H_
#define KUBETRAIN_OPERATOR_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"

namespace kubetrain {

namespace condition {
inline constexpr char kCreated[] = "Created";
inline constexpr char kRunning[] = "Running";
inline constexpr char kRestarting[] = "Restarting";
inline constexpr char kSuspended[] = "Suspended";
inline constexpr char kSucceeded[] = "Succeeded";
inline constexpr char kFailed[] = "Failed";
inline constexpr char kCheckpointFailing[] = "CheckpointFailing";
inline constexpr char kPodGroupFailing[] = "PodGroupFailing";
inline constexpr char kParametersHeld[] = "ParametersHeld";
inline constexpr char kAuthSecretMissing[] = "AuthSecretMissing";
inline constexpr char kRunningWithoutCredentials[] = "RunningWithoutCredentials";
}  // namespace condition

namespace reason {
inline constexpr char kCreated[] = "TrainingJobCreated";
inline constexpr char kRunning[] = "TrainingJobRunning";
inline constexpr char kRestarting[] = "TrainingJobRestarting";
inline constexpr char kSuspended[] = "TrainingJobSuspended";
inline constexpr char kResumed[] = "TrainingJobResumed";
inline constexpr char kSucceeded[] = "TrainingJobSucceeded";
inline constexpr char kFailed[] = "TrainingJobFailed";  // a task failed for good
inline constexpr char kBackoffLimitExceeded[] = "BackoffLimitExceeded";
inline constexpr char kDeadlineExceeded[] = "DeadlineExceeded";
inline constexpr char kInvalidSpec[] = "InvalidSpec";
inline constexpr char kCreateRejected[] = "CreateRejected";  // the API server refused an object
inline constexpr char kCheckpointWriteFailed[] = "CheckpointWriteFailed";
inline constexpr char kCheckpointsWritten[] = "CheckpointsWritten";
inline constexpr char kPodGroupAPIMissing[] = "PodGroupAPIMissing";  // its CRD is not installed
inline constexpr char kPodGroupRejected[] = "PodGroupRejected";      // refused (RBAC, validation)
inline constexpr char kPodGroupCreated[] = "PodGroupCreated";
inline constexpr char kFinalCheckpointFailed[] = "FinalCheckpointFailed";  // PS tasks hold
inline constexpr char kParametersReleased[] = "ParametersReleased";        // they exited
inline constexpr char kAuthSecretLost[] = "AuthSecretLost";  // deleted while tasks used it
// Its pods were created by an operator that gave jobs no credentials.
inline constexpr char kStartedWithoutCredentials[] = "StartedWithoutCredentials";
inline constexpr char kCredentialsIssued[] = "CredentialsIssued";
}  // namespace reason

// metav1.Time: RFC 3339 in UTC, whole seconds ("2027-01-15T08:00:00Z").
std::string Timestamp(absl::Time t);
// nullopt if `v` is not such a string.
std::optional<absl::Time> ParseTimestamp(const nlohmann::json& v);

// The condition of `type` in status.conditions, or nullptr.
const nlohmann::json* FindCondition(const nlohmann::json& status, const std::string& type);
bool IsConditionTrue(const nlohmann::json& status, const std::string& type);

// Sets condition `type` to `value`: lastTransitionTime moves only when its
// status changes, lastUpdateTime when anything does. An absent condition
// set to False is not added (absent is already false).
void SetCondition(nlohmann::json* status, const std::string& type, bool value,
                  const std::string& reason, const std::string& message, absl::Time now);

// CheckpointFailing from the chief's figures of the PS tasks' checkpoint
// writes: True (CheckpointWriteFailed) while `failing` PS tasks' latest write
// failed, False (CheckpointsWritten) once they are written again; `message`
// says how many failed and the last OS error. Nothing is added while no write
// has failed (failures == 0 and no condition yet). Returns true when the
// condition has just turned True (for an Event).
bool SetCheckpointCondition(nlohmann::json* status, int64_t failures, int64_t failing,
                            const std::string& message, absl::Time now);

bool IsSucceeded(const nlohmann::json& status);
bool IsFailed(const nlohmann::json& status);
bool IsFinished(const nlohmann::json& status);  // Succeeded or Failed

// The job's state for `.status.state` and the printer column: the first true
// condition of Failed, Succeeded, Suspended, Restarting, Running, Created;
// "Pending" if none is.
std::string StateOf(const nlohmann::json& status);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_STATUS_H_
