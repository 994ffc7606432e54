#include "ps/rpc_auth.h"

#include <string>
#include <vector>

#include "core/job_credentials.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr char kOtherKey[] = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

std::string Bearer(absl::string_view key, absl::string_view type, int index) {
  return std::string(kBearerPrefix) + TaskToken(key, type, index);
}

TEST(AuthenticateCallerTest, TheNamedTasksTokenOfThisJobIsAccepted) {
  for (const auto& [type, role, index] :
       std::vector<std::tuple<const char*, TaskRole, int>>{{"worker", TaskRole::kWorker, 0},
                                                           {"worker", TaskRole::kWorker, 12},
                                                           {"chief", TaskRole::kChief, 0},
                                                           {"evaluator", TaskRole::kEvaluator, 0},
                                                           {"exporter", TaskRole::kExporter, 0}}) {
    const std::string task = TaskMetadataValue(type, index);
    absl::StatusOr<TaskId> caller =
        AuthenticateCaller(PsMethod::kPull, kKey, task, Bearer(kKey, type, index));
    ASSERT_TRUE(caller.ok()) << task << ": " << caller.status();
    EXPECT_EQ(caller->role, role) << task;
    EXPECT_EQ(caller->index, index) << task;
  }
}

struct Refusal {
  std::optional<std::string> task;
  std::optional<std::string> authorization;
  std::string message;
};

TEST(AuthenticateCallerTest, RefusalsAreUnauthenticatedWithAReason) {
  const std::string fix =
      "give the task this job's auth directory (KUBETRAIN_AUTH_DIR or --auth_dir; on Kubernetes "
      "the job's Secret)";
  const std::vector<Refusal> cases = {
      {std::nullopt, std::nullopt,
       "Pull: no credentials (x-kubetrain-task and authorization metadata missing): this PS admits "
       "only the tasks of its job; " +
           fix},
      {std::nullopt, Bearer(kKey, "worker", 0),
       "Pull: no credentials (x-kubetrain-task metadata missing): this PS admits only the tasks of "
       "its job; " +
           fix},
      {"worker/0", std::nullopt,
       "Pull: no credentials (authorization metadata missing): this PS admits only the tasks of "
       "its job; " +
           fix},
      // Another job's token for the same task.
      {"worker/0", Bearer(kOtherKey, "worker", 0),
       "Pull: the token presented as worker/0 is not that task's token in this job (another job's "
       "credentials, or another task's); " +
           fix},
      // Worker 1's own token, claiming to be worker 0.
      {"worker/0", Bearer(kKey, "worker", 1),
       "Pull: the token presented as worker/0 is not that task's token in this job (another job's "
       "credentials, or another task's); " +
           fix},
      {"chief/0", Bearer(kKey, "worker", 0),
       "Pull: the token presented as chief/0 is not that task's token in this job (another job's "
       "credentials, or another task's); " +
           fix},
      {"worker/0", TaskToken(kKey, "worker", 0), "Pull: authorization is not \"Bearer <token>\""},
      {"worker/0", "Bearer ",
       "Pull: the token presented as worker/0 is not that task's token in "
       "this job (another job's credentials, or another task's); " +
           fix},
      {"ps/0", Bearer(kKey, "ps", 0),
       "Pull: x-kubetrain-task \"ps/0\" is not <type>/<index> with type worker, chief, evaluator "
       "or exporter"},
      {"worker", Bearer(kKey, "worker", 0),
       "Pull: x-kubetrain-task \"worker\" is not <type>/<index> with type worker, chief, "
       "evaluator or exporter"},
      {"worker/-1", Bearer(kKey, "worker", -1),
       "Pull: x-kubetrain-task \"worker/-1\" is not <type>/<index> with type worker, chief, "
       "evaluator or exporter"},
      {"worker/+1", Bearer(kKey, "worker", 1),
       "Pull: x-kubetrain-task \"worker/+1\" is not <type>/<index> with type worker, chief, "
       "evaluator or exporter"},
      {"worker/99999999999", Bearer(kKey, "worker", 0),
       "Pull: x-kubetrain-task \"worker/99999999999\" is not <type>/<index> with type worker, "
       "chief, evaluator or exporter"},
      {std::string("worker/0\n", 9), Bearer(kKey, "worker", 0),
       "Pull: x-kubetrain-task \"worker/0\\n\" is not <type>/<index> with type worker, chief, "
       "evaluator or exporter"},
  };
  for (const Refusal& c : cases) {
    absl::StatusOr<TaskId> caller = AuthenticateCaller(
        PsMethod::kPull, kKey, c.task ? std::optional<absl::string_view>(*c.task) : std::nullopt,
        c.authorization ? std::optional<absl::string_view>(*c.authorization) : std::nullopt);
    ASSERT_FALSE(caller.ok()) << c.message;
    EXPECT_EQ(caller.status().code(), absl::StatusCode::kUnauthenticated) << c.message;
    EXPECT_EQ(caller.status().message(), c.message);
  }
}

