// Who may call what on a PS that checks its callers (one with the job key;
// core/job_credentials.h defines the metadata and the tokens). Pure
// functions: the gRPC service (ps/service.cc) applies them to every call
// before it reads the request's payload; the in-process channel has no
// callers to check.
//
//   GetInfo, Pull, SparsePull, ListRows,  any task of the job
//   GetStats
//   Push                                  a worker
//   Leave                                 a worker, the chief, an evaluator
//   Shutdown                              the job's chief only (ChiefTask)
//
// The exporter only reads. Every request names its task (task_type and
// worker_index; a push in its header): that must be the caller itself.
//
// Errors: UNAUTHENTICATED when the metadata is missing or malformed or the
// token is not the named task's token of this job; PERMISSION_DENIED when
// the caller may not call the method or the request names another task.
// Messages name the method and say how to fix it.
#ifndef KUBETRAIN_PS_RPC_AUTH_H_
#define KUBETRAIN_PS_RPC_AUTH_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/shard.h"

namespace kubetrain {

enum class PsMethod {
  kGetInfo,
  kPull,
  kSparsePull,
  kListRows,
  kGetStats,
  kPush,
  kLeave,
  kShutdown
};
const char* PsMethodName(PsMethod method);

// The task `x_kubetrain_task` names, if `authorization` ("Bearer <token>")
// carries that task's token under `job_key`. An absent value is nullopt.
absl::StatusOr<TaskId> AuthenticateCaller(PsMethod method, absl::string_view job_key,
                                          std::optional<absl::string_view> x_kubetrain_task,
                                          std::optional<absl::string_view> authorization);

// Whether `caller` may call `method`; `named` is the task the request names
// and `chief` the task that does the job's chief duties (ChiefTask).
absl::Status AuthorizeCall(PsMethod method, const TaskId& caller, const TaskId& named,
                           const TaskId& chief);

// The metadata spelling of a task: "worker/0", "chief/0", ...
std::string TaskMetadataName(const TaskId& task);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_RPC_AUTH_H_
