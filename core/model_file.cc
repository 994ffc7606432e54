#include "core/model_file.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/framed_file.h"

namespace kubetrain {
namespace {

// A framed file (core/framed_file.h) with this magic and format version.
constexpr std::string_view kMagic = "KTMODEL1";
constexpr uint32_t kFormatVersion = 4;
// Per sparse input (version 4): these bits (0 and 1 in files before weighted
// inputs existed, so those read as they did).
constexpr uint32_t kInputDynamic = 1;
constexpr uint32_t kInputWeighted = 2;
constexpr uint32_t kFormatVersion3 = 3;  // no dynamic tables; input_dim counted the lookup ids
constexpr uint32_t kFormatVersion2 = 2;  // no sparse features
constexpr uint32_t kFormatVersion1 = 1;  // softmax/mlp only, no trailer

#define KT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status kt_status_ = (expr);        \
    if (!kt_status_.ok()) return kt_status_; \
  } while (0)

// Checks that `params` has the layout of `model`'s variables; "" if it does.
std::string LayoutMismatch(const Model& model, const std::vector<std::string>& names,
                           const std::vector<std::pair<int64_t, int64_t>>& shapes,
                           const Params& params) {
  const auto& vars = model.variables();
  if (params.size() != vars.size()) {
    return absl::StrCat("the spec has ", vars.size(), " variables, the parameters have ",
                        params.size());
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!names.empty() && names[i] != vars[i].name) {
      return absl::StrCat("variable ", i, " is \"", names[i], "\", the spec expects \"",
                          vars[i].name, "\"");
    }
    if (!shapes.empty() && (shapes[i].first != vars[i].rows || shapes[i].second != vars[i].cols)) {
      return absl::StrCat("variable ", vars[i].name, " has shape [", shapes[i].first, ", ",
                          shapes[i].second, "], the spec expects [", vars[i].rows, ", ",
                          vars[i].cols, "]");
    }
    if (vars[i].dynamic) continue;  // its rows are apart (ModelFile::dynamic_rows / stored_rows)
    if (static_cast<int64_t>(params[i].size()) != vars[i].num_elements()) {
      return absl::StrCat("variable ", vars[i].name, " has ", params[i].size(),
                          " values, the spec expects ", vars[i].num_elements(), " (", vars[i].rows,
                          "x", vars[i].cols, ")");
    }
  }
  return "";
}