struct Call {
  PsMethod method;
  TaskId caller;
  TaskId named;
  bool has_chief_task;
  // "" = allowed, else the PERMISSION_DENIED message.
  std::string refusal;
};

TEST(AuthorizeCallTest, Table) {
  const TaskId w0{TaskRole::kWorker, 0};
  const TaskId w1{TaskRole::kWorker, 1};
  const TaskId chief{TaskRole::kChief, 0};
  const TaskId evaluator{TaskRole::kEvaluator, 0};
  const TaskId exporter{TaskRole::kExporter, 0};
  const std::vector<Call> table = {
      // Readers: any task of the job, as itself.
      {PsMethod::kGetInfo, w1, w1, false, ""},
      {PsMethod::kPull, chief, chief, true, ""},
      {PsMethod::kSparsePull, evaluator, evaluator, false, ""},
      {PsMethod::kPull, exporter, exporter, false, ""},
      {PsMethod::kGetStats, exporter, exporter, true, ""},
      {PsMethod::kListRows, exporter, exporter, false, ""},
      {PsMethod::kListRows, w0, w0, false, ""},
      {PsMethod::kListRows, exporter, chief, true,
       "ListRows: the caller is exporter/0 but the request names chief/0 (a task acts only as "
       "itself)"},
      {PsMethod::kGetInfo, w1, w0, false,
       "GetInfo: the caller is worker/1 but the request names worker/0 (a task acts only as "
       "itself)"},
      {PsMethod::kPull, evaluator, w0, false,
       "Pull: the caller is evaluator/0 but the request names worker/0 (a task acts only as "
       "itself)"},
      // Pushes: a worker as itself.
      {PsMethod::kPush, w1, w1, false, ""},
      {PsMethod::kPush, w1, w0, false,
       "Push: the caller is worker/1 but the request names worker/0 (a task acts only as itself)"},
      {PsMethod::kPush, chief, chief, true, "Push: chief/0 may not call it (only workers push)"},
      {PsMethod::kPush, evaluator, evaluator, false,
       "Push: evaluator/0 may not call it (only workers push)"},
      {PsMethod::kPush, exporter, exporter, false,
       "Push: exporter/0 may not call it (only workers push)"},
      // Leave: as itself; not the exporter.
      {PsMethod::kLeave, w1, w1, false, ""},
      {PsMethod::kLeave, chief, chief, true, ""},
      {PsMethod::kLeave, evaluator, evaluator, true, ""},
      {PsMethod::kLeave, w0, w1, false,
       "Leave: the caller is worker/0 but the request names worker/1 (a task acts only as itself)"},
      {PsMethod::kLeave, exporter, exporter, false,
       "Leave: exporter/0 may not call it (the exporter only reads)"},
      // Shutdown: the chief's task only.
      {PsMethod::kShutdown, w0, w0, false, ""},
      {PsMethod::kShutdown, chief, chief, true, ""},
      {PsMethod::kShutdown, w0, w0, true,
       "Shutdown: worker/0 may not call it (only the job's chief, chief/0, ends the job)"},
      {PsMethod::kShutdown, w1, w1, false,
       "Shutdown: worker/1 may not call it (only the job's chief, worker/0, ends the job)"},
      {PsMethod::kShutdown, w1, w0, false,
       "Shutdown: worker/1 may not call it (only the job's chief, worker/0, ends the job)"},
      {PsMethod::kShutdown, evaluator, evaluator, true,
       "Shutdown: evaluator/0 may not call it (only the job's chief, chief/0, ends the job)"},
      {PsMethod::kShutdown, exporter, exporter, false,
       "Shutdown: exporter/0 may not call it (only the job's chief, worker/0, ends the job)"},
  };
  for (const Call& c : table) {
    ShardOptions options;
    options.has_chief_task = c.has_chief_task;
    const std::string what = std::string(PsMethodName(c.method)) + " by " +
                             TaskMetadataName(c.caller) + " naming " + TaskMetadataName(c.named);
    absl::Status s = AuthorizeCall(c.method, c.caller, c.named, ChiefTask(options));
    if (c.refusal.empty()) {
      EXPECT_TRUE(s.ok()) << what << ": " << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << what;
      EXPECT_EQ(s.message(), c.refusal) << what;
    }
  }
}

}  // namespace
}  // namespace kubetrain
