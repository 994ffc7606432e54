// Optimizers applied by a PS shard to the parts it holds.
//
// Each optimizer keeps its slot state (momentum, Adam moments, Adagrad
// accumulators) per part, sized at construction. Not thread-safe: the shard
// calls Apply under its own lock.
#ifndef KUBETRAIN_PS_OPTIMIZER_H_
#define KUBETRAIN_PS_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/job_spec.h"

namespace kubetrain {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // value -= update(grad) for part `part` (n elements). `step` counts the
  // updates applied to this shard so far, starting at 1 (Adam's bias correction).
  virtual void Apply(int part, float* value, const float* grad, int64_t n, int64_t step) = 0;
  // Slot buffers of a part, in a fixed order (for checkpoints).
  virtual std::vector<std::vector<float>*> Slots(int part) = 0;
};

// part_sizes[i] = element count of part i.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           const std::vector<int64_t>& part_sizes);

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_OPTIMIZER_H_