// Payload layout, in order: job_name (string), global_step (i64), spec.type
// (string), hidden layer count (u32) and sizes (i32 each), input_dim (i32),
// num_classes (i32), variable count (u32), then per variable: name (string),
// rows (i64), cols (i64), values (floats). Version 2 appends: input shape
// (u32 count, i32 each), layer count (u32) and per layer type, units,
// filters, kernel, stride, same padding, activation (i32 each) and rate
// (u64 bits of a double), head (i32), dataset YAML (string), normalisation
// means and stddevs (floats each). Version 3 appends the sparse features:
// sparse inputs (u32 count; column string, vocab i64, slots i32 each),
// embeddings (u32 count; column string, dim i32, combiner i32 each), wide
// columns (u32 count, strings) and crossed columns (u32 count; per crossed
// column u32 count and column strings, hash buckets i64). Embedding and wide
// tables are variables like the others (every row of a fixed table exists).
// Version 4 appends: the seed (u64), per sparse input its flags (u32:
// kInputDynamic, kInputWeighted), per embedding its maxRows (i64), the wide part's maxRows (i64),
// and for each dynamic table (variable order; its variable above holds no values) its row count
// (u64) and its rows, each an id (u64) and dim floats. Version 3 counted one lookup id per sparse
// input in input_dim and the input shape (DecodePayload takes them off).
void EncodePayload(const ModelFile& model, const Model& m, const std::vector<int64_t>& dynamic_rows,
                   BinaryWriter& w) {
  w.PutString(model.job_name);
  w.PutI64(model.global_step);
  w.PutString(model.spec.type);
  w.PutU32(static_cast<uint32_t>(model.spec.hidden_units.size()));
  for (int h : model.spec.hidden_units) w.PutI32(h);
  w.PutI32(model.spec.input_dim);
  w.PutI32(model.spec.num_classes);
  const auto& vars = m.variables();
  w.PutU32(static_cast<uint32_t>(vars.size()));
  for (size_t i = 0; i < vars.size(); ++i) {
    w.PutString(vars[i].name);
    w.PutI64(vars[i].rows);
    w.PutI64(vars[i].cols);
    w.PutFloats(vars[i].dynamic ? std::vector<float>() : model.params[i]);
  }
  const ModelSpec& spec = model.spec;
  w.PutU32(static_cast<uint32_t>(spec.input_shape.size()));
  for (int d : spec.input_shape) w.PutI32(d);
  w.PutU32(static_cast<uint32_t>(spec.layers.size()));
  for (const LayerSpec& l : spec.layers) {
    for (int v : {static_cast<int>(l.type), l.units, l.filters, l.kernel, l.stride,
                  l.same_padding ? 1 : 0, static_cast<int>(l.activation)}) {
      w.PutI32(v);
    }
    uint64_t bits;
    static_assert(sizeof(bits) == sizeof(l.rate));
    std::memcpy(&bits, &l.rate, sizeof(bits));
    w.PutU64(bits);
  }
  w.PutI32(static_cast<int32_t>(spec.head));
  w.PutString(model.dataset_yaml);
  w.PutFloats(model.norm_mean);
  w.PutFloats(model.norm_std);
  w.PutU32(static_cast<uint32_t>(spec.sparse_inputs.size()));
  for (const SparseInput& in : spec.sparse_inputs) {
    w.PutString(in.column);
    w.PutI64(in.vocab);
    w.PutI32(in.slots);
  }
  w.PutU32(static_cast<uint32_t>(spec.embeddings.size()));
  for (const EmbeddingSpec& e : spec.embeddings) {
    w.PutString(e.column);
    w.PutI32(e.dim);
    w.PutI32(static_cast<int32_t>(e.combiner));
  }
  w.PutU32(static_cast<uint32_t>(spec.wide.columns.size()));
  for (const std::string& c : spec.wide.columns) w.PutString(c);
  w.PutU32(static_cast<uint32_t>(spec.wide.crossed.size()));
  for (const CrossedSpec& c : spec.wide.crossed) {
    w.PutU32(static_cast<uint32_t>(c.columns.size()));
    for (const std::string& col : c.columns) w.PutString(col);
    w.PutI64(c.hash_buckets);
  }
  w.PutU64(model.seed);
  for (const SparseInput& in : spec.sparse_inputs) {
    w.PutU32((in.dynamic ? kInputDynamic : 0) | (in.weighted ? kInputWeighted : 0));
  }
  for (const EmbeddingSpec& e : spec.embeddings) w.PutI64(e.max_rows);
  w.PutI64(spec.wide.max_rows);
  size_t next = 0;  // into dynamic_rows
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].dynamic) continue;
    const int64_t rows = dynamic_rows[next++];
    const uint64_t row_bytes = 8 + 4 * static_cast<uint64_t>(vars[i].cols);
    w.PutU64(static_cast<uint64_t>(rows));
    if (w.counting()) {  // the rows are listed once, when they are written
      w.CountBytes(static_cast<uint64_t>(rows) * row_bytes);
      continue;
    }
    int64_t written = 0;
    absl::Status listed = model.dynamic_rows->ForEachPage(
        static_cast<int>(i), [&](const int64_t* ids, const float* values, int64_t n) {
          for (int64_t k = 0; k < n && written + k < rows; ++k) {
            w.PutU64(static_cast<uint64_t>(ids[k]));
            w.PutRawFloats(values + k * vars[i].cols, static_cast<size_t>(vars[i].cols));
          }
          written += n;
        });
    if (listed.ok() && written != rows) {
      listed = absl::AbortedError(absl::StrCat("table ", vars[i].name, " listed ", written,
                                               " rows, counted ", rows,
                                               " (its rows changed while being written)"));
    }
    if (!listed.ok()) {
      w.Fail(listed);
      return;
    }
  }
}

