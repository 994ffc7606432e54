// Test-only helpers for worker tests: a small TrainingJob's task configs, a
// tiny learnable dataset, and the job's PS tasks in the test's process
// (ps/in_process_shard_channel.h) with a fault-injecting channel per task.
#ifndef KUBETRAIN_WORKER_TESTING_H_
#define KUBETRAIN_WORKER_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/task_config.h"
#include "core/testing/task_config_for.h"
#include "ps/in_process_shard_channel.h"

namespace kubetrain {
namespace testjob {

struct JobShape {
  int ps = 1;
  int workers = 2;
  bool chief = false;      // a Chief replica
  bool evaluator = false;  // an Evaluator replica
  std::string mode = "sync";
  int64_t steps = 20;
  // More lines under spec.training (indented by 4), e.g. "    maxStaleness: 2\n".
  std::string training;
};

// A softmax job (784 -> 10, SGD, batch 8) with the given shape.
std::string JobYaml(const JobShape& shape);

// `n` examples of 784 features in 10 classes that a softmax model learns in
// a few dozen steps: class c lights up its own block of pixels, plus noise.
Dataset TinyDataset(int64_t n, uint64_t seed);

// A sigmoid job (2 PS, 2 sync workers, batch 8, 150 steps, adagrad) whose
// csv dataset (never read: give the data in memory) has a dense feature x
// and a dynamic column c, embedded with dim 4 and maxRows `max_rows` (0: no
// bound).
std::string DynamicJobYaml(int64_t max_rows);

// `n` examples of that job: y = [x + w(c) > 0], w(c) = +-1.5, c one of
// `values` values, whose ids are spread over 63 bits as DynamicColumnId's
// are.
Dataset DynamicDataset(int64_t n, uint64_t seed, int values);

// The job's PS tasks in process. `config` (any task's) and `clock` must
// outlive the cluster.
class InProcessCluster {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessCluster>> Create(const TaskConfig& config,
                                                                  const Clock* clock);
  InProcessPs* ps(int i) const { return ps_[i].get(); }
  int num_ps() const { return static_cast<int>(ps_.size()); }
  // One channel per PS task, each a FaultyShardChannel (returned in
  // `faulty`, if given, for the test to switch faults on).
  std::vector<std::unique_ptr<ShardChannel>> Channels(
      std::vector<FaultyShardChannel*>* faulty = nullptr, uint64_t max_chunk_bytes = 4096);
  void TickAll();

 private:
  std::vector<std::unique_ptr<InProcessPs>> ps_;
};

}  // namespace testjob
}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_TESTING_H_
