// Model's sparse features (core/model.h): the table lookups of a batch
// (ids, crossed ids, weights), the embedding and wide forward pass, and the
// table rows' gradients. The dense layers are in model.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/hash.h"
#include "core/model.h"

namespace kubetrain {
namespace {

using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

// Every combination of the members' ids, hashed (CrossedSpec).
void CrossIds(const std::vector<std::vector<int64_t>>& members, int64_t buckets,
              std::vector<int64_t>* out) {
  for (const auto& m : members) {
    if (m.empty()) return;  // a missing member: no crossed id
  }
  std::vector<size_t> pick(members.size(), 0);
  while (true) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t k = 0; k < members.size(); ++k) {
      const uint64_t id = static_cast<uint64_t>(members[k][pick[k]]);
      for (int b = 0; b < 8; ++b) {
        h ^= (id >> (8 * b)) & 0xff;
        h *= 1099511628211ULL;
      }
    }
    out->push_back(static_cast<int64_t>(h % static_cast<uint64_t>(buckets)));
    size_t k = 0;
    while (k < members.size() && ++pick[k] == members[k].size()) pick[k++] = 0;
    if (k == members.size()) return;
  }
}

// The combiner's factor for example r's ids in `l` (n ids of weight 1: 1/n
// for the mean, 1/sqrt(n) for sqrtn, as before weights existed).
float CombinerScale(Combiner c, const TableLookup& l, int64_t r) {
  const int64_t begin = l.offsets[r], n = l.offsets[r + 1] - begin;
  if (n == 0) return 0.0f;
  if (l.weights.empty()) {
    switch (c) {
      case Combiner::kMean:
        return 1.0f / static_cast<float>(n);
      case Combiner::kSqrtn:
        return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
      case Combiner::kSum:
        break;
    }
    return 1.0f;
  }
  double sum = 0, squares = 0;
  for (int64_t i = begin; i < begin + n; ++i) {
    sum += l.weights[i];
    squares += static_cast<double>(l.weights[i]) * l.weights[i];
  }
  switch (c) {
    case Combiner::kMean:
      return sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
    case Combiner::kSqrtn:
      return squares > 0 ? static_cast<float>(1.0 / std::sqrt(squares)) : 0.0f;
    case Combiner::kSum:
      break;
  }
  return 1.0f;
}

}  // namespace

const char* CombinerName(Combiner c) {
  switch (c) {
    case Combiner::kSum:
      return "sum";
    case Combiner::kSqrtn:
      return "sqrtn";
    case Combiner::kMean:
      break;
  }
  return "mean";
}

std::optional<Combiner> CombinerFromName(const std::string& name) {
  for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    if (name == CombinerName(c)) return c;
  }
  return std::nullopt;
}

std::string CrossedSpec::name() const { return absl::StrJoin(columns, "_x_"); }

TableIds CompactLookups(SparseBatch* batch) {
  TableIds unique;
  for (TableLookup& t : *batch) {
    std::vector<int64_t> ids = t.ids;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int64_t& id : t.ids) id = std::lower_bound(ids.begin(), ids.end(), id) - ids.begin();
    unique.push_back(std::move(ids));
  }
  return unique;
}

int Model::SparseInputIndex(const std::string& column) const {
  for (size_t i = 0; i < spec_.sparse_inputs.size(); ++i) {
    if (spec_.sparse_inputs[i].column == column) return static_cast<int>(i);
  }
  return -1;
}

bool Model::has_dynamic_tables() const {
  return std::any_of(tables_.begin(), tables_.end(),
                     [this](int v) { return variables_[v].dynamic; });
}