// Decodes the fields only; the caller checks them against the spec.
absl::Status DecodePayload(std::string_view payload, uint32_t version, ModelFile* out,
                           std::vector<std::string>* names,
                           std::vector<std::pair<int64_t, int64_t>>* shapes) {
  BinaryReader r(payload);
  uint32_t n = 0;
  KT_RETURN_IF_ERROR(r.GetString(&out->job_name));
  KT_RETURN_IF_ERROR(r.GetI64(&out->global_step));
  KT_RETURN_IF_ERROR(r.GetString(&out->spec.type));
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4, "hidden layer sizes"));
  out->spec.hidden_units.resize(n);
  for (int& h : out->spec.hidden_units) {
    int32_t v = 0;
    KT_RETURN_IF_ERROR(r.GetI32(&v));
    h = v;
  }
  int32_t input_dim = 0, num_classes = 0;
  KT_RETURN_IF_ERROR(r.GetI32(&input_dim));
  KT_RETURN_IF_ERROR(r.GetI32(&num_classes));
  out->spec.input_dim = input_dim;
  out->spec.num_classes = num_classes;
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4 + 8 + 8 + 8, "variables"));
  names->resize(n);
  shapes->resize(n);
  out->params.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    KT_RETURN_IF_ERROR(r.GetString(&(*names)[i]));
    KT_RETURN_IF_ERROR(r.GetI64(&(*shapes)[i].first));
    KT_RETURN_IF_ERROR(r.GetI64(&(*shapes)[i].second));
    KT_RETURN_IF_ERROR(r.GetFloats(&out->params[i]));
  }
  if (version == kFormatVersion1) return r.ExpectEnd();
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4, "input shape"));
  out->spec.input_shape.resize(n);
  for (int& d : out->spec.input_shape) {
    int32_t v = 0;
    KT_RETURN_IF_ERROR(r.GetI32(&v));
    d = v;
  }
  KT_RETURN_IF_ERROR(r.GetCount(&n, 7 * 4 + 8, "layers"));
  out->spec.layers.resize(n);
  for (LayerSpec& l : out->spec.layers) {
    int32_t v[7];
    for (int32_t& x : v) KT_RETURN_IF_ERROR(r.GetI32(&x));
    if (v[0] < 0 || v[0] > static_cast<int>(LayerType::kDropout) || v[6] < 0 ||
        v[6] > static_cast<int>(Activation::kSigmoid)) {
      return absl::DataLossError(
          absl::StrCat("unknown layer type ", v[0], " or activation ", v[6]));
    }
    l.type = static_cast<LayerType>(v[0]);
    l.units = v[1];
    l.filters = v[2];
    l.kernel = v[3];
    l.stride = v[4];
    l.same_padding = v[5] != 0;
    l.activation = static_cast<Activation>(v[6]);
    uint64_t bits = 0;
    KT_RETURN_IF_ERROR(r.GetU64(&bits));
    std::memcpy(&l.rate, &bits, sizeof(bits));
  }
  int32_t head = 0;
  KT_RETURN_IF_ERROR(r.GetI32(&head));
  if (head < 0 || head > static_cast<int>(HeadType::kWideAndDeep)) {
    return absl::DataLossError(absl::StrCat("unknown head ", head));
  }
  out->spec.head = static_cast<HeadType>(head);
  KT_RETURN_IF_ERROR(r.GetString(&out->dataset_yaml));
  KT_RETURN_IF_ERROR(r.GetFloats(&out->norm_mean));
  KT_RETURN_IF_ERROR(r.GetFloats(&out->norm_std));
  if (version == kFormatVersion2) return r.ExpectEnd();
  ModelSpec& spec = out->spec;
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4 + 8 + 4, "sparse inputs"));
  spec.sparse_inputs.resize(n);
  for (SparseInput& in : spec.sparse_inputs) {
    int32_t slots = 0;
    KT_RETURN_IF_ERROR(r.GetString(&in.column));
    KT_RETURN_IF_ERROR(r.GetI64(&in.vocab));
    KT_RETURN_IF_ERROR(r.GetI32(&slots));
    in.slots = slots;
  }
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4 + 4 + 4, "embeddings"));
  spec.embeddings.resize(n);
  for (EmbeddingSpec& e : spec.embeddings) {
    int32_t dim = 0, combiner = 0;
    KT_RETURN_IF_ERROR(r.GetString(&e.column));
    KT_RETURN_IF_ERROR(r.GetI32(&dim));
    KT_RETURN_IF_ERROR(r.GetI32(&combiner));
    if (combiner < 0 || combiner > static_cast<int>(Combiner::kSqrtn)) {
      return absl::DataLossError(absl::StrCat("unknown combiner ", combiner));
    }
    e.dim = dim;
    e.combiner = static_cast<Combiner>(combiner);
  }
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4, "wide columns"));
  spec.wide.columns.resize(n);
  for (std::string& c : spec.wide.columns) KT_RETURN_IF_ERROR(r.GetString(&c));
  KT_RETURN_IF_ERROR(r.GetCount(&n, 4 + 8, "crossed columns"));
  spec.wide.crossed.resize(n);
  for (CrossedSpec& c : spec.wide.crossed) {
    uint32_t m = 0;
    KT_RETURN_IF_ERROR(r.GetCount(&m, 4, "crossed column members"));
    c.columns.resize(m);
    for (std::string& col : c.columns) KT_RETURN_IF_ERROR(r.GetString(&col));
    KT_RETURN_IF_ERROR(r.GetI64(&c.hash_buckets));
  }
  if (version == kFormatVersion3) {
    // Version 3 counted the lookup ids as input features.
    int slots = 0;
    for (const SparseInput& in : spec.sparse_inputs) slots += in.slots;
    spec.input_dim -= slots;
    if (!spec.input_shape.empty()) spec.input_shape[0] -= slots;
    return r.ExpectEnd();
  }
  KT_RETURN_IF_ERROR(r.GetU64(&out->seed));
  for (SparseInput& in : spec.sparse_inputs) {
    uint32_t flags = 0;
    KT_RETURN_IF_ERROR(r.GetU32(&flags));
    if ((flags & ~(kInputDynamic | kInputWeighted)) != 0) {
      return absl::DataLossError(
          absl::StrCat("sparse input ", in.column, ": unknown flags ", flags));
    }
    in.dynamic = (flags & kInputDynamic) != 0;
    in.weighted = (flags & kInputWeighted) != 0;
  }
  for (EmbeddingSpec& e : spec.embeddings) KT_RETURN_IF_ERROR(r.GetI64(&e.max_rows));
  KT_RETURN_IF_ERROR(r.GetI64(&spec.wide.max_rows));
  // A variable of 0 rows is a dynamic table (every other has rows).
  for (size_t i = 0; i < shapes->size(); ++i) {
    if ((*shapes)[i].first != 0) continue;
    ModelFile::StoredRows stored;
    stored.variable = static_cast<int>(i);
    uint64_t rows = 0;
    KT_RETURN_IF_ERROR(r.GetU64(&rows));
    const uint64_t row_bytes =
        8 + 4 * static_cast<uint64_t>(std::max<int64_t>(0, (*shapes)[i].second));
    if (rows > r.remaining() / row_bytes) {
      return absl::DataLossError(absl::StrCat("payload ends early at byte ", r.position(),
                                              " (reading ", rows, " rows of ", (*names)[i], ")"));
    }
    stored.rows = static_cast<int64_t>(rows);
    KT_RETURN_IF_ERROR(r.GetBytes(rows * row_bytes, &stored.data, "dynamic table rows"));
    out->stored_rows.push_back(stored);
  }
  return r.ExpectEnd();
}

}  // namespace

