#include "core/model_file.h"

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/framed_file.h"

namespace kubetrain {
namespace {

// A framed file (core/framed_file.h) with this magic and format version.
constexpr std::string_view kMagic = "KTMODEL1";
constexpr uint32_t kFormatVersion = 3;
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
void EncodePayload(const ModelFile& model, const Model& m, BinaryWriter& w) {
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
    w.PutFloats(model.params[i]);
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
  // Streamed from model.params to the file (no copy of the tables in memory).
  return WriteFramedFile(
      path, kMagic, kFormatVersion, [&](BinaryWriter& w) { EncodePayload(model, *m, w); }, env);
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path) {
  uint32_t version = kFormatVersion;
  auto payload = ReadFramedFile(path, kMagic, version, "model file");
  for (uint32_t older : {kFormatVersion2, kFormatVersion1}) {
    if (absl::IsDataLoss(payload.status()) &&
        absl::StrContains(payload.status().message(),
                          absl::StrCat("unsupported model file format version ", older, " "))) {
      version = older;
      payload = ReadFramedFile(path, kMagic, version, "model file");
    }
  }
  if (!payload.ok()) return payload.status();
  ModelFile out;
  std::vector<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  if (absl::Status st = DecodePayload(*payload, version, &out, &names, &shapes); !st.ok()) {
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
  return out;
}

}  // namespace kubetrain