SparseBatch Model::Lookups(const int64_t* lookup_ids, int64_t rows,
                           const float* lookup_weights) const {
  SparseBatch out(tables_.size());
  std::vector<std::vector<int64_t>> members;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const TableUse& use = table_uses_[t];
    TableLookup& l = out[t];
    l.offsets.reserve(rows + 1);
    l.offsets.push_back(0);
    // A weighted input is never crossed (the spec refuses it): one member.
    const bool weighted = use.buckets == 0 && spec_.sparse_inputs[use.inputs[0]].weighted;
    for (int64_t r = 0; r < rows; ++r) {
      members.assign(use.inputs.size(), {});
      for (size_t j = 0; j < use.inputs.size(); ++j) {
        const int k = use.inputs[j];
        const SparseInput& in = spec_.sparse_inputs[k];
        const int64_t* ids = lookup_ids + r * id_slots_ + slot_offset_[k];
        for (int s = 0; s < in.slots; ++s) {
          // -1: none; anything outside the vocabulary is none as well.
          if (ids[s] >= 0 && (in.dynamic || ids[s] < in.vocab)) {
            members[j].push_back(ids[s]);
            if (weighted) {
              l.weights.push_back(lookup_weights != nullptr
                                      ? lookup_weights[r * id_slots_ + slot_offset_[k] + s]
                                      : 1.0f);
            }
          }
        }
      }
      if (use.buckets > 0) {
        CrossIds(members, use.buckets, &l.ids);
      } else {
        l.ids.insert(l.ids.end(), members[0].begin(), members[0].end());
      }
      l.offsets.push_back(static_cast<int64_t>(l.ids.size()));
    }
  }
  return out;
}

namespace {

// Below this much work (floats read or written) a sparse pass stays on the
// caller's thread: waking another costs more. It never changes the bits.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

}  // namespace

// Threads: every example's deep input and wide logit is computed whole, by
// the same operations in the same order, whichever chunk of examples it
// falls in, so a split by examples gives the same bits with any pool.
RowMatrix Model::ForwardSparse(const Params& params, const float* x, int64_t rows,
                               const SparseBatch& lookups, uint64_t dropout_seed, Cache* cache,
                               RowMatrix* deep, const LayerHooks* hooks) const {
  if (hooks != nullptr) {
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (table_uses_[t].embedding >= 0) hooks->Await(tables_[t]);
    }
  }
  deep->setZero(rows, input_shape_[0]);
  int64_t work = rows * deep->cols();
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (table_uses_[t].embedding >= 0) {
      work += static_cast<int64_t>(lookups[t].ids.size()) *
              spec_.embeddings[table_uses_[t].embedding].dim;
    }
  }
  ThreadPool* pool = work < kMinParallelWork ? nullptr : pool_.get();
  // Examples [r0, r1): dense features, then each table's combined rows.
  auto gather = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::copy_n(x + r * dense_dim_, dense_dim_, deep->data() + r * deep->cols());
    }
    int64_t col = dense_dim_;
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (table_uses_[t].embedding < 0) continue;
      const EmbeddingSpec& emb = spec_.embeddings[table_uses_[t].embedding];
      const TableLookup& l = lookups[t];
      const float* table = params[tables_[t]].data();
      for (int64_t r = r0; r < r1; ++r) {
        auto out = deep->row(r).segment(col, emb.dim);
        for (int64_t i = l.offsets[r]; i < l.offsets[r + 1]; ++i) {
          if (l.weights.empty()) {
            out += ConstRowVectorMap(table + l.ids[i] * emb.dim, emb.dim);
          } else {
            out += l.weights[i] * ConstRowVectorMap(table + l.ids[i] * emb.dim, emb.dim);
          }
        }
        out *= CombinerScale(emb.combiner, l, r);
      }
      col += emb.dim;
    }
  };
  ParallelFor(pool, rows, gather);
  RowMatrix z = Forward(params, deep->data(), rows, dropout_seed, cache, hooks);
  if (wide_bias_ >= 0) {
    if (hooks != nullptr) {
      for (size_t t = 0; t < tables_.size(); ++t) {
        if (table_uses_[t].embedding < 0) hooks->Await(tables_[t]);
      }
      hooks->Await(wide_bias_);
    }
    ParallelFor(pool, rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float w = params[wide_bias_][0];
        for (size_t t = 0; t < tables_.size(); ++t) {
          if (table_uses_[t].embedding >= 0) continue;
          const TableLookup& l = lookups[t];
          const float* table = params[tables_[t]].data();
          for (int64_t i = l.offsets[r]; i < l.offsets[r + 1]; ++i) {
            w += l.weights.empty() ? table[l.ids[i]] : l.weights[i] * table[l.ids[i]];
          }
        }
        z(r, 0) += w;
      }
    });
  }
  return z;
}