absl::Status WriteModelFile(const std::string& path, const ModelFile& model, FileEnv* env) {
  auto m = Model::Create(model.spec);
  if (!m.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": ", m.status().message()));
  }
  if (std::string why = LayoutMismatch(*m, {}, {}, model.params); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": parameters do not match the model: ", why));
  }
  // How many rows each dynamic table has, asked once: the rows themselves are
  // listed only for the writing pass.
  std::vector<int64_t> dynamic_rows;
  for (size_t i = 0; i < m->variables().size(); ++i) {
    if (!m->variables()[i].dynamic) continue;
    if (model.dynamic_rows == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot write ", path, ": no rows given for the dynamic table ", m->variables()[i].name));
    }
    auto rows = model.dynamic_rows->CountRows(static_cast<int>(i));
    if (!rows.ok()) {
      return absl::Status(rows.status().code(),
                          absl::StrCat("cannot write ", path, ": ", rows.status().message()));
    }
    dynamic_rows.push_back(*rows);
  }
  // Streamed from model.params (and the row source) to the file: no copy of
  // the tables in memory.
  return WriteFramedFile(
      path, kMagic, kFormatVersion,
      [&](BinaryWriter& w) { EncodePayload(model, *m, dynamic_rows, w); }, env);
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path) {
  uint32_t version = kFormatVersion;
  auto payload = ReadFramedFile(path, kMagic, version, "model file");
  for (uint32_t older : {kFormatVersion3, kFormatVersion2, kFormatVersion1}) {
    if (absl::IsDataLoss(payload.status()) &&
        absl::StrContains(payload.status().message(),
                          absl::StrCat("unsupported model file format version ", older, " "))) {
      version = older;
      payload = ReadFramedFile(path, kMagic, version, "model file");
    }
  }
  if (!payload.ok()) return payload.status();
  ModelFile out;
  out.payload = std::make_shared<const std::string>(std::move(*payload));
  std::vector<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  if (absl::Status st = DecodePayload(*out.payload, version, &out, &names, &shapes); !st.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: ", st.message()));
  }
  auto m = Model::Create(out.spec);
  if (!m.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": invalid model spec: ", m.status().message()));
  }
  if (std::string why = LayoutMismatch(*m, names, shapes, out.params); !why.empty()) {
    return absl::DataLossError(
        absl::StrCat(path, ": variables do not match the model spec: ", why));
  }
  if (out.global_step < 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": corrupt: negative global step ", out.global_step));
  }
  for (const ModelFile::StoredRows& stored : out.stored_rows) {
    if (!m->variables()[stored.variable].dynamic) {
      return absl::DataLossError(absl::StrCat(path, ": corrupt: variable ", names[stored.variable],
                                              " has no rows but is not a dynamic table"));
    }
  }
  return out;
}

