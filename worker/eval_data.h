// A data set a task evaluates the model on again and again (the chief's and
// the evaluator's test set, the chief's loss sample, the exporter's test
// set), prepared once: for a sparse model, the lookups of its examples into
// compact tables and the distinct ids of each table. Each evaluation then
// pulls only the rows the data looks up, read-only (a dynamic table's row
// that does not exist reads as its initial value and is not created), never
// a whole table -- a dynamic table has no whole to pull.
#ifndef KUBETRAIN_WORKER_EVAL_DATA_H_
#define KUBETRAIN_WORKER_EVAL_DATA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/dataset.h"
#include "core/model.h"
#include "worker/ps_client.h"

namespace kubetrain {

class EvalData {
 public:
  // The first `limit` examples of `data` (all with limit < 0). `model` and
  // `data` must outlive this.
  EvalData(const Model& model, const Dataset& data, int64_t limit = -1);
  EvalData(const EvalData&) = delete;
  EvalData& operator=(const EvalData&) = delete;

  // The examples; for a sparse model with its compact lookups (the tables
  // in params must then be PullRows's).
  Batch batch() const;
  // Puts the rows the examples look up into the tables of params (sparse
  // models; nothing for others).
  absl::Status PullRows(PsClient* client, Params* params) const;
  // PullRows, then the model's figures on the examples.
  absl::StatusOr<EvalMetrics> Evaluate(PsClient* client, Params* params) const;

 private:
  const Model& model_;
  const Dataset& data_;
  const int64_t size_;
  SparseBatch lookups_;  // into compact tables
  TableIds ids_;         // per table: the distinct ids the examples look up
};

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_EVAL_DATA_H_
