#include "core/memory_budget.h"

#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/model.h"
#include "core/placement.h"

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
  EXPECT_EQ(sgd->largest_ps_memory.dense_bytes, model);
  EXPECT_EQ(sgd->largest_ps_bytes, model * 3);  // values, accumulator, gradient buffer
  // + one step's activations: the 64 and 10 outputs of batchSize 100 examples.
  const int64_t activations = (64 + 10) * 100 * 4;
  EXPECT_EQ(sgd->activation_bytes, activations);
  EXPECT_EQ(sgd->largest_layer, -1);  // shorthands name no layer
  EXPECT_EQ(sgd->reader_bytes, model * 2 + activations);
  EXPECT_EQ(sgd->all_tasks_bytes, model * 3 + 2 * (model * 2 + activations));
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

// The fashion-mnist-cnn example's layers.
TrainingJob Cnn(int batch_size) {
  TrainingJob job = Job({}, "adam", 2);
  ModelSpec& m = job.training.model;
  m.type = "layers";
  m.hidden_units.clear();
  m.input_shape = {28, 28, 1};
  auto conv = [](int filters) {
    LayerSpec l{LayerType::kConv2D};
    l.filters = filters;
    l.kernel = 3;
    l.same_padding = true;
    l.activation = Activation::kRelu;
    return l;
  };
  auto pool = [] {
    LayerSpec l{LayerType::kMaxPool2D};
    l.kernel = l.stride = 2;
    return l;
  };
  LayerSpec dense{LayerType::kDense, 128}, dropout{LayerType::kDropout}, out{LayerType::kDense, 10};
  dense.activation = Activation::kRelu;
  dropout.rate = 0.5;
  m.layers = {conv(32), pool(),  conv(64), pool(), LayerSpec{LayerType::kFlatten},
              dense,    dropout, out};
  job.training.batch_size = batch_size;
  return job;
}

TEST(MemoryBudgetTest, ConvActivationsAreCountedNamingTheLayer) {
  auto m = EstimateModelMemory(Cnn(64));
  ASSERT_TRUE(m.ok()) << m.status();
  // Per example: conv 28x28x32 out + 2 x 784x9 patches; pool 2 x 6272; conv
  // 14x14x64 out + 2 x 196x288 patches; pool 2 x 3136; flatten 3136;
  // dense 128; dropout 128 + 128 mask; dense 10.
  const int64_t per_example =
      (25088 + 2 * 784 * 9) + 2 * 6272 + (12544 + 2 * 196 * 288) + 2 * 3136 + 3136 + 128 + 256 + 10;
  EXPECT_EQ(m->activation_bytes, per_example * 64 * 4);
  EXPECT_EQ(m->largest_layer, 2);
  EXPECT_EQ(m->reader_bytes, 2 * m->model_bytes + m->activation_bytes);
  // At batchSize 65536 a worker needs ~46 GiB, most of it conv2's patches.
  absl::Status s = CheckModelFitsMemory(Cnn(65536), {8 * kGi, "--memory-limit 8Gi"}, false);
  ASSERT_FALSE(s.ok());
  const std::string msg(s.message());
  EXPECT_CONTAINS(msg, "spec.training.model: needs at least 45.");
  EXPECT_CONTAINS(msg, "on each worker");
  EXPECT_CONTAINS(msg, "of activations for a batch of 65536");
  EXPECT_CONTAINS(msg, "in layers[2] conv2d: im2col patches [12845056 x 288] and their gradient");
  EXPECT_CONTAINS(msg, "more than the 8.0 GiB of --memory-limit 8Gi");
  EXPECT_CONTAINS(msg, "smaller layers or a smaller batchSize");
  EXPECT_TRUE(CheckModelFitsMemory(Cnn(64), {8 * kGi, "--memory-limit 8Gi"}, true).ok());
}

// A sparse job: a fixed embedding table (5 rows), a bounded dynamic
// embedding (maxRows 1000) and a bounded dynamic wide table (maxRows 600,
// FTRL) over 2 PS tasks, adagrad for the rest.
TrainingJob SparseJob(const std::string& checkpoint = "") {
  auto job = ParseTrainingJob(absl::StrCat(R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: mem}
spec:
  replicaSpecs:
    PS: {replicas: 2}
    Worker: {replicas: 2}
  training:
    steps: 10
    batchSize: 100
    optimizer: {type: adagrad, learningRate: 0.1}
)",
                                           checkpoint, R"(
    dataset:
      format: csv
      path: train.csv
      testPath: test.csv
      columns:
        - {name: color, type: categorical, vocabulary: [r, g, b, x, y]}
        - {name: ad, type: categorical, dynamic: true}
        - {name: y, type: label, classes: ["0", "1"]}
    model:
      layers: [{type: dense, units: 1}]
      head: wideAndDeep
      embeddings:
        - {column: color, dim: 4}
        - {column: ad, dim: 8, maxRows: 1000}
      wide:
        columns: [ad]
        maxRows: 600
        optimizer: {type: ftrl, learningRate: 0.1}
)"));
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