absl::Status ReadDynamicRows(const ModelFile& file, const Model& model, int variable,
                             const std::vector<int64_t>& ids, float* out) {
  const ModelFile::StoredRows* stored = nullptr;
  for (const ModelFile::StoredRows& s : file.stored_rows) {
    if (s.variable == variable) stored = &s;
  }
  if (stored == nullptr || variable < 0 || variable >= static_cast<int>(model.variables().size()) ||
      !model.variables()[variable].dynamic) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", variable, " is not a dynamic table of the model file"));
  }
  const VariableSpec& var = model.variables()[variable];
  const int64_t dim = var.cols;
  absl::flat_hash_map<int64_t, std::vector<size_t>> wanted;  // id -> its positions in ids
  for (size_t i = 0; i < ids.size(); ++i) wanted[ids[i]].push_back(i);
  std::vector<bool> found(ids.size(), false);
  const size_t row_bytes = 8 + 4 * static_cast<size_t>(dim);
  for (int64_t k = 0; k < stored->rows; ++k) {
    BinaryReader r(stored->data.substr(k * row_bytes, row_bytes));
    uint64_t id = 0;
    r.GetU64(&id).IgnoreError();  // cannot fail: ReadModelFile checked the sizes
    auto it = wanted.find(static_cast<int64_t>(id));
    if (it == wanted.end()) continue;
    float* first = out + it->second[0] * dim;
    for (int64_t c = 0; c < dim; ++c) {
      uint32_t bits = 0;
      r.GetU32(&bits).IgnoreError();
      std::memcpy(first + c, &bits, 4);
    }
    for (size_t i : it->second) {
      if (out + i * dim != first) std::copy_n(first, dim, out + i * dim);
      found[i] = true;
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!found[i]) InitialTableRow(var, file.seed, ids[i], out + i * dim);
  }
  return absl::OkStatus();
}

absl::Status KeepTableRows(const Model& model, const TableIds& ids, ModelFile* file) {
  if (ids.size() != model.tables().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for ", ids.size(), " tables, the model has ", model.tables().size()));
  }
  for (size_t t = 0; t < ids.size(); ++t) {
    const int v = model.tables()[t];
    const VariableSpec& var = model.variables()[v];
    std::vector<float> rows(ids[t].size() * var.cols);
    if (var.dynamic) {
      if (absl::Status s = ReadDynamicRows(*file, model, v, ids[t], rows.data()); !s.ok()) return s;
    } else {
      for (size_t i = 0; i < ids[t].size(); ++i) {
        if (ids[t][i] < 0 || ids[t][i] >= var.rows) {
          return absl::InvalidArgumentError(absl::StrCat("table ", var.name, ": id ", ids[t][i],
                                                         " out of range [0, ", var.rows, ")"));
        }
        std::copy_n(file->params[v].begin() + ids[t][i] * var.cols, var.cols,
                    rows.begin() + i * var.cols);
      }
    }
    file->params[v] = std::move(rows);
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
