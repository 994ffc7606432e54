#include "core/model_file.h"

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/framed_file.h"

namespace kubetrain {
namespace {

// A framed file (core/framed_file.h) with this magic and format version.
constexpr std::string_view kMagic = "KTMODEL1";
constexpr uint32_t kFormatVersion = 1;

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
// rows (i64), cols (i64), values (floats).
std::string EncodePayload(const ModelFile& model, const Model& m) {
  BinaryWriter w;
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
  return w.data();
}

// Decodes the fields only; the caller checks them against the spec.
absl::Status DecodePayload(std::string_view payload, ModelFile* out,
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
  return WriteFramedFile(path, kMagic, kFormatVersion, EncodePayload(model, *m), env);
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path) {
  auto payload = ReadFramedFile(path, kMagic, kFormatVersion, "model file");
  if (!payload.ok()) return payload.status();
  ModelFile out;
  std::vector<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  if (absl::Status st = DecodePayload(*payload, &out, &names, &shapes); !st.ok()) {
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
