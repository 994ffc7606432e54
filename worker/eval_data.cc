#include "worker/eval_data.h"

#include <algorithm>

namespace kubetrain {

EvalData::EvalData(const Model& model, const Dataset& data, int64_t limit)
    : model_(model), data_(data), size_(limit < 0 ? data.size : std::min(limit, data.size)) {
  if (model_.sparse()) {
    lookups_ = model_.Lookups(data_.lookup_ids.data(), size_,
                              data_.lookup_weights.empty() ? nullptr : data_.lookup_weights.data());
    ids_ = CompactLookups(&lookups_);
  }
}

Batch EvalData::batch() const {
  Batch b;
  b.x = data_.images.data();
  b.labels = data_.labels.data();
  b.targets = data_.targets.empty() ? nullptr : data_.targets.data();
  b.lookup_ids = data_.lookup_ids.data();
  b.lookup_weights = data_.lookup_weights.empty() ? nullptr : data_.lookup_weights.data();
  b.size = size_;
  if (model_.sparse()) b.sparse = &lookups_;
  return b;
}

absl::Status EvalData::PullRows(PsClient* client, Params* params) const {
  if (!model_.sparse()) return absl::OkStatus();
  return client->PullRows(ids_, params, /*read_only=*/true);
}

absl::StatusOr<EvalMetrics> EvalData::Evaluate(PsClient* client, Params* params) const {
  if (absl::Status s = PullRows(client, params); !s.ok()) return s;
  return model_.Evaluate(*params, batch());
}

}  // namespace kubetrain
