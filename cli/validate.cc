#include "cli/validate.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/flags.h"
#include "core/job_spec.h"
#include "core/memory_budget.h"
#include "core/task_config.h"

namespace kubetrain {

absl::StatusOr<MemoryLimit> MemoryLimitFromFlag(const std::string& flag) {
  if (flag.empty()) return DetectMemoryLimit();
  auto bytes = ParseMemoryQuantity(flag);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--memory-limit: ", bytes.status().message()));
  }
  return MemoryLimit{*bytes, absl::StrCat("--memory-limit ", flag)};
}

int ValidateCommand(const std::string& file, const std::string& memory_limit, bool check_data,
                    std::FILE* out, std::FILE* err) {
  auto limit = MemoryLimitFromFlag(memory_limit);
  if (!limit.ok()) {
    std::fprintf(err, "error: %s\n", std::string(limit.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(file);
  if (!job.ok()) {  // the message already names the file
    std::fprintf(err, "error: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (!job->has_training) {  // the user's own containers: nothing of kubetrain's to size
    std::fprintf(out,
                 "%s: valid TrainingJob \"%s\": the replicas' own containers (no spec.training: "
                 "TF_CONFIG, Services and the lifecycle only), %d PS, %d workers\n",
                 file.c_str(), job->name.c_str(), job->num_ps(), job->num_workers());
    return 0;
  }
  // Each task on a node of its own (Kubernetes): each must fit the limit.
  if (absl::Status s = CheckModelFitsMemory(*job, *limit, /*tasks_share_limit=*/false); !s.ok()) {
    std::fprintf(err, "error: %s: %s\n", file.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  // The data as the tasks will read it (the first records of every file);
  // before the steps, which read the training set for epochs.
  if (check_data) {
    if (absl::Status s = CheckDatasetFiles(job->training); !s.ok()) {
      std::fprintf(err, "error: %s: %s\n", file.c_str(), std::string(s.message()).c_str());
      return 2;
    }
  }
  absl::StatusOr<int64_t> steps = JobTargetSteps(*job);
  if (!steps.ok()) {
    std::fprintf(err, "error: %s: %s\n", file.c_str(),
                 std::string(steps.status().message()).c_str());
    return 2;
  }
  std::fprintf(out,
               "%s: valid TrainingJob \"%s\": %s mode, %s model, %d PS, %d workers, %lld global "
               "steps\n",
               file.c_str(), job->name.c_str(), TrainingModeName(job->training.mode),
               job->training.model.type.c_str(), job->num_ps(), job->num_workers(),
               static_cast<long long>(*steps));
  if (check_data) {
    std::fprintf(out, "%s: data: the first %lld records of every training and test file parse\n",
                 file.c_str(), static_cast<long long>(kDataCheckRecords));
  } else {
    std::fprintf(out, "%s: data: not checked (--skip-data)\n", file.c_str());
  }
  return 0;
}

void AddMemoryLimitFlag(FlagParser& parser, std::string* memory_limit) {
  parser.String("memory_limit", memory_limit,
                "the memory each task may use (8Gi, 512Mi, ...; default: the cgroup's limit, "
                "else the machine's memory): a model that cannot fit is refused");
}

std::optional<int> ParseJobCommand(FlagParser& parser, int argc, char** argv, std::string* file) {
  std::vector<std::string> files;
  if (auto exit_code = parser.ParseMain(argc, argv, 2, &files)) return exit_code;
  if (files.size() != 1) {
    std::fprintf(stderr, "error: expected exactly one TrainingJob file\n\n%s",
                 parser.Usage().c_str());
    return 2;
  }
  *file = files[0];
  return std::nullopt;
}

int ValidateMain(int argc, char** argv) {
  FlagParser parser("kubetrain validate FILE.yaml");
  std::string memory_limit, file;
  AddMemoryLimitFlag(parser, &memory_limit);
  bool skip_data = false;
  parser.Bool("skip_data", &skip_data,
              "do not read the data files (they exist only where the tasks run, e.g. in the "
              "pods' image or volume); epochs still need the training set");
  if (auto exit_code = ParseJobCommand(parser, argc, argv, &file)) return *exit_code;
  return ValidateCommand(file, memory_limit, !skip_data);
}

}  // namespace kubetrain
