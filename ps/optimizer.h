// Optimizers applied by a PS shard to the parts it holds.
//
// Each optimizer keeps its slot state (momentum, Adam moments, Adagrad
// accumulators) per part, sized at construction. An update is staged and
// then committed, so the shard can refuse an update that would store a
// non-finite value and keep parameters and optimizer state exactly as they
// were: Stage computes the new values and slots without changing any state,
// Commit makes the staged slots current. The slots are double-buffered
// (Commit swaps), so staging costs no copy. Not thread-safe: the shard calls
// it under its own lock.
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
  // value_out = value - update(grad) for part `part` (n elements), and the
  // part's new slot state into its staging buffers; value_out may be value.
  // `step` counts the updates applied to this shard so far, starting at 1
  // (Adam's bias correction). Returns false if any new value or slot element
  // is not finite. Nothing current changes until Commit(part).
  // With `grad_finite` non-null, the gradient's finiteness is checked in the
  // same pass (block by block, while the block is in L1: a push's separate
  // check of a 60 MB gradient was a whole extra read of it): on a non-finite
  // gradient element Stage stops, sets *grad_finite = false and returns
  // false; otherwise *grad_finite is left as it was. A false return with
  // *grad_finite still true means an update element was not finite, and the
  // gradient after that block was not checked.
  virtual bool Stage(int part, const float* value, const float* grad, int64_t n, int64_t step,
                     float* value_out, bool* grad_finite = nullptr) = 0;
  // Makes the slot state of the last Stage(part) current.
  virtual void Commit(int part) = 0;
  // Current slot buffers of a part, in a fixed order (for checkpoints).
  virtual std::vector<std::vector<float>*> Slots(int part) = 0;

  // Stage in place and Commit, whatever the result (tests).
  bool Apply(int part, float* value, const float* grad, int64_t n, int64_t step) {
    const bool finite = Stage(part, value, grad, n, step, value);
    Commit(part);
    return finite;
  }
};

// part_sizes[i] = element count of part i.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec,
                                                           const std::vector<int64_t>& part_sizes);

// The row-wise ("lazy") form of an optimizer, for one PS shard's rows of an
// embedding table (`rows` x `dim`, row-major): an update touches only the
// rows it names, and runs exactly the element-wise rule of the dense
// optimizer of the same type on them (one code path), so a touched row ends
// as the dense optimizer would leave it and an untouched row, value and
// slots, does not move (TF's LazyAdam and sparse apply). Adam's bias
// correction uses the shard's step, as the dense Adam does. Staged and
// committed like Optimizer; not thread-safe.
class RowOptimizer {
 public:
  static absl::StatusOr<std::unique_ptr<RowOptimizer>> Create(const OptimizerSpec& spec,
                                                              int64_t rows, int64_t dim);
  ~RowOptimizer();
  // value_out[i*dim, (i+1)*dim) = new value of row rows[i] of `table`, whose
  // gradient is grad[i*dim, ...); the new slot rows are staged. `rows` must
  // be distinct and < rows. Returns false if anything new is not finite.
  bool Stage(const float* table, const std::vector<int64_t>& rows, const float* grad, int64_t step,
             float* value_out);
  // The slot rows of the last Stage (same `rows`) become current.
  void Commit(const std::vector<int64_t>& rows);
  // Room to stage `rows` rows: a Stage of at most that many allocates nothing.
  void Reserve(int64_t rows);
  // Current slot buffers (rows x dim each), in a fixed order (checkpoints).
  std::vector<std::vector<float>*> Slots();
  int num_slots() const;
  // Dynamic tables: the row count becomes `rows` (new rows get the slots'
  // initial values; capacity is exactly `capacity` >= rows, no doubling),
  // and ResetRow gives row r its initial slots again (a reused row).
  void Resize(int64_t rows, int64_t capacity);
  void ResetRow(int64_t r);

 private:
  struct Impl;
  explicit RowOptimizer(std::unique_ptr<Impl> impl);
  const std::unique_ptr<Impl> impl_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_OPTIMIZER_H_
