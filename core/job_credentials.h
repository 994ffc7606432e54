// What a job's tasks use to prove they belong to that job and which task they
// are: one secret key per job, a token per task derived from it, and (when TLS
// is on) the job's own CA and one certificate for its tasks. The operator puts
// them into a per-job Secret; `kubetrain run` writes them into a private
// directory per task. The PS checks every RPC (ps/service.cc); the worker side
// attaches them (worker/grpc_shard_channel.cc). docs/trainingjob.md,
// "Authentication and TLS".
//
// Contract (shared by the runtime, `kubetrain run` and the operator):
// - A task finds its credentials in one directory: the `--auth_dir` flag, else
//   the environment variable KUBETRAIN_AUTH_DIR. Files, each optional:
//     job.key  the job's secret (64 lowercase hex chars): only PS tasks (which
//              verify tokens) and whoever may act as any task (the launcher,
//              `kubetrain export`) hold it;
//     token    this task's token, TaskToken(job key, its type, its index);
//     ca.crt, tls.crt, tls.key   the job's CA, its task certificate and key
//              (PEM); ca.crt present = TLS on, both as server and as client.
// - Every PS RPC carries the metadata `x-kubetrain-task: <type>/<index>` (TF_CONFIG's
//   task type spelling: worker, chief, evaluator, exporter) and
//   `authorization: Bearer <token>`. A PS with a job key answers
//   UNAUTHENTICATED when either is missing or the token is not that task's
//   (constant-time compare), and PERMISSION_DENIED when a request's own
//   task_type/worker_index is not the caller's, or a task other than the
//   job's chief asks for Shutdown.
// - A PS task without a job key would serve any client that reaches its
//   port (push, pull, Shutdown): it refuses to start so unless told to run
//   open, by --insecure or KUBETRAIN_INSECURE=1 (kInsecureEnv; the operator's
//   way, which a runtime older than the operator ignores). Workers need no
//   such flag: they serve no RPC, and one without credentials gets through
//   only to a PS that was itself started open.
// - TLS is mutual: the PS requires a client certificate signed by the job's
//   CA; clients verify the PS's certificate against the same CA under the
//   name kTaskTlsName (not the address, so one certificate serves every task
//   wherever it runs).
#ifndef KUBETRAIN_CORE_JOB_CREDENTIALS_H_
#define KUBETRAIN_CORE_JOB_CREDENTIALS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kubetrain {

inline constexpr char kAuthDirEnv[] = "KUBETRAIN_AUTH_DIR";
// "1" or "true": a PS task without credentials runs open (kubetrain-ps --insecure).
inline constexpr char kInsecureEnv[] = "KUBETRAIN_INSECURE";
inline constexpr char kJobKeyFile[] = "job.key";
inline constexpr char kTokenFile[] = "token";
inline constexpr char kCaCertFile[] = "ca.crt";
inline constexpr char kCertFile[] = "tls.crt";
inline constexpr char kKeyFile[] = "tls.key";
inline constexpr char kTaskMetadataKey[] = "x-kubetrain-task";
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
inline constexpr char kTaskTlsName[] = "kubetrain-task";

// How long the generated certificates are valid: from one hour before they
// are made (clocks of other nodes may lag) for kCertificateValidityDays. The
// CA's key is gone once they are signed, so they can never be renewed; a job
// that outlives them would be refused by its own tasks.
inline constexpr int kCertificateValidityDays = 3650;

// A job's credentials as generated once per job.
struct JobCredentials {
  std::string job_key;      // 64 lowercase hex chars (32 random bytes)
  std::string ca_cert_pem;  // empty without TLS; the CA's private key is discarded after signing
  std::string cert_pem;     // server and client auth, SAN DNS:kTaskTlsName
  std::string key_pem;      // the task certificate's key (EC P-256, PKCS#8)
};

// A fresh job key and, with `with_tls`, a CA (EC P-256) named "kubetrain job
// <job_name> CA" (the name cut so that the CN stays within its 64
// characters) and a task certificate signed by it.
absl::StatusOr<JobCredentials> GenerateJobCredentials(absl::string_view job_name, bool with_tls);

// Lowercase hex HMAC-SHA256(job_key, "kubetrain/v1/<task_type>/<index>"). The
// HMAC key is the job key's 64 characters as stored, so a shell computes the
// same value with
//   printf %s kubetrain/v1/worker/0 | openssl dgst -sha256 -hmac "$(cat job.key)"
std::string TaskToken(absl::string_view job_key, absl::string_view task_type, int index);

// Constant-time equality (the time depends only on the lengths).
bool TokensEqual(absl::string_view a, absl::string_view b);

// The kTaskMetadataKey value of a task: "<task_type>/<index>".
std::string TaskMetadataValue(absl::string_view task_type, int index);

// What one task read from its directory; empty strings for absent files.
struct TaskCredentials {
  std::string job_key;
  std::string token;
  std::string ca_cert_pem;
  std::string cert_pem;
  std::string key_pem;
  bool tls() const { return !ca_cert_pem.empty(); }
};

// The files task `task_type`/`index` gets (what the operator mounts from the
// job's Secret and `kubetrain run` writes): a PS task the job key (it checks
// tokens), any other task its own token; every task the TLS files when the
// job has them.
TaskCredentials CredentialsForTask(const JobCredentials& job, absl::string_view task_type,
                                   int index);

// Reads `dir`. Whitespace around job.key and token is ignored (a Secret
// written by hand often ends in a newline). Errors name the file: `dir` is
// missing or not a directory, a file cannot be read, job.key or token is not
// 64 lowercase hex characters, only some of the three TLS files are there, a
// PEM file does not parse, tls.key does not belong to tls.crt, or tls.crt is
// not valid under ca.crt (another job's CA, expired).
absl::StatusOr<TaskCredentials> ReadTaskCredentials(const std::string& dir);

// What a task that calls PS tasks presents to them.
struct CallerCredentials {
  std::string task;         // the kTaskMetadataKey value
  std::string token;        // sent as "authorization: Bearer <token>"
  std::string ca_cert_pem;  // TLS when set, with the next two
  std::string cert_pem;
  std::string key_pem;
  bool tls() const { return !ca_cert_pem.empty(); }
};

// The credentials of task `task_type`/`index` from `dir` (ReadTaskCredentials):
// a token derived from job.key if the directory has it (whoever may act as
// any task: the exporter), else its `token`; and the TLS files. An error
// names `dir` if it holds neither file.
absl::StatusOr<CallerCredentials> ReadCallerCredentials(const std::string& dir,
                                                        absl::string_view task_type, int index);

// Writes the files of `creds` that are non-empty into `dir` (created 0700,
// files 0600), for `kubetrain run` and tests.
absl::Status WriteTaskCredentials(const std::string& dir, const TaskCredentials& creds);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_JOB_CREDENTIALS_H_
