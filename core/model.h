// Models trained by kubetrain: a list of layers (core/layers.h) and a head
// (the loss), on Eigen.
//
// Parameters are a list of variables, each a row-major float32 matrix
// (`rows` x `cols`). Every dense or conv2d layer owns a kernel and a bias
// [1, out]; dense kernels are [in, out], conv2d kernels [k*k*in_c, filters].
// Row-major kernels with rows = input features make a split by rows (across
// PS tasks) a contiguous slice.
//
// Two shorthands predate the layer list and keep their variable names, so
// checkpoints, model files and placement of old jobs stay valid:
//   softmax  one dense layer input -> classes:  dense0/kernel, dense0/bias
//   mlp      dense+ReLU per hidden size, then dense -> classes: dense{i}/...
// A layer list names layer i's variables "layers.{i}.kernel"/"layers.{i}.bias".
//
// Initial values (deterministic in (seed, variable name)): biases zero;
// softmax shorthand kernel zero; mlp shorthand kernels Glorot-uniform; in a
// layer list, kernels of layers with a ReLU He-uniform (limit
// sqrt(6 / fan_in)), all others Glorot-uniform (limit
// sqrt(6 / (fan_in + fan_out))), with fan = k*k*channels for conv2d.
//
// Threads: a step computes on SetThreads() threads (default 1: the caller's
// thread only, the same bits as before threads existed). With N > 1 the
// layers split their work by output rows or columns, and a conv2d's weight
// and bias gradients into per-chunk sums added in chunk order (core/
// layers.h; a run of conv2d/pool layers as one job per chunk of images,
// core/model_images.cc): the bits are the same on every run with N
// threads, and within float rounding of N = 1.
// Some paths give the 1-thread bits with any N: dropout (its mask is one
// serial random stream per (seed, layer), whatever N; only the multiply by
// it is split) and the sparse paths (the embedding gather and the wide
// logit split by examples; the table gradients' scatter split by table rows,
// each chunk walking all the examples in order, so every row's sum has the
// 1-thread terms in the 1-thread order; core/model_sparse.cc).
//
// Thread safety: a Model is immutable after Create() and SetThreads(); all
// const methods may be called concurrently (calls that overlap share the
// pool: one of them uses its threads, the others compute the same chunks on
// their own thread, core/thread_pool.h). Copies share the pool.
#ifndef KUBETRAIN_CORE_MODEL_H_
#define KUBETRAIN_CORE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/layers.h"
#include "core/thread_pool.h"

namespace kubetrain {

struct VariableSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  // An embedding table (rows: ids, cols: dim): sharded by row over every PS
  // task and moved row by row (core/placement.h), never as a whole.
  bool table = false;
  // A table of the wide part: trained with model.wide.optimizer if given.
  bool wide = false;
  // A dynamic table (a table over a `dynamic` categorical column): any
  // 64-bit id, rows created on the PS on first touch (ps/dynamic_table.h);
  // rows is 0. max_rows: at most this many rows over all PS tasks (0: no
  // bound), ceil(max_rows / PS tasks) per task.
  bool dynamic = false;
  int64_t max_rows = 0;
  int64_t num_elements() const { return rows * cols; }
  int64_t num_bytes() const { return num_elements() * 4; }
};

// Deterministic initial value of row `id` of table `var` (var.cols floats
// into out), a function of (seed, table name, id) only: the value a dynamic
// table's row gets when it is created (and what an unseen id reads as), so a
// restarted PS recreates an untrained row identically. Embeddings: uniform in
// +-1/sqrt(dim) as Model::InitialValue, from a splitmix64 stream keyed by the
// three; the wide part's weights: zero.
void InitialTableRow(const VariableSpec& var, uint64_t seed, int64_t id, float* out);