// Threads: a table row's gradient is a sum over the examples that look it
// up, added in example order. Split by examples, two chunks could add into
// one row (a race, and an order that depends on the split); so the split is
// by table rows instead: each chunk of ids walks all the examples in order
// and adds only into its own rows. Every row gets the same terms in the
// same order as on one thread: the same bits with any pool.
void Model::SparseBackward(const Params& params, const SparseBatch& lookups,
                           const RowMatrix& d_deep, const RowMatrix& d_logits, Params* grads,
                           const LayerHooks* hooks) const {
  const int64_t rows = d_logits.rows();
  int64_t col = dense_dim_;
  for (size_t t = 0; t < tables_.size(); ++t) {
    std::vector<float>& g = (*grads)[tables_[t]];
    g.assign(params[tables_[t]].size(), 0.0f);
    const TableLookup& l = lookups[t];
    const int64_t dim =
        table_uses_[t].embedding >= 0 ? spec_.embeddings[table_uses_[t].embedding].dim : 1;
    const int64_t table_rows = static_cast<int64_t>(g.size()) / dim;
    ThreadPool* pool = static_cast<int64_t>(l.ids.size()) * dim < kMinParallelWork || table_rows < 2
                           ? nullptr
                           : pool_.get();
    if (table_uses_[t].embedding >= 0) {
      const EmbeddingSpec& emb = spec_.embeddings[table_uses_[t].embedding];
      if (Serial(pool)) {
        for (int64_t r = 0; r < rows; ++r) {
          const float scale = CombinerScale(emb.combiner, l, r);
          const float* d = d_deep.data() + r * d_deep.cols() + col;
          for (int64_t i = l.offsets[r]; i < l.offsets[r + 1]; ++i) {
            float* row = g.data() + l.ids[i] * emb.dim;
            const float s = l.weights.empty() ? scale : scale * l.weights[i];
            for (int k = 0; k < emb.dim; ++k) row[k] += s * d[k];
          }
        }
      } else {
        std::vector<float> scales(rows);
        for (int64_t r = 0; r < rows; ++r) scales[r] = CombinerScale(emb.combiner, l, r);
        pool->ParallelFor(table_rows, [&](int64_t id0, int64_t id1) {
          for (int64_t r = 0; r < rows; ++r) {
            const float scale = scales[r];
            const float* d = d_deep.data() + r * d_deep.cols() + col;
            for (int64_t i = l.offsets[r]; i < l.offsets[r + 1]; ++i) {
              if (l.ids[i] < id0 || l.ids[i] >= id1) continue;
              float* row = g.data() + l.ids[i] * emb.dim;
              const float s = l.weights.empty() ? scale : scale * l.weights[i];
              for (int k = 0; k < emb.dim; ++k) row[k] += s * d[k];
            }
          }
        });
      }
      col += emb.dim;
    } else {
      auto scatter = [&](int64_t id0, int64_t id1) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = l.offsets[r]; i < l.offsets[r + 1]; ++i) {
            if (l.ids[i] < id0 || l.ids[i] >= id1) continue;
            g[l.ids[i]] += l.weights.empty() ? d_logits(r, 0) : l.weights[i] * d_logits(r, 0);
          }
        }
      };
      if (Serial(pool)) {
        scatter(0, table_rows);  // every id is in [0, table_rows)
      } else {
        pool->ParallelFor(table_rows, scatter);
      }
    }
    if (hooks != nullptr) hooks->Ready(tables_[t]);
  }
  if (wide_bias_ >= 0) {
    (*grads)[wide_bias_].resize(1);
    ColumnSums(d_logits.data(), rows, 1, (*grads)[wide_bias_].data());
    if (hooks != nullptr) hooks->Ready(wide_bias_);
  }
}

std::vector<int> Model::BackpropOrder() const {
  std::vector<int> order;
  for (auto op = ops_.rbegin(); op != ops_.rend(); ++op) {
    if (op->kernel < 0) continue;
    order.push_back(op->kernel);
    order.push_back(op->bias);
  }
  order.insert(order.end(), tables_.begin(), tables_.end());
  if (wide_bias_ >= 0) order.push_back(wide_bias_);
  return order;
}

}  // namespace kubetrain
