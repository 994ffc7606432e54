#include "cli/local_credentials.h"

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/job_credentials.h"

namespace kubetrain {
namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;  // go on: remove what can be removed
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCredentials>> LocalCredentials::Create(
    const TrainingJob& job, bool tls, const std::vector<std::string>& parents) {
  absl::StatusOr<JobCredentials> creds = GenerateJobCredentials(job.name, tls);
  if (!creds.ok()) return creds.status();
  std::string root;
  std::string errors;
  for (const std::string& parent : parents) {
    std::string pattern = absl::StrCat(parent, "/kubetrain-", job.name, "-auth-XXXXXX");
    if (::mkdtemp(pattern.data()) != nullptr) {  // 0700
      root = pattern;
      break;
    }
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", parent, ": ", std::strerror(errno));
  }
  if (root.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a directory for the job's credentials (", errors, ")"));
  }
  std::unique_ptr<LocalCredentials> local(new LocalCredentials(root, tls));
  for (const JobTask& task : JobTasks(job)) {
    const std::string dir = absl::StrCat(local->root_, "/", task.name());
    if (absl::Status s =
            WriteTaskCredentials(dir, CredentialsForTask(*creds, task.type, task.index));
        !s.ok()) {
      return s;
    }
    local->task_dirs_[task.name()] = dir;
  }
  // Whoever may act as any task: the job key, as a PS task has it.
  if (absl::Status s =
          WriteTaskCredentials(local->export_dir(), CredentialsForTask(*creds, "ps", 0));
      !s.ok()) {
    return s;
  }
  return local;
}

LocalCredentials::~LocalCredentials() {
  ::nftw(root_.c_str(), RemoveEntry, 8, FTW_DEPTH | FTW_PHYS);
}

}  // namespace kubetrain
