// Internal to //core:job_spec (not in its hdrs): the pieces the parser of
// each spec section shares. core/job_spec.h is the public contract; the
// sections live in job_spec_{replicas,model,dataset,optimizer}.cc and the
// document itself (apiVersion, metadata, spec.training) in job_spec.cc.
//
// Every function returns InvalidArgument with the field's path first
// ("spec.training.batchSize: must be in [1, 65536], got 0").
#ifndef KUBETRAIN_CORE_JOB_SPEC_FIELDS_H_
#define KUBETRAIN_CORE_JOB_SPEC_FIELDS_H_

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/job_spec.h"

#define KT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status kt_status_ = (expr);        \
    if (!kt_status_.ok()) return kt_status_; \
  } while (0)

namespace kubetrain {
namespace spec_internal {

// Limits that are not a matter of taste: pod names are
// "<job>-<type>-<index>" and must stay a DNS label (<= 63 characters).
inline constexpr int kMaxNameLength = 48;
inline constexpr int kMaxReplicas = 1000;
inline constexpr int kMaxBatchSize = 65536;
inline constexpr int kMaxHiddenUnits = 65536;
inline constexpr int64_t kMinSplitThresholdBytes = 4096;
inline constexpr int64_t kMinChunkBytes = 4096;
inline constexpr int64_t kMaxChunkBytes = int64_t{64} << 20;

// ---- Messages

absl::Status FieldError(absl::string_view path, absl::string_view what);
// "a.b" (or "b" under the root).
std::string Join(absl::string_view path, absl::string_view key);
// A value in double quotes, escaped and cut at 60 characters.
std::string Quote(absl::string_view s);
// What a node is, for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node);
absl::Status TypeError(absl::string_view path, absl::string_view expected, const YAML::Node& got);
// "; did you mean \"x\"?" for a near miss of one of `known`, else "".
std::string Suggestion(absl::string_view got, const std::vector<std::string>& known);
std::string OneOf(const std::vector<std::string>& allowed);

// The keys of one YAML mapping. Null values count as absent (Kubernetes
// treats `key:` and `key: null` as unset).
class Fields {
 public:
  // Fails if `node` is not a mapping, has a non-string or duplicate key, or
  // (unless `known` is empty) a key outside `known`.
  static absl::Status Read(const YAML::Node& node, const std::string& path,
                           const std::vector<std::string>& known, Fields* out);

  // nullptr if absent or null.
  const YAML::Node* Get(const std::string& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }
  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  std::string PathOf(const std::string& key) const { return Join(path_, key); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, YAML::Node> values_;
};

// ---- Scalars, as Kubernetes reads them: a quoted "2" is a string.

absl::Status ToInt64(const YAML::Node& node, const std::string& path, int64_t* out);
absl::Status ToInt32(const YAML::Node& node, const std::string& path, int* out);
absl::Status ToUint64(const YAML::Node& node, const std::string& path, uint64_t* out);
absl::Status ToDouble(const YAML::Node& node, const std::string& path, double* out);
absl::Status ToBool(const YAML::Node& node, const std::string& path, bool* out);
absl::Status ToString(const YAML::Node& node, const std::string& path, std::string* out);

// Optional-field readers: leave *out (the default) untouched when absent.
absl::Status ReadInt64(const Fields& f, const std::string& key, int64_t* out);
absl::Status ReadInt64(const Fields& f, const std::string& key, std::optional<int64_t>* out);
absl::Status ReadInt32(const Fields& f, const std::string& key, int* out);
absl::Status ReadInt32(const Fields& f, const std::string& key, std::optional<int>* out);
absl::Status ReadDouble(const Fields& f, const std::string& key, double* out);
absl::Status ReadBool(const Fields& f, const std::string& key, bool* out);
absl::Status ReadString(const Fields& f, const std::string& key, std::string* out);
absl::Status ReadStringList(const Fields& f, const std::string& key, std::vector<std::string>* out);
// Reads a nested mapping; `*present` tells whether it was there at all.
absl::Status ReadSection(const Fields& parent, const std::string& key,
                         const std::vector<std::string>& known, Fields* out, bool* present);

// ---- Checks

absl::Status CheckOneOf(const std::string& path, const std::string& value,
                        const std::vector<std::string>& allowed);
absl::Status CheckFinite(const std::string& path, double value);
// A value float32 (where the PS uses it) cannot hold.
absl::Status CheckFloat32(const std::string& path, double value);
bool IsDns1035Label(const std::string& s);
bool IsDns1123Label(const std::string& s);
bool IsDns1123Subdomain(const std::string& s);

template <typename T>
absl::Status CheckAtLeast(const std::string& path, T value, T min) {
  if (value >= min) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be >= ", min, ", got ", value));
}

template <typename T>
absl::Status CheckRange(const std::string& path, T value, T min, T max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be in [", min, ", ", max, "], got ", value));
}

// ---- The sections (one file each)

// job_spec_replicas.cc
absl::Status ParseReplicaSpecs(const YAML::Node& node, const std::string& path,
                               std::map<std::string, ReplicaSpec>* out);
absl::Status ParseRunPolicy(const Fields& spec, RunPolicy* out);
absl::Status ValidateReplicas(const TrainingJob& job);
absl::Status ValidateRunPolicy(const TrainingJob& job);

// job_spec_model.cc
absl::Status ParseModel(const Fields& training, ModelSpec* out,
                        std::optional<OptimizerSpec>* wide_optimizer);
absl::Status ValidateModel(const ModelSpec& model);
absl::Status ValidateMaxRows(const TrainingJob& job);

// job_spec_dataset.cc
const std::vector<std::string>& DatasetKeys();
absl::Status ParseDataset(const Fields& training, TrainingSpec* out);
absl::Status ParseDatasetFields(const Fields& f, TrainingSpec* out);
// The model's input shape, classes and sparse inputs come from the dataset.
absl::Status ConnectModelToDataset(TrainingSpec* t);

// job_spec_optimizer.cc
absl::Status ParseOptimizer(const Fields& parent, OptimizerSpec* out);
absl::Status ValidateOptimizer(const OptimizerSpec& o, const std::string& opath);

}  // namespace spec_internal
}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_JOB_SPEC_FIELDS_H_
