// Test-only: the TaskConfig of one task of a TrainingJob given as YAML text,
// as LoadTaskConfig builds it from the job file and TF_CONFIG.
#ifndef KUBETRAIN_CORE_TESTING_TASK_CONFIG_FOR_H_
#define KUBETRAIN_CORE_TESTING_TASK_CONFIG_FOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/task_config.h"

namespace kubetrain {

// The config of task `type`:`index` ("ps", "worker", "chief", "evaluator")
// of the job in `yaml`, which is written to a new test directory. TF_CONFIG
// lists every replica of the job at made-up loopback addresses.
absl::StatusOr<TaskConfig> TaskConfigFor(const std::string& yaml, const std::string& type,
                                         int index);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_TESTING_TASK_CONFIG_FOR_H_
