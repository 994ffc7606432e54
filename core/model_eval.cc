// Model's evaluation (core/model.h): logits, Evaluate and Accuracy in
// blocks of examples, and the AUC they report.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/model.h"

namespace kubetrain {
namespace {

// Rows per forward block in Evaluate(): bounds memory on large eval sets.
constexpr int64_t kEvalBlock = 1000;

}  // namespace

double Auc(const std::vector<double>& score, const std::vector<int32_t>& label) {
  std::vector<size_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  double positives = 0, rank_sum = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && score[order[j]] == score[order[i]]) ++j;
    const double mid_rank = (static_cast<double>(i) + static_cast<double>(j) + 1) / 2;  // 1-based
    for (size_t t = i; t < j; ++t) {
      if (label[order[t]] == 1) {
        positives += 1;
        rank_sum += mid_rank;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(score.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

namespace {

// Examples [start, start + rows) of a batch's lookups (ids as they are).
SparseBatch SliceLookups(const SparseBatch& all, int64_t start, int64_t rows) {
  SparseBatch out(all.size());
  for (size_t t = 0; t < all.size(); ++t) {
    const TableLookup& from = all[t];
    const int64_t begin = from.offsets[start], end = from.offsets[start + rows];
    out[t].ids.assign(from.ids.begin() + begin, from.ids.begin() + end);
    if (!from.weights.empty()) {
      out[t].weights.assign(from.weights.begin() + begin, from.weights.begin() + end);
    }
    out[t].offsets.reserve(rows + 1);
    for (int64_t r = 0; r <= rows; ++r) out[t].offsets.push_back(from.offsets[start + r] - begin);
  }
  return out;
}

}  // namespace

RowMatrix Model::Logits(const Params& params, const Batch& data) const {
  if (!sparse()) return Forward(params, data.x, data.size, 0, nullptr);
  RowMatrix deep;
  return ForwardSparse(
      params, data.x, data.size,
      data.sparse ? *data.sparse : Lookups(data.lookup_ids, data.size, data.lookup_weights), 0,
      nullptr, &deep);
}

RowMatrix Model::BlockLogits(const Params& params, const Batch& data, int64_t start,
                             int64_t rows) const {
  Batch block;
  block.x = data.x + start * input_dim();
  block.size = rows;
  if (data.lookup_ids != nullptr) block.lookup_ids = data.lookup_ids + start * id_slots_;
  if (data.lookup_weights != nullptr) {
    block.lookup_weights = data.lookup_weights + start * id_slots_;
  }
  SparseBatch slice;
  if (data.sparse != nullptr) {
    slice = SliceLookups(*data.sparse, start, rows);
    block.sparse = &slice;
  }
  return Logits(params, block);
}

EvalMetrics Model::Evaluate(const Params& params, const Batch& data) const {
  EvalMetrics m;
  m.examples = data.size;
  if (data.size <= 0) return m;
  int64_t correct = 0;
  double loss = 0;
  const bool binary = spec_.head == HeadType::kSigmoid || spec_.head == HeadType::kWideAndDeep ||
                      (spec_.head == HeadType::kSoftmax && ops_.back().out[0] == 2);
  std::vector<double> score;  // binary: P(class 1)
  std::vector<int32_t> labels;
  for (int64_t start = 0; start < data.size; start += kEvalBlock) {
    const int64_t rows = std::min(kEvalBlock, data.size - start);
    RowMatrix z = BlockLogits(params, data, start, rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e = start + r;
      switch (spec_.head) {
        case HeadType::kSoftmax: {
          Eigen::Index arg = 0;
          const float max = z.row(r).maxCoeff(&arg);
          if (arg == data.labels[e]) ++correct;
          const double sum = (z.row(r).array() - max).exp().sum();
          loss += std::log(sum) - (z(r, data.labels[e]) - max);
          if (binary) {
            score.push_back(std::exp(static_cast<double>(z(r, 1)) - max) / sum);
            labels.push_back(data.labels[e]);
          }
          break;
        }
        case HeadType::kSigmoid:
        case HeadType::kWideAndDeep: {
          const double logit = z(r, 0);
          const int32_t y = data.labels[e] == 1 ? 1 : 0;
          if ((logit >= 0 ? 1 : 0) == y) ++correct;
          loss += std::max(logit, 0.0) - logit * y + std::log1p(std::exp(-std::fabs(logit)));
          score.push_back(logit);  // monotone in p: same AUC
          labels.push_back(y);
          break;
        }
        case HeadType::kMeanSquaredError: {
          const double diff = static_cast<double>(z(r, 0)) - data.targets[e];
          loss += diff * diff;
          break;
        }
      }
    }
  }
  const double n = static_cast<double>(data.size);
  m.loss = loss / n;
  if (spec_.head == HeadType::kMeanSquaredError) {
    m.rmse = std::sqrt(m.loss);
    return m;
  }
  m.accuracy = static_cast<double>(correct) / n;
  m.log_loss = m.loss;
  if (binary) m.auc = Auc(score, labels);
  return m;
}

double Model::Accuracy(const Params& params, const float* x, const int32_t* y, int64_t n) const {
  if (n <= 0) return 0.0;
  if (spec_.head != HeadType::kSoftmax) {
    Batch b;
    b.x = x;
    b.labels = y;
    b.size = n;
    return Evaluate(params, b).accuracy.value_or(0.0);
  }
  Batch all;
  all.x = x;
  all.size = n;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += kEvalBlock) {
    const int64_t rows = std::min(kEvalBlock, n - start);
    RowMatrix z = BlockLogits(params, all, start, rows);
    for (int64_t r = 0; r < rows; ++r) {
      Eigen::Index arg = 0;
      z.row(r).maxCoeff(&arg);
      if (arg == y[start + r]) ++correct;
    }
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace kubetrain