// Sparse features (spec.training.model.embeddings / .wide). Each example
// carries `slots` lookup ids per column the model looks up (Batch::
// lookup_ids, in `sparse_inputs` order; -1: missing or out of the
// vocabulary); a table row is looked up per id.
struct SparseInput {
  std::string column;
  int64_t vocab = 0;  // ids in [0, vocab); 0 for a dynamic column
  int slots = 1;      // id values per example (a multi-valued column)
  // A dynamic column: ids are any value >= 0 (DynamicColumnId, core/
  // tabular.h), looked up in dynamic tables.
  bool dynamic = false;
  // A weighted column (a libsvm dataset's features: ids are the indices,
  // weights their values; Batch::lookup_weights): each id's row counts
  // with its weight, as TF's weighted_categorical_column.
  bool weighted = false;
};
// How the rows of an example's ids are combined: their sum, their mean, or
// their sum / sqrt(count) (TF's combiners); no ids give zeros. With weights
// w_i: sum(w_i row_i), divided by sum(w_i) (mean) or sqrt(sum(w_i^2))
// (sqrtn), as TF's safe_embedding_lookup_sparse.
enum class Combiner { kSum, kMean, kSqrtn };
const char* CombinerName(Combiner c);
std::optional<Combiner> CombinerFromName(const std::string& name);
// An embedding table "embedding.<column>" [vocab, dim] whose combined rows
// are deep-tower inputs after the dense features, in this order.
struct EmbeddingSpec {
  std::string column;
  int dim = 0;
  Combiner combiner = Combiner::kMean;
  // Over a dynamic column: at most this many rows (0: no bound); see
  // VariableSpec::max_rows.
  int64_t max_rows = 0;
};
// A crossed column: the ids of 2+ columns hashed together into
// `hash_buckets` ids: FNV-1a 64 over the member ids (each as 8 bytes,
// little-endian, in `columns` order) mod hash_buckets; multi-valued members
// cross every combination.
struct CrossedSpec {
  std::vector<std::string> columns;
  int64_t hash_buckets = 0;
  std::string name() const;  // "a_x_b"
};
// The wide part of a wideAndDeep head: a linear model over sparse columns,
// one weight table "wide.<column>" [vocab, 1] per column and crossed column
// (their ids' weights summed), plus a bias "wide.bias" [1, 1].
struct WideSpec {
  std::vector<std::string> columns;
  std::vector<CrossedSpec> crossed;
  // The bound of each weight table over a dynamic column (0: none).
  int64_t max_rows = 0;
  bool empty() const { return columns.empty() && crossed.empty(); }
};

struct ModelSpec {
  std::string type = "softmax";   // "softmax" | "mlp" (shorthands) | "layers"
  std::vector<int> hidden_units;  // mlp only: sizes of the hidden ReLU layers
  // Dense features per example (the lookup ids are not features; a sparse
  // model may have none).
  int input_dim = 784;
  // Classes of the labels (softmax heads); 2 for sigmoid, ignored for
  // meanSquaredError.
  int num_classes = 10;
  // type "layers" only:
  Shape input_shape;  // empty: [input_dim]
  std::vector<LayerSpec> layers;
  HeadType head = HeadType::kSoftmax;
  // Sparse features (type "layers" only; the job spec fills sparse_inputs
  // from the dataset's columns).
  std::vector<SparseInput> sparse_inputs;
  std::vector<EmbeddingSpec> embeddings;
  WideSpec wide;
};

// The rows one batch looks up in each table (Model::tables() order):
// example e uses ids[offsets[e] .. offsets[e+1]).
struct TableLookup {
  std::vector<int64_t> offsets;
  std::vector<int64_t> ids;
  std::vector<float> weights;  // per id; empty: every weight is 1
  float weight(int64_t i) const { return weights.empty() ? 1.0f : weights[i]; }
};
using SparseBatch = std::vector<TableLookup>;

// Per table (Model::tables() order): distinct global ids.
using TableIds = std::vector<std::vector<int64_t>>;

// Replaces the ids of each table by their positions among its distinct ids
// and returns those distinct ids (sorted), per table: what a worker pulls.
TableIds CompactLookups(SparseBatch* batch);

// One flat row-major buffer per variable, in Model::variables() order.
using Params = std::vector<std::vector<float>>;

// A batch of `size` examples: x is size x input_dim row-major; labels (class
// indices) for classification heads, targets for meanSquaredError.
struct Batch {
  const float* x = nullptr;
  const int32_t* labels = nullptr;
  const float* targets = nullptr;
  int64_t size = 0;
  // Sparse models: size x id_slots() lookup ids (Dataset::lookup_ids).
  const int64_t* lookup_ids = nullptr;
  // Their weights (size x id_slots()), for weighted inputs; null: all 1.
  const float* lookup_weights = nullptr;
  // Lookups of the batch into compact tables (CompactLookups): params of a
  // table then hold only its looked-up rows. Null: the model computes the
  // lookups from lookup_ids, and params hold whole tables (which a model
  // with a dynamic table cannot have: it needs `sparse`).
  const SparseBatch* sparse = nullptr;
};