TEST(MemoryBudgetTest, ADynamicTablesBookkeepingIsAbslsHashMapPlusIdsAndLinks) {
  // 500 rows: the map grows 511 -> 1023 slots at 448 entries (7/8 of 511).
  EXPECT_EQ(DynamicTableBookkeepingBytes(500), 500 * 16 + 1023 * 17);
  EXPECT_EQ(DynamicTableBookkeepingBytes(448), 448 * 16 + 511 * 17);
  EXPECT_EQ(DynamicTableBookkeepingBytes(0), 0);
  for (int64_t rows : {1000, 4096, 50000, 1 << 20, 4600000}) {
    const double per_row = static_cast<double>(DynamicTableBookkeepingBytes(rows)) / rows;
    EXPECT_GE(per_row, 35.4) << rows;
    EXPECT_LE(per_row, 55.0) << rows;
  }
}

TEST(MemoryBudgetTest, TablesCountTheirRowsSlotsAndADynamicTablesBookkeeping) {
  const TrainingJob job = SparseJob();
  auto m = EstimateModelMemory(job);
  ASSERT_TRUE(m.ok()) << m.status();
  // ps:0 holds rows 0, 2 and 4 of embedding.color (3 x 4 floats, + 1 adagrad
  // slot), 500 rows of embedding.ad (x 8, + 1 slot) and 300 of wide.ad (x 1,
  // + 2 ftrl slots).
  const int64_t table = 3 * 4 * 4 * 2 + 500 * 8 * 4 * 2 + 300 * 1 * 4 * 3;
  const int64_t bookkeeping = DynamicTableBookkeepingBytes(500) + DynamicTableBookkeepingBytes(300);
  // The dense variables (layers.0 kernel [12, 1] and bias, wide.bias) on
  // the less loaded task, x 4: values, adagrad slot, accumulator, gradient.
  int64_t dense[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    auto model = Model::Create(job.training.model);
    ASSERT_TRUE(model.ok());
    // The placement outlives the loop: PartsOfShard points into it.
    const Placement placement =
        PlaceVariables(model->variables(), 2, job.training.split_threshold_bytes);
    for (const PartPlacement* p : placement.PartsOfShard(s)) dense[s] += p->num_bytes();
  }
  EXPECT_EQ(dense[0] + dense[1], (12 + 1 + 1) * 4);
  const int64_t ps0 = dense[0] * 4 + table + bookkeeping;
  const int64_t ps1 =
      dense[1] * 4 + (2 * 4 * 4 * 2 + 500 * 8 * 4 * 2 + 300 * 1 * 4 * 3) + bookkeeping;
  EXPECT_EQ(m->largest_ps_bytes, std::max(ps0, ps1));
  EXPECT_EQ(m->largest_ps_memory.dynamic_rows, 800);
  EXPECT_EQ(m->largest_ps_memory.bookkeeping_bytes, bookkeeping);
  EXPECT_GT(bookkeeping, 800 * 35);  // not only values and slots
  // Checkpoints: a snapshot of the dense parts; table rows are read in place,
  // a dynamic table's recency list and row order cost 12 bytes a row.
  auto checkpointed = EstimateModelMemory(SparseJob("    checkpoint: {directory: /ckpt}\n"));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  EXPECT_EQ(checkpointed->largest_ps_memory.total_bytes,
            checkpointed->largest_ps_memory.dense_bytes * 6 + table + bookkeeping + 800 * 12);
  // The message names the rows' bookkeeping.
  absl::Status s = CheckModelFitsMemory(job, {50000, "--memory-limit 50000"}, false);
  ASSERT_FALSE(s.ok());
  const std::string msg(s.message());
  EXPECT_CONTAINS(msg,
                  "on ps:0 (48 B of parameters x 4: values, 1 adagrad slot, the sync accumulator "
                  "and a gradient buffer; 34.9 KiB of table rows with their optimizer slots; "
                  "38.0 KiB to index 800 dynamic table rows (ids, LRU links, hash map))");
  EXPECT_TRUE(CheckTaskFitsMemory(job, "ps", 1, {ps1, "x"}).ok());
  EXPECT_FALSE(CheckTaskFitsMemory(job, "ps", 1, {ps1 - 1, "x"}).ok());
}

TEST(MemoryBudgetTest, FtrlKeepsTwoSlots) {
  EXPECT_EQ(OptimizerSlots("ftrl"), 2);
  EXPECT_EQ(EstimateModelMemory(Job({64}, "ftrl"))->largest_ps_bytes, 50890 * 4 * 5);
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
