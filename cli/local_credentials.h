// The credentials `kubetrain run` gives a job's tasks (core/job_credentials.h):
// generated once per run -- the job key always, the CA and task certificate
// with TLS -- and written to one private directory per task (0700, files
// 0600) under a fresh directory of its own, which the object removes when
// destroyed. Each task finds its directory in KUBETRAIN_AUTH_DIR.
//
//   <root>/<task name>/   ("ps-0", "worker-1", ...) CredentialsForTask: PS
//                         tasks the job key, the others their token; the TLS
//                         files with TLS
//   <root>/export/        the job key (and TLS files) for `kubetrain export
//                         --from-ps --auth-dir`, while the run lasts
//
// Not thread-safe; the directories are written by Create only.
#ifndef KUBETRAIN_CLI_LOCAL_CREDENTIALS_H_
#define KUBETRAIN_CLI_LOCAL_CREDENTIALS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster_spec.h"
#include "core/job_spec.h"

namespace kubetrain {

class LocalCredentials {
 public:
  // Generates `job`'s credentials and writes every task's directory under a
  // new directory in the first of `parents` where one can be made (a
  // container's root may be read-only). Errors name the paths.
  static absl::StatusOr<std::unique_ptr<LocalCredentials>> Create(
      const TrainingJob& job, bool tls, const std::vector<std::string>& parents);
  ~LocalCredentials();  // removes root() and everything in it
  LocalCredentials(const LocalCredentials&) = delete;
  LocalCredentials& operator=(const LocalCredentials&) = delete;

  const std::string& root() const { return root_; }
  // Task name ("worker-1") -> its directory, for every task of the job.
  const std::map<std::string, std::string>& task_dirs() const { return task_dirs_; }
  // The directory `kubetrain export --from-ps --auth-dir` takes.
  std::string export_dir() const { return root_ + "/export"; }
  bool tls() const { return tls_; }

 private:
  LocalCredentials(std::string root, bool tls) : root_(std::move(root)), tls_(tls) {}

  const std::string root_;
  const bool tls_;
  std::map<std::string, std::string> task_dirs_;  // set by Create
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_LOCAL_CREDENTIALS_H_