// Calls into a step as it computes, for a transport that overlaps it
// (worker/ps_client.h, StartPushPull): the values of a variable can arrive
// while earlier layers already compute, its gradient can leave while
// backprop goes on. Either may be empty. Called on the thread that called
// LossAndGradients, never from the pool's threads.
struct LayerHooks {
  // Before the forward pass first reads params[v] (embedding tables, then
  // the layers in order, then the wide part): returns when they are final.
  std::function<void(int variable)> await_params;
  // Right after grads[v] is final and params[v] is read no more in this
  // step, in Model::BackpropOrder(): the layers' from the last to the first
  // (kernel, then bias), then the tables in order, then the wide bias.
  std::function<void(int variable)> gradient_ready;

  void Await(int variable) const {
    if (await_params) await_params(variable);
  }
  void Ready(int variable) const {
    if (gradient_ready) gradient_ready(variable);
  }
};

// Test-set figures per head: softmax accuracy and log loss (and AUC of class
// 1 with two classes); sigmoid accuracy (p >= 0.5), AUC and log loss;
// meanSquaredError RMSE. `loss` is the head's mean loss.
struct EvalMetrics {
  int64_t examples = 0;
  double loss = 0;
  std::optional<double> accuracy;
  std::optional<double> auc;
  std::optional<double> log_loss;
  std::optional<double> rmse;
};

// Area under the ROC curve of `score` for labels 0/1 (Mann-Whitney U, ties
// counted half); 0.5 when one class is absent.
double Auc(const std::vector<double>& score, const std::vector<int32_t>& label);

class Model {
 public:
  // Validates the spec: softmax takes no hidden units, mlp needs at least one,
  // every size > 0; a layer list must infer a shape at every layer and end in
  // what its head needs. Errors on a layer start with "layers[i]: ".
  static absl::StatusOr<Model> Create(const ModelSpec& spec);

  // Computes LossAndGradients, Logits and Evaluate on `threads` threads
  // (the caller's and threads - 1 started here; values < 1 count as 1).
  // Not thread-safe: call before sharing the model.
  void SetThreads(int threads);
  int threads() const { return pool_ ? pool_->threads() : 1; }

  const std::vector<VariableSpec>& variables() const { return variables_; }
  // Whether the model looks up ids (embeddings, the wide part).
  bool sparse() const { return id_slots_ > 0 || !tables_.empty(); }
  // Indices into variables() of the embedding tables, in order.
  const std::vector<int>& tables() const { return tables_; }
  // Whether a table is dynamic (rows created on the PS on first touch):
  // then params can never hold it whole.
  bool has_dynamic_tables() const;
  // The head's input (logits) for the batch's examples (no dropout).
  RowMatrix Logits(const Params& params, const Batch& data) const;
  // The table lookups of `rows` examples (global ids) from their
  // rows x id_slots() lookup ids.
  // rows x id_slots() lookup ids, and their weights (null: all 1; only
  // weighted inputs read them).
  SparseBatch Lookups(const int64_t* lookup_ids, int64_t rows,
                      const float* lookup_weights = nullptr) const;
  const ModelSpec& spec() const { return spec_; }
  // The first layer's input: the deep tower's for a sparse model (dense
  // features, then the combined embeddings).
  const Shape& input_shape() const { return input_shape_; }
  // Floats per example in x (dense features; lookup ids come apart).
  int64_t input_dim() const { return sparse() ? dense_dim_ : NumElements(input_shape_); }
  // Lookup ids per example (Batch::lookup_ids).
  int64_t id_slots() const { return id_slots_; }
  HeadType head() const { return spec_.head; }
  bool has_dropout() const;
  // "mlp 784-256-128-10", "layers [28, 28, 1] conv2d(32,3) maxpool2d(2) ... softmax".
  std::string Summary() const;

  // Deterministic initial value of variable `index` for a given seed.
  std::vector<float> InitialValue(int index, uint64_t seed) const;
  // InitialTableRow of variable `index`.
  void InitialRow(int index, uint64_t seed, int64_t id, float* out) const;
  Params InitialParams(uint64_t seed) const;

  // Mean loss of the head over the batch, with dropout masks drawn from
  // `dropout_seed` (same seed, same masks). Writes d(loss)/d(param) into
  // `grads`, resized to the layout of `params`.
  // REQUIRES: params has the layout of variables(); labels or targets as the
  // head needs.
  float LossAndGradients(const Params& params, const Batch& batch, uint64_t dropout_seed,
                         Params* grads) const;
  // The same, calling `hooks` (null: none) as it goes; the same bits.
  float LossAndGradients(const Params& params, const Batch& batch, uint64_t dropout_seed,
                         Params* grads, const LayerHooks* hooks) const;
  // Every variable once, in the order LossAndGradients finishes their
  // gradients (LayerHooks::gradient_ready).
  std::vector<int> BackpropOrder() const;
  // Classification shorthand of the above (dropout seed 0).
  float LossAndGradients(const Params& params, const float* x, const int32_t* y, int batch,
                         Params* grads) const;

