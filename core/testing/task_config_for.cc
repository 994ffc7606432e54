#include "core/testing/task_config_for.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "core/testing/temp_files.h"

namespace kubetrain {

absl::StatusOr<TaskConfig> TaskConfigFor(const std::string& yaml, const std::string& type,
                                         int index) {
  auto job = ParseTrainingJob(yaml);
  if (!job.ok()) return job.status();
  const std::string dir = NewTestDir("job");
  if (mkdir(dir.c_str(), 0755) != 0) return absl::InternalError("cannot create " + dir);
  const std::string path = dir + "/job.yaml";
  WriteFile(path, yaml);
  int port = 20000;
  std::string cluster;
  for (const auto& [key, lower] : {std::pair<const char*, const char*>{"PS", "ps"},
                                   {"Worker", "worker"},
                                   {"Chief", "chief"},
                                   {"Evaluator", "evaluator"}}) {
    auto it = job->replica_specs.find(key);
    if (it == job->replica_specs.end()) continue;
    std::string hosts;
    for (int i = 0; i < it->second.replicas; ++i) {
      absl::StrAppend(&hosts, hosts.empty() ? "" : ",", "\"127.0.0.1:", port++, "\"");
    }
    absl::StrAppend(&cluster, cluster.empty() ? "" : ",", "\"", lower, "\":[", hosts, "]");
  }
  return LoadTaskConfig(path, absl::StrCat(R"({"cluster":{)", cluster, R"(},"task":{"type":")",
                                           type, R"(","index":)", index, "}}"));
}

}  // namespace kubetrain
