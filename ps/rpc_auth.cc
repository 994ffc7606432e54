#include "ps/rpc_auth.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/job_credentials.h"

namespace kubetrain {
namespace {

constexpr char kHowToFix[] =
    "give the task this job's auth directory (KUBETRAIN_AUTH_DIR or --auth_dir; on Kubernetes the "
    "job's Secret)";

std::optional<TaskRole> RoleOfType(absl::string_view type) {
  for (TaskRole role :
       {TaskRole::kWorker, TaskRole::kChief, TaskRole::kEvaluator, TaskRole::kExporter}) {
    if (type == TaskTypeName(role)) return role;
  }
  return std::nullopt;
}

// A value from the wire as a message shows it: escaped, at most 64 bytes.
std::string Quoted(absl::string_view value) {
  constexpr size_t kShown = 64;
  return absl::StrCat("\"", absl::CHexEscape(value.substr(0, kShown)),
                      value.size() > kShown ? "...\"" : "\"");
}

bool SameTask(const TaskId& a, const TaskId& b) { return a.role == b.role && a.index == b.index; }

}  // namespace

const char* PsMethodName(PsMethod method) {
  switch (method) {
    case PsMethod::kGetInfo:
      return "GetInfo";
    case PsMethod::kPull:
      return "Pull";
    case PsMethod::kSparsePull:
      return "SparsePull";
    case PsMethod::kListRows:
      return "ListRows";
    case PsMethod::kGetStats:
      return "GetStats";
    case PsMethod::kPush:
      return "Push";
    case PsMethod::kLeave:
      return "Leave";
    case PsMethod::kShutdown:
      return "Shutdown";
  }
  return "?";
}

std::string TaskMetadataName(const TaskId& task) {
  return TaskMetadataValue(TaskTypeName(task.role), task.index);
}

absl::StatusOr<TaskId> AuthenticateCaller(PsMethod method, absl::string_view job_key,
                                          std::optional<absl::string_view> x_kubetrain_task,
                                          std::optional<absl::string_view> authorization) {
  const char* name = PsMethodName(method);
  if (!x_kubetrain_task || !authorization) {
    return absl::UnauthenticatedError(
        absl::StrCat(name, ": no credentials (", !x_kubetrain_task ? kTaskMetadataKey : "",
                     !x_kubetrain_task && !authorization ? " and " : "",
                     !authorization ? kAuthorizationMetadataKey : "",
                     " metadata missing): this PS admits only the tasks of its job; ", kHowToFix));
  }
  const size_t slash = x_kubetrain_task->find('/');
  std::optional<TaskRole> role;
  int index = -1;
  if (slash != absl::string_view::npos) {
    role = RoleOfType(x_kubetrain_task->substr(0, slash));
    if (!absl::SimpleAtoi(x_kubetrain_task->substr(slash + 1), &index)) index = -1;
  }
  // Only the canonical spelling ("worker/7", not "worker/+07").
  if (!role || index < 0 || TaskMetadataName({*role, index}) != *x_kubetrain_task) {
    return absl::UnauthenticatedError(
        absl::StrCat(name, ": ", kTaskMetadataKey, " ", Quoted(*x_kubetrain_task),
                     " is not <type>/<index> with type worker, chief, evaluator or exporter"));
  }
  const TaskId task{*role, index};
  absl::string_view token = *authorization;
  if (!absl::ConsumePrefix(&token, kBearerPrefix)) {
    return absl::UnauthenticatedError(absl::StrCat(name, ": ", kAuthorizationMetadataKey,
                                                   " is not \"", kBearerPrefix, "<token>\""));
  }
  if (!TokensEqual(token, TaskToken(job_key, TaskTypeName(task.role), task.index))) {
    return absl::UnauthenticatedError(absl::StrCat(
        name, ": the token presented as ", TaskMetadataName(task),
        " is not that task's token in this job (another job's credentials, or another task's); ",
        kHowToFix));
  }
  return task;
}

absl::Status AuthorizeCall(PsMethod method, const TaskId& caller, const TaskId& named,
                           const TaskId& chief) {
  const char* name = PsMethodName(method);
  bool allowed = true;
  std::string rule;
  switch (method) {
    case PsMethod::kGetInfo:
    case PsMethod::kPull:
    case PsMethod::kSparsePull:
    case PsMethod::kListRows:
    case PsMethod::kGetStats:
      break;
    case PsMethod::kPush:
      allowed = caller.role == TaskRole::kWorker;
      rule = "only workers push";
      break;
    case PsMethod::kLeave:
      allowed = caller.role != TaskRole::kExporter;
      rule = "the exporter only reads";
      break;
    case PsMethod::kShutdown:
      allowed = SameTask(caller, chief);
      rule = absl::StrCat("only the job's chief, ", TaskMetadataName(chief), ", ends the job");
      break;
  }
  if (!allowed) {
    return absl::PermissionDeniedError(
        absl::StrCat(name, ": ", TaskMetadataName(caller), " may not call it (", rule, ")"));
  }
  if (!SameTask(caller, named)) {
    return absl::PermissionDeniedError(
        absl::StrCat(name, ": the caller is ", TaskMetadataName(caller), " but the request names ",
                     TaskMetadataName(named), " (a task acts only as itself)"));
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
