// LoadTaskConfig: TF_CONFIG must agree with the job on its tasks.
#include "core/task_config.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "core/testing/temp_files.h"

namespace kubetrain {
namespace {

constexpr char kJob[] = R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: tc}
spec:
  replicaSpecs:
    PS: {replicas: 1}
    Worker: {replicas: 2}
CHIEF  training:
    model: {type: softmax}
    steps: 10
)";

absl::StatusOr<TaskConfig> Load(bool job_has_chief, const std::string& tf_config) {
  const std::string dir = NewTestDir("taskconfig");
  mkdir(dir.c_str(), 0755);
  std::string yaml = kJob;
  yaml.replace(yaml.find("CHIEF"), 5, job_has_chief ? "    Chief: {replicas: 1}\n" : "");
  WriteFile(dir + "/job.yaml", yaml);
  return LoadTaskConfig(dir + "/job.yaml", tf_config);
}

constexpr char kWithChief[] =
    R"({"cluster":{"ps":["h:1"],"worker":["h:2","h:3"],"chief":["h:4"]},"task":{"type":"chief","index":0}})";
constexpr char kWithoutChief[] =
    R"({"cluster":{"ps":["h:1"],"worker":["h:2","h:3"]},"task":{"type":"worker","index":1}})";

TEST(TaskConfigTest, TheChiefTaskMustMatchTheJobsChiefReplica) {
  auto ok = Load(true, kWithChief);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->num_workers, 2);  // the chief is not a worker
  EXPECT_TRUE(ok->job.IsChiefTask(ok->tf.task_type, ok->tf.task_index));
  ASSERT_TRUE(Load(false, kWithoutChief).ok());

  auto missing = Load(true, kWithoutChief);
  ASSERT_FALSE(missing.ok());
  EXPECT_CONTAINS(std::string(missing.status().message()), "TF_CONFIG has 0 chief tasks, but ");
  EXPECT_CONTAINS(std::string(missing.status().message()), "has a Chief replica");
  auto extra = Load(false, kWithChief);
  ASSERT_FALSE(extra.ok());
  EXPECT_CONTAINS(std::string(extra.status().message()), "has no Chief replica");
}

}  // namespace
}  // namespace kubetrain
