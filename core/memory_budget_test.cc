#include "core/memory_budget.h"

#include <sys/stat.h>

#include <string>

#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

TrainingJob Job(std::vector<int> hidden, const std::string& optimizer, int num_ps = 1) {
  TrainingJob job;
  job.name = "mem";
  job.replica_specs["PS"].replicas = num_ps;
  job.replica_specs["Worker"].replicas = 2;
  job.training.model.type = "mlp";
  job.training.model.hidden_units = std::move(hidden);
  job.training.optimizer.type = optimizer;
  job.training.steps = 10;
  return job;
}

constexpr int64_t kGi = int64_t{1} << 30;

TEST(MemoryBudgetTest, ParsesKubernetesQuantities) {
  EXPECT_EQ(*ParseMemoryQuantity("8Gi"), 8 * kGi);
  EXPECT_EQ(*ParseMemoryQuantity("512Mi"), 512 << 20);
  EXPECT_EQ(*ParseMemoryQuantity("2G"), 2000000000);
  EXPECT_EQ(*ParseMemoryQuantity("1500"), 1500);
  EXPECT_EQ(*ParseMemoryQuantity("1.5Gi"), 3 * kGi / 2);
  for (const char* bad : {"", "Gi", "-1Gi", "0", "eight", "8 GB", "1e9"}) {
    auto r = ParseMemoryQuantity(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_CONTAINS(std::string(r.status().message()), "not a memory size");
  }
}

TEST(MemoryBudgetTest, CountsParametersOptimizerSlotsAndBuffers) {
  // 784x64 + 64 + 64x10 + 10 = 50890 floats.
  const int64_t model = 50890 * 4;
  auto sgd = EstimateModelMemory(Job({64}, "sgd"));
  ASSERT_TRUE(sgd.ok());
  EXPECT_EQ(sgd->model_bytes, model);
  EXPECT_EQ(sgd->largest_shard_bytes, model);
  EXPECT_EQ(sgd->largest_ps_bytes, model * 3);  // values, accumulator, gradient buffer
  EXPECT_EQ(sgd->reader_bytes, model * 2);
  EXPECT_EQ(sgd->all_tasks_bytes, model * 3 + 2 * model * 2);
  auto adam = EstimateModelMemory(Job({64}, "adam"));
  EXPECT_EQ(adam->largest_ps_bytes, model * 5);  // + m and v
  TrainingJob checkpointed = Job({64}, "adam");
  checkpointed.training.checkpoint_dir = "/ckpt";
  EXPECT_EQ(EstimateModelMemory(checkpointed)->largest_ps_bytes, model * 8);  // + snapshot
}

TEST(MemoryBudgetTest, TheIssuesModelIsRefusedNamingTheModelAndTheLimit) {
  // hiddenUnits [65536, 65536]: ~17 GB of parameters.
  TrainingJob job = Job({65536, 65536}, "sgd");
  MemoryLimit machine{24 * kGi, "the machine's memory (/proc/meminfo MemTotal)"};
  absl::Status s = CheckModelFitsMemory(job, machine, false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(s.message());
  EXPECT_CONTAINS(msg, "spec.training.model: needs at least 48.6 GiB on ps:0");
  EXPECT_CONTAINS(msg, "16.2 GiB of parameters x 3: values, the sync");
  EXPECT_CONTAINS(msg, "more than the 24.0 GiB of the machine's memory");
  // Spread over 8 PS tasks each shard fits, but each worker still holds it all.
  job.replica_specs["PS"].replicas = 8;
  s = CheckModelFitsMemory(job, machine, false);
  EXPECT_CONTAINS(std::string(s.message()), "32.4 GiB on each worker (16.2 GiB of parameters x 2");
  MemoryLimit flag{64 * kGi, "--memory-limit 64Gi"};
  EXPECT_TRUE(CheckModelFitsMemory(job, flag, false).ok());
  // Locally all 10 tasks share the machine.
  s = CheckModelFitsMemory(job, flag, true);
  EXPECT_CONTAINS(std::string(s.message()), "on this machine, for all 10 tasks together");
  EXPECT_CONTAINS(std::string(s.message()), "--memory-limit 64Gi");
}

TEST(MemoryBudgetTest, SmallModelsAndUnknownLimitsPass) {
  EXPECT_TRUE(CheckModelFitsMemory(Job({64}, "adam"), {kGi, "x"}, true).ok());
  EXPECT_TRUE(CheckModelFitsMemory(Job({65536, 65536}, "adam"), {0, ""}, true).ok());
}

TEST(MemoryBudgetTest, OneTaskIsCheckedForItsOwnShare) {
  TrainingJob job = Job({65536, 65536}, "sgd", 8);
  job.training.split_threshold_bytes = 4 << 20;
  MemoryLimit limit{8 * kGi, "the cgroup memory limit (memory.max)"};
  // A shard is ~2 GiB x 3 copies: fits; a worker needs ~32 GiB: does not.
  EXPECT_TRUE(CheckTaskFitsMemory(job, "ps", 3, limit).ok());
  absl::Status s = CheckTaskFitsMemory(job, "worker", 1, limit);
  EXPECT_CONTAINS(std::string(s.message()), "on worker:1");
  EXPECT_CONTAINS(std::string(s.message()), "the cgroup memory limit (memory.max)");
}

TEST(MemoryBudgetTest, DetectsCgroupLimitsBelowTheMachine) {
  const std::string root = NewTestDir("mem");
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/proc").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/sys").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/sys/fs").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/sys/fs/cgroup").c_str(), 0755), 0);
  WriteFile(root + "/proc/meminfo", "MemTotal:       1048576 kB\nMemFree: 1 kB\n");
  MemoryLimit m = DetectMemoryLimit(root);
  EXPECT_EQ(m.bytes, kGi);
  EXPECT_CONTAINS(m.source, "the machine's memory");
  WriteFile(root + "/sys/fs/cgroup/memory.max", "max\n");
  EXPECT_EQ(DetectMemoryLimit(root).bytes, kGi);
  WriteFile(root + "/sys/fs/cgroup/memory.max", "268435456\n");
  m = DetectMemoryLimit(root);
  EXPECT_EQ(m.bytes, 256 << 20);
  EXPECT_EQ(m.source, "the cgroup memory limit (memory.max)");
}

TEST(MemoryBudgetTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(24 * kGi), "24.0 GiB");
}

}  // namespace
}  // namespace kubetrain