  // The head's figures on n examples (no dropout), computed in blocks.
  // With data.sparse, params hold the compact tables of those lookups.
  EvalMetrics Evaluate(const Params& params, const Batch& data) const;
  // Fraction of the n examples whose argmax prediction equals the label.
  // REQUIRES: not sparse (a sparse model's examples need their lookup ids:
  // Evaluate).
  double Accuracy(const Params& params, const float* x, const int32_t* y, int64_t n) const;

 private:
  // One layer as computed: its spec, shapes and variables (-1: none).
  struct Op {
    LayerSpec layer;
    Shape in, out;
    WindowGeometry window;  // conv2d, pools
    int kernel = -1, bias = -1;
  };
  // What a forward pass keeps for the backward one.
  struct Cache {
    std::vector<RowMatrix> out;  // out[i]: op i's output (after its activation)
    std::vector<RowMatrix> aux;  // conv2d: im2col patches; dropout: scaled mask
    std::vector<std::vector<int32_t>> argmax;
  };
  // Layers that compute image by image (each image's output from its input
  // only): conv2d and the pools.
  static bool PerImage(LayerType t) {
    return t == LayerType::kConv2D || t == LayerType::kMaxPool2D || t == LayerType::kAvgPool2D;
  }

  explicit Model(ModelSpec spec);
  // Logits of examples [start, start + rows) of `data`.
  RowMatrix BlockLogits(const Params& params, const Batch& data, int64_t start, int64_t rows) const;
  // Runs the layers on `rows` examples; returns the head's input.
  // With `cache`, keeps what Backward needs and applies dropout.
  RowMatrix Forward(const Params& params, const float* x, int64_t rows, uint64_t dropout_seed,
                    Cache* cache, const LayerHooks* hooks = nullptr) const;
  // On the pool (core/model_images.cc): the image-by-image layers
  // ops_[first, end) forward from `in`, one job per chunk of images through
  // all of them; their outputs go to `cache` (else the last to *out).
  // Returns the last output's data.
  const float* ForwardImages(const Params& params, const float* in, int batch, size_t first,
                             size_t end, Cache* cache, RowMatrix* out) const;
  // And backward through ops_[first, last] from d = d(loss)/d(op last's
  // output): their gradients into *grads, and d(loss)/d(op first's input)
  // returned if need_input_grad (else an empty matrix).
  RowMatrix BackwardImages(const Params& params, const Cache& cache, int first, int last,
                           bool need_input_grad, RowMatrix d, Params* grads) const;
  // Forward over rows of dense features x: builds the deep tower's input
  // (dense features, then the combined embeddings) into *deep and adds the
  // wide logit. `lookups` index into params of the tables.
  RowMatrix ForwardSparse(const Params& params, const float* x, int64_t rows,
                          const SparseBatch& lookups, uint64_t dropout_seed, Cache* cache,
                          RowMatrix* deep, const LayerHooks* hooks = nullptr) const;
  // d(loss)/d(table rows, wide bias) from d(loss)/d(deep input) and
  // d(loss)/d(logit).
  void SparseBackward(const Params& params, const SparseBatch& lookups, const RowMatrix& d_deep,
                      const RowMatrix& d_logits, Params* grads,
                      const LayerHooks* hooks = nullptr) const;
  // Position in sparse_inputs of a column, -1 if none.
  int SparseInputIndex(const std::string& column) const;

  ModelSpec spec_;
  Shape input_shape_;
  std::vector<Op> ops_;
  std::vector<VariableSpec> variables_;
  std::vector<int> tables_;
  int64_t id_slots_ = 0;   // lookup ids per example
  int64_t dense_dim_ = 0;  // dense features per example
  // Per table (tables_ order): which sparse inputs it reads (crossed: 2+),
  // its embedding (index into spec_.embeddings) or -1 for the wide part.
  struct TableUse {
    std::vector<int> inputs;
    int embedding = -1;
    int64_t buckets = 0;  // crossed: hash buckets (0: not crossed)
  };
  std::vector<TableUse> table_uses_;
  std::vector<int64_t> slot_offset_;  // per sparse input: its first lookup id
  int wide_bias_ = -1;
  // Null for one thread: the kernels then run their single-threaded code.
  std::shared_ptr<ThreadPool> pool_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_MODEL_H_
