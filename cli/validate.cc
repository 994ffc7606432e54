#include "cli/validate.h"

#include <string>

#include "core/job_spec.h"
#include "core/task_config.h"

namespace kubetrain {

int ValidateCommand(const std::string& file, std::FILE* out, std::FILE* err) {
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(file);
  if (!job.ok()) {  // the message already names the file
    std::fprintf(err, "error: %s\n", std::string(job.status().message()).c_str());
    return 2;
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
  return 0;
}

}  // namespace kubetrain
