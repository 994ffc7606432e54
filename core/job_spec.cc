#include "core/job_spec.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/quantity.h"
#include "core/yaml_limits.h"

namespace kubetrain {
namespace {

#define KT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status kt_status_ = (expr);        \
    if (!kt_status_.ok()) return kt_status_; \
  } while (0)

constexpr char kApiVersion[] = "kubetrain.io/v1";
constexpr char kKind[] = "TrainingJob";

// Limits that are not a matter of taste: pod names are
// "<job>-<type>-<index>" and must stay a DNS label (<= 63 characters).
constexpr int kMaxNameLength = 48;
constexpr int kMaxReplicas = 1000;
constexpr int kMaxBatchSize = 65536;
constexpr int kMaxHiddenUnits = 65536;
constexpr int64_t kMinSplitThresholdBytes = 4096;
constexpr int64_t kMinChunkBytes = 4096;
constexpr int64_t kMaxChunkBytes = int64_t{64} << 20;

absl::Status FieldError(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Join(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 60;
  if (s.size() > kMax) return absl::StrCat("\"", absl::CEscape(s.substr(0, kMax)), "...\"");
  return absl::StrCat("\"", absl::CEscape(s), "\"");
}

// What a node is, for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    default:
      return "null";
  }
}

absl::Status TypeError(absl::string_view path, absl::string_view expected, const YAML::Node& got) {
  return FieldError(path, absl::StrCat("expected ", expected, ", got ", Describe(got)));
}

// Levenshtein distance, for "did you mean" hints on typos.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      size_t cost = absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 1]) ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + cost});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string Suggestion(absl::string_view got, const std::vector<std::string>& known) {
  const std::string* best = nullptr;
  // Only near misses: short words are all a couple of edits apart.
  size_t best_distance = std::min<size_t>(2, std::max<size_t>(1, got.size() / 4)) + 1;
  for (const std::string& k : known) {
    size_t d = EditDistance(got, k);
    if (d < best_distance) {
      best_distance = d;
      best = &k;
    }
  }
  return best == nullptr ? "" : absl::StrCat("; did you mean \"", *best, "\"?");
}

// The keys of one YAML mapping. Null values count as absent (Kubernetes
// treats `key:` and `key: null` as unset).
class Fields {
 public:
  // Fails if `node` is not a mapping, has a non-string or duplicate key, or
  // (unless `known` is empty) a key outside `known`.
  static absl::Status Read(const YAML::Node& node, const std::string& path,
                           const std::vector<std::string>& known, Fields* out) {
    out->path_ = path;
    out->values_.clear();
    if (!node.IsMap()) return TypeError(path, "a mapping", node);
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) {
        return FieldError(path, absl::StrCat("keys must be strings, got ", Describe(it->first)));
      }
      const std::string& key = it->first.Scalar();
      if (!seen.insert(key).second) return FieldError(Join(path, key), "duplicate key");
      if (!known.empty() && std::find(known.begin(), known.end(), key) == known.end()) {
        return FieldError(Join(path, key),
                          absl::StrCat("unknown field (known: ", absl::StrJoin(known, ", "), ")",
                                       Suggestion(key, known)));
      }
      if (!it->second.IsNull()) out->values_.emplace(key, it->second);
    }
    return absl::OkStatus();
  }

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

// A quoted scalar ("2") or an explicit !!str is a string, as in Kubernetes:
// numbers and booleans must be written plain.
bool IsString(const YAML::Node& node) {
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

bool IsDecimalInteger(absl::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

absl::Status ToInt64(const YAML::Node& node, const std::string& path, int64_t* out) {
  if (!node.IsScalar() || IsString(node)) return TypeError(path, "an integer", node);
  const std::string& text = node.Scalar();
  if (!IsDecimalInteger(text)) return TypeError(path, "an integer", node);
  if (!absl::SimpleAtoi(text, out))
    return FieldError(path, absl::StrCat("out of range, got ", text));
  return absl::OkStatus();
}

absl::Status ToInt32(const YAML::Node& node, const std::string& path, int* out) {
  int64_t v;
  KT_RETURN_IF_ERROR(ToInt64(node, path, &v));
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return FieldError(path, absl::StrCat("out of range, got ", v));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ToUint64(const YAML::Node& node, const std::string& path, uint64_t* out) {
  if (!node.IsScalar() || IsString(node)) return TypeError(path, "a non-negative integer", node);
  const std::string& text = node.Scalar();
  if (!IsDecimalInteger(text)) return TypeError(path, "a non-negative integer", node);
  if (text[0] == '-') return FieldError(path, absl::StrCat("must be >= 0, got ", text));
  if (!absl::SimpleAtoi(text, out))
    return FieldError(path, absl::StrCat("out of range, got ", text));
  return absl::OkStatus();
}

absl::Status ToDouble(const YAML::Node& node, const std::string& path, double* out) {
  if (!node.IsScalar() || IsString(node)) return TypeError(path, "a number", node);
  std::string text = node.Scalar();
  // YAML's spellings of infinity and NaN; validation decides whether they are
  // allowed.
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == ".inf" || lower == "+.inf") {
    *out = std::numeric_limits<double>::infinity();
    return absl::OkStatus();
  }
  if (lower == "-.inf") {
    *out = -std::numeric_limits<double>::infinity();
    return absl::OkStatus();
  }
  if (lower == ".nan") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return absl::OkStatus();
  }
  // Only plain decimal notation: no "inf", "nan", hex or "1_000".
  bool ok =
      std::any_of(text.begin(), text.end(), absl::ascii_isdigit) &&
      std::all_of(text.begin(), text.end(), [](char c) {
        return absl::ascii_isdigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
      });
  if (!ok || !absl::SimpleAtod(text, out)) return TypeError(path, "a number", node);
  return absl::OkStatus();
}

absl::Status ToBool(const YAML::Node& node, const std::string& path, bool* out) {
  if (node.IsScalar() && !IsString(node)) {
    const std::string& t = node.Scalar();
    if (t == "true" || t == "True" || t == "TRUE") {
      *out = true;
      return absl::OkStatus();
    }
    if (t == "false" || t == "False" || t == "FALSE") {
      *out = false;
      return absl::OkStatus();
    }
  }
  return TypeError(path, "true or false", node);
}

absl::Status ToString(const YAML::Node& node, const std::string& path, std::string* out) {
  if (!node.IsScalar()) return TypeError(path, "a string", node);
  *out = node.Scalar();
  return absl::OkStatus();
}

// Optional-field readers: leave *out (the default) untouched when absent.
absl::Status ReadInt64(const Fields& f, const std::string& key, int64_t* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToInt64(*n, f.PathOf(key), out);
}

absl::Status ReadInt64(const Fields& f, const std::string& key, std::optional<int64_t>* out) {
  const YAML::Node* n = f.Get(key);
  if (n == nullptr) return absl::OkStatus();
  int64_t v;
  KT_RETURN_IF_ERROR(ToInt64(*n, f.PathOf(key), &v));
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadInt32(const Fields& f, const std::string& key, int* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToInt32(*n, f.PathOf(key), out);
}

absl::Status ReadInt32(const Fields& f, const std::string& key, std::optional<int>* out) {
  const YAML::Node* n = f.Get(key);
  if (n == nullptr) return absl::OkStatus();
  int v;
  KT_RETURN_IF_ERROR(ToInt32(*n, f.PathOf(key), &v));
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadDouble(const Fields& f, const std::string& key, double* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToDouble(*n, f.PathOf(key), out);
}

absl::Status ReadBool(const Fields& f, const std::string& key, bool* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToBool(*n, f.PathOf(key), out);
}

absl::Status ReadString(const Fields& f, const std::string& key, std::string* out) {
  const YAML::Node* n = f.Get(key);
  return n == nullptr ? absl::OkStatus() : ToString(*n, f.PathOf(key), out);
}

// Reads a nested mapping; `*present` tells whether it was there at all.
absl::Status ReadSection(const Fields& parent, const std::string& key,
                         const std::vector<std::string>& known, Fields* out, bool* present) {
  const YAML::Node* n = parent.Get(key);
  *present = n != nullptr;
  if (n == nullptr) return absl::OkStatus();
  return Fields::Read(*n, parent.PathOf(key), known, out);
}

std::string OneOf(const std::vector<std::string>& allowed) {
  return absl::StrCat("must be one of ", absl::StrJoin(allowed, ", "));
}

absl::Status CheckOneOf(const std::string& path, const std::string& value,
                        const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return absl::OkStatus();
  return FieldError(
      path, absl::StrCat(OneOf(allowed), ", got ", Quote(value), Suggestion(value, allowed)));
}

absl::Status ParseRestartPolicy(const YAML::Node& node, const std::string& path,
                                RestartPolicy* out) {
  std::string s;
  KT_RETURN_IF_ERROR(ToString(node, path, &s));
  if (auto policy = RestartPolicyFromName(s)) {
    *out = *policy;
    return absl::OkStatus();
  }
  return CheckOneOf(path, s, {"Never", "OnFailure", "Always", "ExitCode"});
}

// TFJob accepts replica types in any case and normalises them.
std::string NormalizeReplicaType(const std::string& key) {
  std::string lower = absl::AsciiStrToLower(key);
  if (lower == "ps") return "PS";
  if (lower == "worker") return "Worker";
  if (lower == "chief") return "Chief";
  if (lower == "evaluator") return "Evaluator";
  return "";
}

absl::Status ParseReplicaSpecs(const YAML::Node& node, const std::string& path,
                               std::map<std::string, ReplicaSpec>* out) {
  if (!node.IsMap()) return TypeError(path, "a mapping", node);
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {
      return FieldError(path, absl::StrCat("keys must be strings, got ", Describe(it->first)));
    }
    const std::string& key = it->first.Scalar();
    std::string type = NormalizeReplicaType(key);
    if (type.empty()) {
      std::string hint = absl::AsciiStrToLower(key) == "master" ? "; use Chief" : "";
      return FieldError(
          Join(path, key),
          absl::StrCat("unknown replica type (known: PS, Worker, Chief, Evaluator)", hint));
    }
    std::string rpath = Join(path, type);
    if (out->count(type) > 0) {
      return FieldError(rpath, "duplicate replica type (keys are case-insensitive)");
    }
    ReplicaSpec spec;
    if (!it->second.IsNull()) {
      Fields f;
      KT_RETURN_IF_ERROR(
          Fields::Read(it->second, rpath, {"replicas", "restartPolicy", "template"}, &f));
      KT_RETURN_IF_ERROR(ReadInt32(f, "replicas", &spec.replicas));
      if (const YAML::Node* n = f.Get("restartPolicy")) {
        KT_RETURN_IF_ERROR(ParseRestartPolicy(*n, f.PathOf("restartPolicy"), &spec.restart_policy));
      }
      if (const YAML::Node* n = f.Get("template")) {
        if (!n->IsMap()) return TypeError(f.PathOf("template"), "a mapping", *n);
        YAML::Emitter emitter;
        emitter << *n;
        if (!emitter.good()) {
          return FieldError(f.PathOf("template"),
                            absl::StrCat("cannot re-emit: ", emitter.GetLastError()));
        }
        spec.template_yaml = emitter.c_str();
        const YAML::Node pod_spec = (*n)["spec"];
        const YAML::Node containers = pod_spec ? pod_spec["containers"] : YAML::Node();
        spec.own_containers = containers && containers.IsSequence() && containers.size() > 0;
        for (size_t i = 0; spec.own_containers && i < containers.size(); ++i) {
          const YAML::Node& c = containers[i];
          const std::string name =
              c.IsMap() && c["name"] && c["name"].IsScalar() ? c["name"].Scalar() : std::string();
          if (IsRuntimeContainer(name, c.IsMap() && c["command"])) spec.own_containers = false;
        }
        // What gang scheduling needs to know of the pods (the rest of the
        // template is the API server's to validate).
        if (pod_spec && pod_spec.IsMap()) {
          const std::string spec_path = Join(f.PathOf("template"), "spec");
          for (auto [key, out] : {std::pair{"schedulerName", &spec.scheduler_name},
                                  std::pair{"priorityClassName", &spec.priority_class_name}}) {
            const YAML::Node v = pod_spec[key];
            if (v && !v.IsNull()) KT_RETURN_IF_ERROR(ToString(v, Join(spec_path, key), out));
          }
        }
      }
    }
    out->emplace(type, std::move(spec));
  }
  return absl::OkStatus();
}

// A resource name as Kubernetes spells one: "cpu", "memory",
// "nvidia.com/gpu", "hugepages-2Mi".
bool IsResourceName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' &&
        c != '/') {
      return false;
    }
  }
  return true;
}

// schedulingPolicy.minResources: resource name -> quantity (a string or a number).
absl::Status ReadMinResources(const Fields& f, std::map<std::string, std::string>* out) {
  const YAML::Node* n = f.Get("minResources");
  if (n == nullptr) return absl::OkStatus();
  Fields resources;
  KT_RETURN_IF_ERROR(Fields::Read(*n, f.PathOf("minResources"), {}, &resources));
  for (auto it = n->begin(); it != n->end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string path = resources.PathOf(name);
    if (!IsResourceName(name)) {
      return FieldError(path, "is not a resource name (e.g. cpu, memory, nvidia.com/gpu)");
    }
    if (!it->second.IsScalar()) return TypeError(path, "a quantity", it->second);
    absl::StatusOr<int64_t> q = ParseQuantityMilli(it->second.Scalar());
    if (!q.ok()) return FieldError(path, std::string(q.status().message()));
    out->emplace(name, it->second.Scalar());
  }
  return absl::OkStatus();
}

// runPolicy.schedulingPolicy: TFJob's fields.
absl::Status ParseSchedulingPolicy(const Fields& run_policy, RunPolicy* out) {
  const YAML::Node* n = run_policy.Get("schedulingPolicy");
  if (n == nullptr) return absl::OkStatus();
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(
      *n, run_policy.PathOf("schedulingPolicy"),
      {"minAvailable", "queue", "priorityClass", "scheduleTimeoutSeconds", "minResources"}, &f));
  SchedulingPolicy& p = out->scheduling_policy.emplace();
  KT_RETURN_IF_ERROR(ReadInt32(f, "minAvailable", &p.min_available));
  KT_RETURN_IF_ERROR(ReadString(f, "queue", &p.queue));
  KT_RETURN_IF_ERROR(ReadString(f, "priorityClass", &p.priority_class));
  KT_RETURN_IF_ERROR(ReadInt32(f, "scheduleTimeoutSeconds", &p.schedule_timeout_seconds));
  KT_RETURN_IF_ERROR(ReadMinResources(f, &p.min_resources));
  return absl::OkStatus();
}

absl::Status ParseRunPolicy(const Fields& spec, RunPolicy* out) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(
      ReadSection(spec, "runPolicy",
                  {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                   "backoffLimit", "suspend", "schedulingPolicy"},
                  &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadString(f, "cleanPodPolicy", &out->clean_pod_policy));
  KT_RETURN_IF_ERROR(ReadInt64(f, "ttlSecondsAfterFinished", &out->ttl_seconds_after_finished));
  KT_RETURN_IF_ERROR(ReadInt64(f, "activeDeadlineSeconds", &out->active_deadline_seconds));
  KT_RETURN_IF_ERROR(ReadInt32(f, "backoffLimit", &out->backoff_limit));
  KT_RETURN_IF_ERROR(ReadBool(f, "suspend", &out->suspend));
  return ParseSchedulingPolicy(f, out);
}

template <typename T>
absl::Status CheckRange(const std::string& path, T value, T min, T max);

// One entry of spec.training.model.layers; fields depend on its type.
absl::Status ParseLayer(const YAML::Node& node, const std::string& path, LayerSpec* out) {
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(node, path, {}, &f));
  std::string type;
  if (!f.Has("type")) return FieldError(path + ".type", "required");
  KT_RETURN_IF_ERROR(ReadString(f, "type", &type));
  const std::vector<std::string> types = {"dense",     "conv2d",  "maxpool2d",
                                          "avgpool2d", "flatten", "dropout"};
  KT_RETURN_IF_ERROR(CheckOneOf(path + ".type", type, types));
  out->type = *LayerTypeFromName(type);
  std::vector<std::string> known = {"type"};
  switch (out->type) {
    case LayerType::kDense:
      known.insert(known.end(), {"units", "activation"});
      break;
    case LayerType::kConv2D:
      known.insert(known.end(), {"filters", "kernel", "stride", "padding", "activation"});
      break;
    case LayerType::kMaxPool2D:
    case LayerType::kAvgPool2D:
      known.insert(known.end(), {"size", "stride"});
      break;
    case LayerType::kFlatten:
      break;
    case LayerType::kDropout:
      known.push_back("rate");
      break;
  }
  KT_RETURN_IF_ERROR(Fields::Read(node, path, known, &f));
  auto required_int = [&](const std::string& key, int* v) -> absl::Status {
    if (!f.Has(key)) return FieldError(f.PathOf(key), absl::StrCat("required for ", type));
    KT_RETURN_IF_ERROR(ReadInt32(f, key, v));
    return CheckRange(f.PathOf(key), *v, 1, kMaxHiddenUnits);
  };
  if (f.Has("activation")) {
    std::string a;
    KT_RETURN_IF_ERROR(ReadString(f, "activation", &a));
    KT_RETURN_IF_ERROR(
        CheckOneOf(f.PathOf("activation"), a, {"relu", "tanh", "sigmoid", "linear"}));
    out->activation = *ActivationFromName(a);
  }
  switch (out->type) {
    case LayerType::kDense:
      return required_int("units", &out->units);
    case LayerType::kConv2D: {
      KT_RETURN_IF_ERROR(required_int("filters", &out->filters));
      KT_RETURN_IF_ERROR(required_int("kernel", &out->kernel));
      out->stride = 1;
      KT_RETURN_IF_ERROR(ReadInt32(f, "stride", &out->stride));
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("stride"), out->stride, 1, kMaxHiddenUnits));
      std::string padding = "valid";
      KT_RETURN_IF_ERROR(ReadString(f, "padding", &padding));
      KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("padding"), padding, {"same", "valid"}));
      out->same_padding = padding == "same";
      return absl::OkStatus();
    }
    case LayerType::kMaxPool2D:
    case LayerType::kAvgPool2D:
      out->kernel = 2;
      KT_RETURN_IF_ERROR(ReadInt32(f, "size", &out->kernel));
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("size"), out->kernel, 1, kMaxHiddenUnits));
      out->stride = out->kernel;
      KT_RETURN_IF_ERROR(ReadInt32(f, "stride", &out->stride));
      return CheckRange(f.PathOf("stride"), out->stride, 1, kMaxHiddenUnits);
    case LayerType::kFlatten:
      return absl::OkStatus();
    case LayerType::kDropout:
      if (!f.Has("rate")) return FieldError(f.PathOf("rate"), "required for dropout");
      KT_RETURN_IF_ERROR(ReadDouble(f, "rate", &out->rate));
      if (!(out->rate >= 0 && out->rate < 1)) {
        return FieldError(f.PathOf("rate"), absl::StrCat("must be in [0, 1), got ", out->rate));
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const Fields& parent, OptimizerSpec* out);
absl::Status ReadStringList(const Fields& f, const std::string& key, std::vector<std::string>* out);

// A table's maxRows (dynamic columns; checked against the column in
// Model::Create and against the batch in ValidateTraining).
absl::Status ReadMaxRows(const Fields& f, int64_t* out) {
  if (!f.Has("maxRows")) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadInt64(f, "maxRows", out));
  if (*out >= 1) return absl::OkStatus();
  return FieldError(f.PathOf("maxRows"), absl::StrCat("must be >= 1, got ", *out));
}

// model.embeddings and model.wide (the columns are checked against the
// dataset in ConnectModelToDataset).
absl::Status ParseSparseFeatures(const Fields& f, ModelSpec* out,
                                 std::optional<OptimizerSpec>* wide_optimizer) {
  if (const YAML::Node* n = f.Get("embeddings")) {
    const std::string path = f.PathOf("embeddings");
    if (!n->IsSequence()) return TypeError(path, "a list of embeddings", *n);
    for (size_t i = 0; i < n->size(); ++i) {
      const std::string epath = absl::StrCat(path, "[", i, "]");
      Fields e;
      KT_RETURN_IF_ERROR(
          Fields::Read((*n)[i], epath, {"column", "dim", "combiner", "maxRows"}, &e));
      EmbeddingSpec emb;
      if (!e.Has("column")) return FieldError(e.PathOf("column"), "required");
      KT_RETURN_IF_ERROR(ReadString(e, "column", &emb.column));
      if (!e.Has("dim")) return FieldError(e.PathOf("dim"), "required");
      KT_RETURN_IF_ERROR(ReadInt32(e, "dim", &emb.dim));
      KT_RETURN_IF_ERROR(CheckRange(e.PathOf("dim"), emb.dim, 1, kMaxHiddenUnits));
      std::string combiner = "mean";
      KT_RETURN_IF_ERROR(ReadString(e, "combiner", &combiner));
      KT_RETURN_IF_ERROR(CheckOneOf(e.PathOf("combiner"), combiner, {"sum", "mean", "sqrtn"}));
      emb.combiner = *CombinerFromName(combiner);
      KT_RETURN_IF_ERROR(ReadMaxRows(e, &emb.max_rows));
      for (const EmbeddingSpec& other : out->embeddings) {
        if (other.column == emb.column) {
          return FieldError(e.PathOf("column"),
                            absl::StrCat("column ", Quote(emb.column), " is embedded twice"));
        }
      }
      out->embeddings.push_back(emb);
    }
  }
  Fields w;
  bool present;
  KT_RETURN_IF_ERROR(
      ReadSection(f, "wide", {"columns", "crossed", "optimizer", "maxRows"}, &w, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadStringList(w, "columns", &out->wide.columns));
  KT_RETURN_IF_ERROR(ReadMaxRows(w, &out->wide.max_rows));
  for (size_t i = 0; i < out->wide.columns.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (out->wide.columns[i] == out->wide.columns[j]) {
        return FieldError(absl::StrCat(w.PathOf("columns"), "[", i, "]"),
                          absl::StrCat("duplicate column ", Quote(out->wide.columns[i])));
      }
    }
  }
  if (const YAML::Node* n = w.Get("crossed")) {
    const std::string path = w.PathOf("crossed");
    if (!n->IsSequence()) return TypeError(path, "a list of crossed columns", *n);
    for (size_t i = 0; i < n->size(); ++i) {
      const std::string cpath = absl::StrCat(path, "[", i, "]");
      Fields c;
      KT_RETURN_IF_ERROR(Fields::Read((*n)[i], cpath, {"columns", "hashBuckets"}, &c));
      CrossedSpec x;
      if (!c.Has("columns")) return FieldError(c.PathOf("columns"), "required");
      KT_RETURN_IF_ERROR(ReadStringList(c, "columns", &x.columns));
      if (x.columns.size() < 2) {
        return FieldError(
            c.PathOf("columns"),
            absl::StrCat("a crossed column needs 2 or more columns, got ", x.columns.size()));
      }
      if (!c.Has("hashBuckets")) return FieldError(c.PathOf("hashBuckets"), "required");
      int64_t buckets = 0;
      KT_RETURN_IF_ERROR(ReadInt64(c, "hashBuckets", &buckets));
      KT_RETURN_IF_ERROR(CheckRange<int64_t>(c.PathOf("hashBuckets"), buckets, 1, 1 << 24));
      x.hash_buckets = buckets;
      out->wide.crossed.push_back(x);
    }
  }
  if (out->wide.empty()) {
    return FieldError(w.path(), "needs columns or crossed (the wide part's sparse columns)");
  }
  if (w.Has("optimizer")) {
    OptimizerSpec opt;
    KT_RETURN_IF_ERROR(ParseOptimizer(w, &opt));
    *wide_optimizer = opt;
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Fields& training, ModelSpec* out,
                        std::optional<OptimizerSpec>* wide_optimizer) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(training, "model",
                                 {"type", "hiddenUnits", "layers", "head", "embeddings", "wide"},
                                 &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadString(f, "type", &out->type));
  if (const YAML::Node* n = f.Get("hiddenUnits")) {
    std::string path = f.PathOf("hiddenUnits");
    if (!n->IsSequence()) return TypeError(path, "a list of integers", *n);
    out->hidden_units.clear();
    for (size_t i = 0; i < n->size(); ++i) {
      int units;
      KT_RETURN_IF_ERROR(ToInt32((*n)[i], absl::StrCat(path, "[", i, "]"), &units));
      out->hidden_units.push_back(units);
    }
  }
  if (const YAML::Node* n = f.Get("layers")) {
    const std::string path = f.PathOf("layers");
    if (f.Has("type") && out->type != "layers") {
      return FieldError(path, absl::StrCat("cannot be set with type ", Quote(out->type),
                                           " (a layer list is type \"layers\"; omit type)"));
    }
    if (!n->IsSequence()) return TypeError(path, "a list of layers", *n);
    if (n->size() == 0) return FieldError(path, "needs at least one layer");
    out->type = "layers";
    out->layers.clear();
    for (size_t i = 0; i < n->size(); ++i) {
      LayerSpec layer;
      KT_RETURN_IF_ERROR(ParseLayer((*n)[i], absl::StrCat(path, "[", i, "]"), &layer));
      out->layers.push_back(layer);
    }
  }
  if (f.Has("head")) {
    std::string head;
    KT_RETURN_IF_ERROR(ReadString(f, "head", &head));
    KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("head"), head,
                                  {"softmax", "sigmoid", "meanSquaredError", "wideAndDeep"}));
    out->head = *HeadTypeFromName(head);
    if (out->type != "layers") {
      return FieldError(f.PathOf("head"), "only applies to a layer list (model.layers)");
    }
  }
  if ((f.Has("embeddings") || f.Has("wide")) && out->type != "layers") {
    return FieldError(f.PathOf(f.Has("embeddings") ? "embeddings" : "wide"),
                      "only applies to a layer list (model.layers)");
  }
  KT_RETURN_IF_ERROR(ParseSparseFeatures(f, out, wide_optimizer));
  if (out->head == HeadType::kWideAndDeep && out->wide.empty()) {
    return FieldError(f.PathOf("wide"), "required for head wideAndDeep");
  }
  if (!out->wide.empty() && out->head != HeadType::kWideAndDeep) {
    return FieldError(f.PathOf("head"), absl::StrCat("must be wideAndDeep with a wide part, got ",
                                                     HeadTypeName(out->head)));
  }
  return absl::OkStatus();
}

absl::Status ReadStringList(const Fields& f, const std::string& key,
                            std::vector<std::string>* out) {
  const YAML::Node* n = f.Get(key);
  if (n == nullptr) return absl::OkStatus();
  const std::string path = f.PathOf(key);
  if (!n->IsSequence()) return TypeError(path, "a list of strings", *n);
  out->clear();
  for (size_t i = 0; i < n->size(); ++i) {
    std::string v;
    KT_RETURN_IF_ERROR(ToString((*n)[i], absl::StrCat(path, "[", i, "]"), &v));
    out->push_back(v);
  }
  return absl::OkStatus();
}

// One entry of spec.training.dataset.columns.
absl::Status ParseColumn(const YAML::Node& node, const std::string& path, ColumnSpec* out) {
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(node, path, {}, &f));
  if (!f.Has("name")) return FieldError(path + ".name", "required");
  KT_RETURN_IF_ERROR(ReadString(f, "name", &out->name));
  if (out->name.empty()) return FieldError(path + ".name", "must not be empty");
  if (!f.Has("type")) return FieldError(path + ".type", "required");
  std::string type;
  KT_RETURN_IF_ERROR(ReadString(f, "type", &type));
  KT_RETURN_IF_ERROR(
      CheckOneOf(path + ".type", type, {"numeric", "categorical", "label", "ignore"}));
  std::vector<std::string> known = {"name", "type"};
  if (type == "numeric") {
    out->type = ColumnType::kNumeric;
    known.insert(known.end(), {"normalize", "missing"});
  } else if (type == "categorical") {
    out->type = ColumnType::kCategorical;
    known.insert(known.end(), {"vocabulary", "hashBuckets", "dynamic", "missing"});
  } else if (type == "label") {
    out->type = ColumnType::kLabel;
    known.insert(known.end(), {"classes", "numClasses"});
  } else {
    out->type = ColumnType::kIgnore;
  }
  KT_RETURN_IF_ERROR(Fields::Read(node, path, known, &f));
  KT_RETURN_IF_ERROR(ReadBool(f, "normalize", &out->normalize));
  if (f.Has("missing")) {
    KT_RETURN_IF_ERROR(ReadString(f, "missing", &out->missing));
    if (out->type == ColumnType::kNumeric) {
      KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("missing"), out->missing, {"mean", "zero", "error"}));
    } else {
      KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("missing"), out->missing, {"zeros", "error"}));
    }
  }
  if (out->type == ColumnType::kCategorical) {
    KT_RETURN_IF_ERROR(ReadStringList(f, "vocabulary", &out->vocabulary));
    KT_RETURN_IF_ERROR(ReadInt32(f, "hashBuckets", &out->hash_buckets));
    KT_RETURN_IF_ERROR(ReadBool(f, "dynamic", &out->dynamic));
    if (f.Has("vocabulary") + f.Has("hashBuckets") + out->dynamic != 1) {
      return FieldError(path,
                        "a categorical column needs exactly one of vocabulary, hashBuckets or "
                        "dynamic: true");
    }
    if (f.Has("hashBuckets")) {
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("hashBuckets"), out->hash_buckets, 1, 1 << 20));
    } else if (f.Has("vocabulary")) {
      if (out->vocabulary.empty()) return FieldError(f.PathOf("vocabulary"), "must not be empty");
      std::set<std::string> seen;
      for (size_t i = 0; i < out->vocabulary.size(); ++i) {
        if (!seen.insert(out->vocabulary[i]).second) {
          return FieldError(absl::StrCat(f.PathOf("vocabulary"), "[", i, "]"),
                            absl::StrCat("duplicate value ", Quote(out->vocabulary[i])));
        }
      }
    }
  }
  if (out->type == ColumnType::kLabel) {
    if (f.Has("classes") && f.Has("numClasses")) {
      return FieldError(f.PathOf("numClasses"), "cannot be set together with classes");
    }
    if (const YAML::Node* n = f.Get("classes")) {
      const std::string cpath = f.PathOf("classes");
      if (n->IsSequence()) {
        for (size_t i = 0; i < n->size(); ++i) {
          std::string v;
          KT_RETURN_IF_ERROR(ToString((*n)[i], absl::StrCat(cpath, "[", i, "]"), &v));
          out->classes.emplace_back(v, static_cast<int>(i));
        }
      } else if (n->IsMap()) {
        for (auto it = n->begin(); it != n->end(); ++it) {
          const std::string key = it->first.Scalar();
          int index;
          KT_RETURN_IF_ERROR(ToInt32(it->second, Join(cpath, key), &index));
          KT_RETURN_IF_ERROR(CheckRange(Join(cpath, key), index, 0, 65535));
          out->classes.emplace_back(key, index);
        }
      } else {
        return TypeError(cpath, "a list of values or a mapping value -> class index", *n);
      }
      std::set<std::string> seen;
      for (const auto& [value, index] : out->classes) {
        if (!seen.insert(value).second) {
          return FieldError(cpath, absl::StrCat("duplicate value ", Quote(value)));
        }
      }
      if (out->classes.size() < 2 && n->IsSequence()) {
        return FieldError(cpath, "needs at least 2 classes");
      }
    }
    if (f.Has("numClasses")) {
      KT_RETURN_IF_ERROR(ReadInt32(f, "numClasses", &out->num_classes));
      KT_RETURN_IF_ERROR(CheckRange(f.PathOf("numClasses"), out->num_classes, 2, 65536));
    }
  }
  return absl::OkStatus();
}

const std::vector<std::string>& DatasetKeys() {
  static const auto* keys = new std::vector<std::string>{
      "name",        "path",      "format",        "trainFiles",    "testPath",     "testFiles",
      "header",      "delimiter", "commentPrefix", "missingValues", "onBadRecord",  "columns",
      "numFeatures", "indexBase", "labels",        "numClasses",    "shuffleBuffer"};
  return *keys;
}

// The formats a dataset key applies to ("" for all).
std::string DatasetKeyFormats(const std::string& key) {
  static const auto* formats =
      new std::map<std::string, std::string>{{"trainFiles", "csv or libsvm"},
                                             {"testPath", "csv or libsvm"},
                                             {"testFiles", "csv or libsvm"},
                                             {"onBadRecord", "csv or libsvm"},
                                             {"header", "csv"},
                                             {"delimiter", "csv"},
                                             {"commentPrefix", "csv"},
                                             {"missingValues", "csv"},
                                             {"columns", "csv"},
                                             {"numFeatures", "libsvm"},
                                             {"indexBase", "libsvm"},
                                             {"labels", "libsvm"},
                                             {"numClasses", "libsvm"}};
  auto it = formats->find(key);
  return it == formats->end() ? "" : it->second;
}

// format libsvm's own fields (core/libsvm.h).
absl::Status ParseLibsvmFields(const Fields& f, TabularSpec* t) {
  t->libsvm = true;
  if (!f.Has("numFeatures")) {
    return FieldError(f.PathOf("numFeatures"),
                      "required for format libsvm (the model's input width: the largest feature "
                      "index, plus 1 with indexBase 0)");
  }
  KT_RETURN_IF_ERROR(ReadInt64(f, "numFeatures", &t->num_features));
  KT_RETURN_IF_ERROR(
      CheckRange(f.PathOf("numFeatures"), t->num_features, int64_t{1}, int64_t{1} << 24));
  KT_RETURN_IF_ERROR(ReadInt32(f, "indexBase", &t->index_base));
  if (t->index_base != 0 && t->index_base != 1) {
    return FieldError(f.PathOf("indexBase"), absl::StrCat("must be 0 or 1, got ", t->index_base));
  }
  std::string labels = "binary";
  KT_RETURN_IF_ERROR(ReadString(f, "labels", &labels));
  KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("labels"), labels, {"binary", "classes", "regression"}));
  t->libsvm_labels = labels == "binary"    ? LibsvmLabels::kBinary
                     : labels == "classes" ? LibsvmLabels::kClasses
                                           : LibsvmLabels::kRegression;
  if (t->libsvm_labels == LibsvmLabels::kClasses) {
    if (!f.Has("numClasses"))
      return FieldError(f.PathOf("numClasses"), "required for labels classes");
    KT_RETURN_IF_ERROR(ReadInt32(f, "numClasses", &t->libsvm_classes));
    KT_RETURN_IF_ERROR(CheckRange(f.PathOf("numClasses"), t->libsvm_classes, 2, 65536));
  } else if (f.Has("numClasses")) {
    return FieldError(f.PathOf("numClasses"),
                      absl::StrCat("only applies to labels classes, but labels is ", labels));
  }
  return absl::OkStatus();
}

// Reads a dataset section already split into fields.
absl::Status ParseDatasetFields(const Fields& f, TrainingSpec* out) {
  KT_RETURN_IF_ERROR(ReadString(f, "format", &out->dataset_format));
  KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("format"), out->dataset_format, {"idx", "csv", "libsvm"}));
  for (const std::string& key : DatasetKeys()) {
    const std::string formats = DatasetKeyFormats(key);
    if (f.Has(key) && !formats.empty() &&
        !absl::StrContains(absl::StrCat(" ", formats, " "),
                           absl::StrCat(" ", out->dataset_format, " "))) {
      return FieldError(f.PathOf(key), absl::StrCat("only applies to format ", formats));
    }
  }
  KT_RETURN_IF_ERROR(ReadInt64(f, "shuffleBuffer", &out->shuffle_buffer));
  KT_RETURN_IF_ERROR(
      CheckRange(f.PathOf("shuffleBuffer"), out->shuffle_buffer, int64_t{1}, int64_t{1} << 26));
  if (out->dataset_format == "idx") {
    KT_RETURN_IF_ERROR(ReadString(f, "name", &out->dataset_name));
    KT_RETURN_IF_ERROR(ReadString(f, "path", &out->dataset_path));
    // The default path holds Fashion-MNIST; another dataset must say where it is.
    if (!f.Has("path") && out->dataset_name != "fashion-mnist") {
      return FieldError(f.PathOf("path"),
                        absl::StrCat("required for dataset ", Quote(out->dataset_name)));
    }
    return absl::OkStatus();
  }
  TabularSpec& t = out->tabular;
  out->dataset_name = "";
  KT_RETURN_IF_ERROR(ReadString(f, "name", &out->dataset_name));
  auto files = [&](const char* one, const char* list, std::vector<std::string>* v,
                   std::string* key) {
    if (f.Has(one) == f.Has(list)) {
      return FieldError(f.PathOf(list),
                        absl::StrCat("format ", out->dataset_format, " needs exactly one of ", one,
                                     " (a file or glob) or ", list));
    }
    *key = f.Has(one) ? one : list;
    if (f.Has(one)) {
      std::string p;
      KT_RETURN_IF_ERROR(ReadString(f, one, &p));
      if (p.empty()) return FieldError(f.PathOf(one), "must not be empty");
      *v = {p};
      return absl::OkStatus();
    }
    KT_RETURN_IF_ERROR(ReadStringList(f, list, v));
    if (v->empty()) return FieldError(f.PathOf(list), "must not be empty");
    for (size_t i = 0; i < v->size(); ++i) {
      if ((*v)[i].empty())
        return FieldError(absl::StrCat(f.PathOf(list), "[", i, "]"), "must not be empty");
    }
    return absl::OkStatus();
  };
  KT_RETURN_IF_ERROR(files("path", "trainFiles", &t.train_files, &t.train_files_key));
  KT_RETURN_IF_ERROR(files("testPath", "testFiles", &t.test_files, &t.test_files_key));
  std::string on_bad = "fail";
  KT_RETURN_IF_ERROR(ReadString(f, "onBadRecord", &on_bad));
  KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("onBadRecord"), on_bad, {"fail", "skip"}));
  t.skip_bad_records = on_bad == "skip";
  if (out->dataset_format == "libsvm") return ParseLibsvmFields(f, &t);
  KT_RETURN_IF_ERROR(ReadBool(f, "header", &t.header));
  if (f.Has("delimiter")) {
    std::string d;
    KT_RETURN_IF_ERROR(ReadString(f, "delimiter", &d));
    if (d.size() != 1 || d == "\"" || d == "\n" || d == "\r") {
      return FieldError(
          f.PathOf("delimiter"),
          absl::StrCat("must be one character (not a quote or newline), got ", Quote(d)));
    }
    t.delimiter = d[0];
  }
  KT_RETURN_IF_ERROR(ReadString(f, "commentPrefix", &t.comment_prefix));
  KT_RETURN_IF_ERROR(ReadStringList(f, "missingValues", &t.missing_values));
  const YAML::Node* cols = f.Get("columns");
  const std::string cpath = f.PathOf("columns");
  if (cols == nullptr) return FieldError(cpath, "required for format csv");
  if (!cols->IsSequence()) return TypeError(cpath, "a list of columns", *cols);
  std::set<std::string> names;
  int labels = 0;
  for (size_t i = 0; i < cols->size(); ++i) {
    ColumnSpec c;
    const std::string path = absl::StrCat(cpath, "[", i, "]");
    KT_RETURN_IF_ERROR(ParseColumn((*cols)[i], path, &c));
    if (!names.insert(c.name).second) {
      return FieldError(path + ".name", absl::StrCat("duplicate column name ", Quote(c.name)));
    }
    if (c.type == ColumnType::kLabel && ++labels > 1) {
      return FieldError(path + ".type", "only one column can be the label");
    }
    t.columns.push_back(std::move(c));
  }
  if (labels == 0) return FieldError(cpath, "needs a column of type label");
  // A dynamic column is an id, never a feature, but an input all the same.
  const int64_t dim = FeatureDim(t);
  const int64_t inputs = dim + std::count_if(t.columns.begin(), t.columns.end(),
                                             [](const ColumnSpec& c) { return c.dynamic; });
  if (inputs < 1 || dim > (int64_t{1} << 24)) {
    return FieldError(
        cpath, absl::StrCat("the columns give ", dim, " features, must be in [1, 16777216]"));
  }
  return absl::OkStatus();
}

absl::Status ParseDataset(const Fields& training, TrainingSpec* out) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(training, "dataset", DatasetKeys(), &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ParseDatasetFields(f, out));
  // Model files record the section, so eval reads data exactly as training did.
  YAML::Emitter emitter;
  emitter << *training.Get("dataset");
  out->dataset_yaml = emitter.good() ? emitter.c_str() : "";
  return absl::OkStatus();
}

// The model's input shape and classes come from the dataset: IDX images are
// [28, 28, 1] with 10 classes.
// CSV records are [features] with the label column's classes.
absl::Status ConnectModelToDataset(TrainingSpec* t) {
  const std::string mpath = "spec.training.model";
  // Every column an embedding or the wide part names must be a categorical
  // column of the dataset; those columns are read as ids.
  std::vector<std::pair<std::string, std::string>> looked_up;  // column, field
  for (size_t i = 0; i < t->model.embeddings.size(); ++i) {
    looked_up.emplace_back(t->model.embeddings[i].column,
                           absl::StrCat(mpath, ".embeddings[", i, "].column"));
  }
  for (size_t i = 0; i < t->model.wide.columns.size(); ++i) {
    looked_up.emplace_back(t->model.wide.columns[i], absl::StrCat(mpath, ".wide.columns[", i, "]"));
  }
  for (size_t i = 0; i < t->model.wide.crossed.size(); ++i) {
    for (size_t j = 0; j < t->model.wide.crossed[i].columns.size(); ++j) {
      looked_up.emplace_back(t->model.wide.crossed[i].columns[j],
                             absl::StrCat(mpath, ".wide.crossed[", i, "].columns[", j, "]"));
    }
  }
  if (!looked_up.empty() && t->dataset_format != "csv") {
    return FieldError(looked_up[0].second, "embeddings and wide need a csv dataset");
  }
  for (const auto& [name, field] : looked_up) {
    auto col = std::find_if(t->tabular.columns.begin(), t->tabular.columns.end(),
                            [&](const ColumnSpec& c) { return c.name == name; });
    if (col == t->tabular.columns.end()) {
      return FieldError(
          field, absl::StrCat("no column ", Quote(name), " in spec.training.dataset.columns"));
    }
    if (col->type != ColumnType::kCategorical) {
      return FieldError(field, absl::StrCat("column ", Quote(name), " is ",
                                            col->type == ColumnType::kNumeric ? "numeric"
                                            : col->type == ColumnType::kLabel ? "the label"
                                                                              : "ignored",
                                            "; embeddings and wide columns must be categorical"));
    }
    col->as_ids = true;
  }
  t->model.sparse_inputs.clear();
  for (size_t i = 0; i < t->tabular.columns.size(); ++i) {
    const ColumnSpec& c = t->tabular.columns[i];
    if (c.dynamic && !c.as_ids) {
      return FieldError(
          absl::StrCat("spec.training.dataset.columns[", i, "].dynamic"),
          absl::StrCat("column ", Quote(c.name),
                       " has no vocabulary to one-hot encode: a dynamic column must be looked up "
                       "by spec.training.model.embeddings or model.wide"));
    }
    if (!c.as_ids) continue;
    SparseInput in{c.name, 0, 1, c.dynamic};
    if (!c.dynamic) {
      in.vocab = c.hash_buckets > 0 ? c.hash_buckets : static_cast<int64_t>(c.vocabulary.size());
    }
    t->model.sparse_inputs.push_back(in);
  }
  if (t->dataset_format != "idx") {
    const int64_t dim = FeatureDim(t->tabular);
    t->model.input_dim = static_cast<int>(dim);
    t->model.input_shape = {static_cast<int>(dim)};
    const int classes = LabelClasses(t->tabular);
    t->model.num_classes = classes;
    const std::string path = "spec.training.model";
    if (classes == 0 && t->model.head != HeadType::kMeanSquaredError) {
      return FieldError(
          t->model.type == "layers" ? path + ".head" : path + ".type",
          absl::StrCat(t->tabular.libsvm ? "the labels are numbers (labels: regression)"
                                         : "the label column is a number (no classes or "
                                           "numClasses)",
                       ": regression needs a layer list with head "
                       "meanSquaredError"));
    }
    if (classes > 0 && t->model.head == HeadType::kMeanSquaredError) {
      return FieldError(path + ".head",
                        t->tabular.libsvm
                            ? "meanSquaredError needs numeric labels (labels: regression)"
                            : "meanSquaredError needs a numeric label (a label column without "
                              "classes or numClasses)");
    }
    return absl::OkStatus();
  }
  if (t->model.type == "layers" && t->model.input_shape.empty()) {
    t->model.input_shape = {28, 28, 1};
  }
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const Fields& training, OptimizerSpec* out) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(training, "optimizer",
                                 {"type", "learningRate", "momentum", "nesterov", "beta1", "beta2",
                                  "epsilon", "initialAccumulator", "l1", "l2", "learningRatePower"},
                                 &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadString(f, "type", &out->type));
  KT_RETURN_IF_ERROR(
      CheckOneOf(f.PathOf("type"), out->type, {"sgd", "momentum", "adam", "adagrad", "ftrl"}));
  // A hyperparameter of another optimizer is a mistake (e.g. `type: sgd` with
  // `momentum: 0.9` would silently train without momentum).
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kAppliesTo = {
      {"momentum", {"momentum"}},
      {"nesterov", {"momentum"}},
      {"beta1", {"adam"}},
      {"beta2", {"adam"}},
      {"epsilon", {"adam", "adagrad"}},
      {"initialAccumulator", {"adagrad", "ftrl"}},
      {"l1", {"ftrl"}},
      {"l2", {"ftrl"}},
      {"learningRatePower", {"ftrl"}}};
  for (const auto& [key, types] : kAppliesTo) {
    if (f.Has(key) && std::find(types.begin(), types.end(), out->type) == types.end()) {
      return FieldError(f.PathOf(key),
                        absl::StrCat("only applies to type ", absl::StrJoin(types, " or "),
                                     ", but type is ", out->type));
    }
  }
  KT_RETURN_IF_ERROR(ReadDouble(f, "learningRate", &out->learning_rate));
  KT_RETURN_IF_ERROR(ReadDouble(f, "momentum", &out->momentum));
  KT_RETURN_IF_ERROR(ReadBool(f, "nesterov", &out->nesterov));
  KT_RETURN_IF_ERROR(ReadDouble(f, "beta1", &out->beta1));
  KT_RETURN_IF_ERROR(ReadDouble(f, "beta2", &out->beta2));
  KT_RETURN_IF_ERROR(ReadDouble(f, "epsilon", &out->epsilon));
  KT_RETURN_IF_ERROR(ReadDouble(f, "initialAccumulator", &out->initial_accumulator));
  KT_RETURN_IF_ERROR(ReadDouble(f, "l1", &out->l1));
  KT_RETURN_IF_ERROR(ReadDouble(f, "l2", &out->l2));
  KT_RETURN_IF_ERROR(ReadDouble(f, "learningRatePower", &out->learning_rate_power));
  return absl::OkStatus();
}

absl::Status ParseTraining(const Fields& spec, TrainingSpec* out) {
  const YAML::Node* node = spec.Get("training");
  if (node == nullptr) return FieldError(spec.PathOf("training"), "required");  // see ParseDocument
  Fields f;
  KT_RETURN_IF_ERROR(
      Fields::Read(*node, spec.PathOf("training"),
                   {"mode", "replicasToAggregate", "maxStaleness", "model", "dataset", "optimizer",
                    "batchSize", "steps", "epochs", "seed", "evaluation", "checkpoint", "placement",
                    "transport", "startupTimeoutSeconds", "barrierTimeoutSeconds"},
                   &f));
  if (const YAML::Node* n = f.Get("mode")) {
    std::string mode;
    KT_RETURN_IF_ERROR(ToString(*n, f.PathOf("mode"), &mode));
    KT_RETURN_IF_ERROR(CheckOneOf(f.PathOf("mode"), mode, {"sync", "async"}));
    out->mode = mode == "sync" ? TrainingMode::kSync : TrainingMode::kAsync;
  }
  if (const YAML::Node* n = f.Get("replicasToAggregate")) {
    std::string path = f.PathOf("replicasToAggregate");
    KT_RETURN_IF_ERROR(ToInt32(*n, path, &out->replicas_to_aggregate));
    // 0 in the struct means "all workers"; written out it must be a real count.
    if (out->replicas_to_aggregate < 1) {
      return FieldError(path, absl::StrCat("must be >= 1, got ", out->replicas_to_aggregate));
    }
  }
  KT_RETURN_IF_ERROR(ReadInt64(f, "maxStaleness", &out->max_staleness));
  KT_RETURN_IF_ERROR(ParseModel(f, &out->model, &out->wide_optimizer));
  KT_RETURN_IF_ERROR(ParseDataset(f, out));
  KT_RETURN_IF_ERROR(ConnectModelToDataset(out));
  KT_RETURN_IF_ERROR(ParseOptimizer(f, &out->optimizer));
  KT_RETURN_IF_ERROR(ReadInt32(f, "batchSize", &out->batch_size));
  KT_RETURN_IF_ERROR(ReadInt64(f, "steps", &out->steps));
  if (const YAML::Node* n = f.Get("epochs")) {
    double epochs;
    KT_RETURN_IF_ERROR(ToDouble(*n, f.PathOf("epochs"), &epochs));
    out->epochs = epochs;
  }
  if (const YAML::Node* n = f.Get("seed")) {
    KT_RETURN_IF_ERROR(ToUint64(*n, f.PathOf("seed"), &out->seed));
  }

  Fields section;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(f, "evaluation", {"everySteps"}, &section, &present));
  if (present) KT_RETURN_IF_ERROR(ReadInt64(section, "everySteps", &out->eval_every_steps));
  KT_RETURN_IF_ERROR(ReadSection(f, "checkpoint", {"directory", "everySteps", "everySeconds"},
                                 &section, &present));
  if (present) {
    KT_RETURN_IF_ERROR(ReadString(section, "directory", &out->checkpoint_dir));
    KT_RETURN_IF_ERROR(ReadInt64(section, "everySteps", &out->checkpoint_every_steps));
    KT_RETURN_IF_ERROR(ReadInt64(section, "everySeconds", &out->checkpoint_every_seconds));
  }
  KT_RETURN_IF_ERROR(ReadSection(f, "placement", {"splitThresholdBytes"}, &section, &present));
  if (present)
    KT_RETURN_IF_ERROR(ReadInt64(section, "splitThresholdBytes", &out->split_threshold_bytes));
  KT_RETURN_IF_ERROR(ReadSection(f, "transport", {"chunkBytes"}, &section, &present));
  if (present) KT_RETURN_IF_ERROR(ReadInt64(section, "chunkBytes", &out->chunk_bytes));
  KT_RETURN_IF_ERROR(ReadInt64(f, "startupTimeoutSeconds", &out->startup_timeout_seconds));
  KT_RETURN_IF_ERROR(ReadDouble(f, "barrierTimeoutSeconds", &out->barrier_timeout_seconds));
  return absl::OkStatus();
}

absl::Status ParseDocument(const YAML::Node& root, TrainingJob* job) {
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a TrainingJob mapping at the top level, got ", Describe(root)));
  }
  Fields top;
  KT_RETURN_IF_ERROR(
      Fields::Read(root, "", {"apiVersion", "kind", "metadata", "spec", "status"}, &top));

  std::string api_version, kind;
  if (!top.Has("apiVersion")) return FieldError("apiVersion", "required");
  KT_RETURN_IF_ERROR(ReadString(top, "apiVersion", &api_version));
  if (api_version != kApiVersion) {
    return FieldError("apiVersion",
                      absl::StrCat("must be \"", kApiVersion, "\", got ", Quote(api_version)));
  }
  if (!top.Has("kind")) return FieldError("kind", "required");
  KT_RETURN_IF_ERROR(ReadString(top, "kind", &kind));
  if (kind != kKind) {
    return FieldError("kind", absl::StrCat("must be \"", kKind, "\", got ", Quote(kind)));
  }

  // metadata: only name and namespace matter; labels etc. are the operator's.
  const YAML::Node* metadata_node = top.Get("metadata");
  if (metadata_node == nullptr) return FieldError("metadata", "required");
  Fields metadata;
  KT_RETURN_IF_ERROR(Fields::Read(*metadata_node, "metadata", {}, &metadata));
  if (!metadata.Has("name")) return FieldError("metadata.name", "required");
  KT_RETURN_IF_ERROR(ReadString(metadata, "name", &job->name));
  KT_RETURN_IF_ERROR(ReadString(metadata, "namespace", &job->namespace_));

  const YAML::Node* spec_node = top.Get("spec");
  if (spec_node == nullptr) return FieldError("spec", "required");
  Fields spec;
  KT_RETURN_IF_ERROR(Fields::Read(
      *spec_node, "spec", {"replicaSpecs", "runPolicy", "successPolicy", "training"}, &spec));
  const YAML::Node* replicas = spec.Get("replicaSpecs");
  if (replicas == nullptr) return FieldError("spec.replicaSpecs", "required");
  KT_RETURN_IF_ERROR(ParseReplicaSpecs(*replicas, "spec.replicaSpecs", &job->replica_specs));
  KT_RETURN_IF_ERROR(ParseRunPolicy(spec, &job->run_policy));
  KT_RETURN_IF_ERROR(ReadString(spec, "successPolicy", &job->success_policy));
  job->has_training = spec.Has("training");
  if (job->has_training) {
    KT_RETURN_IF_ERROR(ParseTraining(spec, &job->training));
  } else {
    for (const auto& [type, replica] : job->replica_specs) {
      if (!replica.own_containers) {
        return FieldError(
            "spec.training",
            absl::StrCat("required (spec.replicaSpecs.", type,
                         ".template names no containers of its own or a `kubetrain` container "
                         "without a command, so it runs kubetrain's runtime, which trains what "
                         "spec.training says)"));
      }
    }
  }

  return ValidateTrainingJob(*job);
}

// DNS-1035 label: [a-z]([-a-z0-9]*[a-z0-9])?
bool IsDns1035Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (!absl::ascii_islower(s.front())) return false;
  if (s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
  });
}

// DNS-1123 label (namespaces): [a-z0-9]([-a-z0-9]*[a-z0-9])?
bool IsDns1123Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
  });
}

// DNS-1123 subdomain (PriorityClass names, Volcano queues): labels joined by dots.
bool IsDns1123Subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(s, '.')) {
    if (!IsDns1123Label(std::string(label))) return false;
  }
  return true;
}

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

absl::Status CheckFinite(const std::string& path, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be a finite number, got ", value));
}

// Hyper-parameters are doubles in the spec but float32 where the PS uses
// them: a value float32 cannot hold (1e39 -> inf, 1e-50 -> 0) must be refused
// here, naming the field, not found by the optimizer at step 2.
absl::Status CheckFloat32(const std::string& path, double value) {
  const double magnitude = std::fabs(value);
  if (magnitude > std::numeric_limits<float>::max()) {
    return FieldError(path, absl::StrCat("must be at most ", std::numeric_limits<float>::max(),
                                         " in magnitude (it is used as a float32), got ", value));
  }
  if (value != 0 && magnitude < std::numeric_limits<float>::min()) {
    return FieldError(path,
                      absl::StrCat("must be 0 or at least ", std::numeric_limits<float>::min(),
                                   " in magnitude (it is used as a float32, where ", value,
                                   " would be 0 or denormal), got ", value));
  }
  return absl::OkStatus();
}

absl::Status ValidateReplicas(const TrainingJob& job) {
  static const std::vector<std::string> kTypes = {"PS", "Worker", "Chief", "Evaluator"};
  for (const auto& [type, spec] : job.replica_specs) {
    std::string path = Join("spec.replicaSpecs", type);
    if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
      return FieldError(path, "unknown replica type (known: PS, Worker, Chief, Evaluator)");
    }
    std::string rpath = Join(path, "replicas");
    if (type == "PS" || type == "Worker") {
      KT_RETURN_IF_ERROR(CheckRange(rpath, spec.replicas, 1, kMaxReplicas));
    } else if (spec.replicas != 1) {
      return FieldError(rpath, absl::StrCat("must be 1, got ", spec.replicas));
    }
  }
  for (const char* required : {"PS", "Worker"}) {
    if (job.replica_specs.count(required) == 0) {
      return FieldError(Join("spec.replicaSpecs", required), "required");
    }
  }
  return absl::OkStatus();
}

// Gang scheduling: the pods must go to one gang scheduler, named by the
// templates (those that name none get it), and each field must be one that
// scheduler's PodGroup has, rather than be ignored.
absl::Status ValidateSchedulingPolicy(const TrainingJob& job) {
  const std::string path = "spec.runPolicy.schedulingPolicy";
  const SchedulingPolicy& p = *job.run_policy.scheduling_policy;
  std::string name, named_by;
  for (const auto& [type, replica] : job.replica_specs) {
    if (replica.scheduler_name.empty()) continue;
    const std::string where =
        absl::StrCat("spec.replicaSpecs.", type, ".template.spec.schedulerName");
    if (!name.empty() && replica.scheduler_name != name) {
      return FieldError(where, absl::StrCat("must be the same in every replica with ", path,
                                            " (one gang scheduler places all tasks), got ",
                                            Quote(replica.scheduler_name), " and ", Quote(name),
                                            " in ", named_by));
    }
    name = replica.scheduler_name;
    named_by = where;
  }
  if (name.empty()) {
    return FieldError(path,
                      "gang scheduling needs the gang scheduler's name: set schedulerName in a "
                      "replica's template.spec (\"volcano\" for Volcano; for scheduler-plugins "
                      "the name its scheduler runs as, e.g. \"scheduler-plugins-scheduler\")");
  }
  const GangScheduler scheduler = GangSchedulerOf(name);
  if (p.min_available.has_value()) {
    KT_RETURN_IF_ERROR(CheckRange(path + ".minAvailable", *p.min_available, 1, job.num_tasks()));
  }
  if (!p.queue.empty()) {
    if (scheduler != GangScheduler::kVolcano) {
      return FieldError(
          path + ".queue",
          absl::StrCat("only Volcano has queues (schedulerName: volcano); the "
                       "pods' scheduler ",
                       Quote(name), " reads scheduler-plugins' PodGroup, which has none"));
    }
    if (!IsDns1123Subdomain(p.queue)) {
      return FieldError(path + ".queue",
                        absl::StrCat("must be a DNS-1123 subdomain, got ", Quote(p.queue)));
    }
  }
  if (!p.priority_class.empty() && !IsDns1123Subdomain(p.priority_class)) {
    return FieldError(path + ".priorityClass",
                      absl::StrCat("must be a DNS-1123 subdomain, got ", Quote(p.priority_class)));
  }
  if (p.schedule_timeout_seconds.has_value()) {
    if (scheduler != GangScheduler::kSchedulerPlugins) {
      return FieldError(path + ".scheduleTimeoutSeconds",
                        "only scheduler-plugins' PodGroup has it; Volcano's has no timeout");
    }
    KT_RETURN_IF_ERROR(
        CheckAtLeast(path + ".scheduleTimeoutSeconds", *p.schedule_timeout_seconds, 1));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const ModelSpec& model) {
  const std::string path = "spec.training.model";
  KT_RETURN_IF_ERROR(CheckOneOf(path + ".type", model.type, {"softmax", "mlp", "layers"}));
  const std::string units_path = path + ".hiddenUnits";
  if (model.type == "softmax" && !model.hidden_units.empty()) {
    return FieldError(units_path, "must be empty for type softmax (a single 784 -> 10 layer)");
  }
  if (model.type == "mlp" && model.hidden_units.empty()) {
    return FieldError(units_path, "required for type mlp (at least one hidden layer)");
  }
  if (model.type == "layers" && !model.hidden_units.empty()) {
    return FieldError(units_path, "only applies to type mlp (use dense layers in model.layers)");
  }
  if (model.type == "layers" && model.layers.empty()) {
    return FieldError(path + ".layers", "required for type layers");
  }
  for (size_t i = 0; i < model.hidden_units.size(); ++i) {
    KT_RETURN_IF_ERROR(CheckRange(absl::StrCat(units_path, "[", i, "]"), model.hidden_units[i], 1,
                                  kMaxHiddenUnits));
  }
  // The model library is the authority on what it can build; its errors on
  // a layer start with "layers[i]: " and become that field's path.
  absl::StatusOr<Model> created = Model::Create(model);
  if (!created.ok()) {
    const absl::string_view message = created.status().message();
    if (absl::StartsWith(message, "layers") || absl::StartsWith(message, "embeddings[") ||
        absl::StartsWith(message, "wide")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".", message));
    }
    return FieldError(path, message);
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const OptimizerSpec& o, const std::string& opath) {
  KT_RETURN_IF_ERROR(
      CheckOneOf(opath + ".type", o.type, {"sgd", "momentum", "adam", "adagrad", "ftrl"}));
  KT_RETURN_IF_ERROR(CheckFinite(opath + ".learningRate", o.learning_rate));
  if (!(o.learning_rate > 0)) {
    return FieldError(opath + ".learningRate", absl::StrCat("must be > 0, got ", o.learning_rate));
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"momentum", o.momentum},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2}}) {
    if (!(value >= 0 && value < 1)) {
      return FieldError(opath + "." + name, absl::StrCat("must be in [0, 1), got ", value));
    }
  }
  KT_RETURN_IF_ERROR(CheckFinite(opath + ".epsilon", o.epsilon));
  if (!(o.epsilon > 0)) {
    return FieldError(opath + ".epsilon", absl::StrCat("must be > 0, got ", o.epsilon));
  }
  KT_RETURN_IF_ERROR(CheckFinite(opath + ".initialAccumulator", o.initial_accumulator));
  KT_RETURN_IF_ERROR(CheckAtLeast(opath + ".initialAccumulator", o.initial_accumulator, 0.0));
  for (const auto& [name, value] : {std::pair<const char*, double>{"learningRate", o.learning_rate},
                                    {"momentum", o.momentum},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2},
                                    {"epsilon", o.epsilon},
                                    {"initialAccumulator", o.initial_accumulator}}) {
    KT_RETURN_IF_ERROR(CheckFloat32(opath + "." + name, value));
  }
  // A decay that rounds to 1 in float32 never decays (and adam divides by 1 - beta^t).
  for (const auto& [name, value] : {std::pair<const char*, double>{"momentum", o.momentum},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2}}) {
    if (!(static_cast<float>(value) < 1.0f)) {
      return FieldError(opath + "." + name,
                        absl::StrCat("must be < 1 as a float32 (", ShortestDouble(value),
                                     " rounds to 1), got ", ShortestDouble(value)));
    }
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"l1", o.l1}, {"l2", o.l2}}) {
    KT_RETURN_IF_ERROR(CheckFinite(opath + "." + name, value));
    KT_RETURN_IF_ERROR(CheckAtLeast(opath + "." + name, value, 0.0));
  }
  // TF's learning_rate_power: <= 0 (0 is a fixed learning rate; a positive
  // power would make the per-coordinate rate grow with the gradients).
  const std::string power = opath + ".learningRatePower";
  KT_RETURN_IF_ERROR(CheckFinite(power, o.learning_rate_power));
  if (!(o.learning_rate_power <= 0)) {
    return FieldError(power, absl::StrCat("must be <= 0, got ", o.learning_rate_power));
  }
  KT_RETURN_IF_ERROR(CheckFloat32(power, o.learning_rate_power));
  return absl::OkStatus();
}

// A dynamic table's bound per PS task, ceil(maxRows / PS tasks), must hold
// the distinct ids one batch can look up in it: they may all live on one
// task, and a bound below them would evict rows of the very step that
// uses them.
absl::Status ValidateMaxRows(const TrainingJob& job) {
  const TrainingSpec& t = job.training;
  const int num_ps = std::max(1, job.num_ps());
  auto check = [&](const std::string& column, int64_t max_rows,
                   const std::string& field) -> absl::Status {
    if (max_rows <= 0) return absl::OkStatus();
    for (const SparseInput& in : t.model.sparse_inputs) {
      if (in.column != column || !in.dynamic) continue;
      const int64_t batch_ids = int64_t{t.batch_size} * in.slots;
      const int64_t per_task = (max_rows + num_ps - 1) / num_ps;
      if (per_task >= batch_ids) return absl::OkStatus();
      return FieldError(
          field,
          absl::StrCat(max_rows, " rows over ", num_ps, " PS task", num_ps > 1 ? "s" : "",
                       " is at most ", per_task, " per task, fewer than the ", batch_ids,
                       " distinct ids one batch can look up in it (batchSize ", t.batch_size, " x ",
                       in.slots, " per example), which may all live on one task; use at least ",
                       (batch_ids - 1) * num_ps + 1, " or a smaller batchSize"));
    }
    return absl::OkStatus();
  };
  const std::string path = "spec.training.model";
  for (size_t i = 0; i < t.model.embeddings.size(); ++i) {
    KT_RETURN_IF_ERROR(check(t.model.embeddings[i].column, t.model.embeddings[i].max_rows,
                             absl::StrCat(path, ".embeddings[", i, "].maxRows")));
  }
  for (const std::string& column : t.model.wide.columns) {
    KT_RETURN_IF_ERROR(check(column, t.model.wide.max_rows, path + ".wide.maxRows"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTraining(const TrainingJob& job) {
  const TrainingSpec& t = job.training;
  const std::string path = "spec.training";
  const int workers = job.num_workers();
  if (t.mode == TrainingMode::kSync) {
    if (t.replicas_to_aggregate < 0 || t.replicas_to_aggregate > workers) {
      return FieldError(
          path + ".replicasToAggregate",
          absl::StrCat("must be in [1, ", workers, "] (the number of Worker replicas), got ",
                       t.replicas_to_aggregate));
    }
    if (t.max_staleness.has_value()) {
      return FieldError(path + ".maxStaleness", "only applies to mode async");
    }
  } else {
    if (t.replicas_to_aggregate != 0) {
      return FieldError(path + ".replicasToAggregate", "only applies to mode sync");
    }
    if (t.max_staleness.has_value()) {
      KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>(path + ".maxStaleness", *t.max_staleness, 0));
    }
    // In async mode the timeout only decides when a silent worker stops
    // holding others back, which matters only under a staleness bound.
    if (t.barrier_timeout_seconds != 0 && !t.max_staleness.has_value()) {
      return FieldError(path + ".barrierTimeoutSeconds",
                        "applies to mode sync, or to async with maxStaleness");
    }
  }

  KT_RETURN_IF_ERROR(ValidateModel(t.model));

  if (t.dataset_format == "idx") {
    KT_RETURN_IF_ERROR(
        CheckOneOf(path + ".dataset.name", t.dataset_name, {"fashion-mnist", "mnist"}));
    if (t.dataset_path.empty()) return FieldError(path + ".dataset.path", "must not be empty");
  }

  KT_RETURN_IF_ERROR(ValidateOptimizer(t.optimizer, path + ".optimizer"));
  if (t.wide_optimizer.has_value()) {
    KT_RETURN_IF_ERROR(ValidateOptimizer(*t.wide_optimizer, path + ".model.wide.optimizer"));
  }

  KT_RETURN_IF_ERROR(CheckRange(path + ".batchSize", t.batch_size, 1, kMaxBatchSize));
  KT_RETURN_IF_ERROR(ValidateMaxRows(job));
  if (t.steps.has_value() && t.epochs.has_value()) {
    return FieldError(path + ".epochs", "cannot be set together with steps (set exactly one)");
  }
  if (!t.steps.has_value() && !t.epochs.has_value()) {
    return FieldError(path, "one of steps or epochs is required");
  }
  if (t.steps.has_value()) KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>(path + ".steps", *t.steps, 1));
  if (t.epochs.has_value()) {
    KT_RETURN_IF_ERROR(CheckFinite(path + ".epochs", *t.epochs));
    if (!(*t.epochs > 0)) {
      return FieldError(path + ".epochs", absl::StrCat("must be > 0, got ", *t.epochs));
    }
  }

  KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>(path + ".evaluation.everySteps", t.eval_every_steps, 0));
  KT_RETURN_IF_ERROR(
      CheckAtLeast<int64_t>(path + ".checkpoint.everySteps", t.checkpoint_every_steps, 0));
  KT_RETURN_IF_ERROR(
      CheckAtLeast<int64_t>(path + ".checkpoint.everySeconds", t.checkpoint_every_seconds, 0));
  if (t.checkpoint_dir.empty() &&
      (t.checkpoint_every_steps > 0 || t.checkpoint_every_seconds > 0)) {
    return FieldError(path + ".checkpoint.directory",
                      "required when everySteps or everySeconds is set");
  }
  KT_RETURN_IF_ERROR(CheckAtLeast(path + ".placement.splitThresholdBytes", t.split_threshold_bytes,
                                  kMinSplitThresholdBytes));
  KT_RETURN_IF_ERROR(
      CheckRange(path + ".transport.chunkBytes", t.chunk_bytes, kMinChunkBytes, kMaxChunkBytes));
  KT_RETURN_IF_ERROR(
      CheckAtLeast<int64_t>(path + ".startupTimeoutSeconds", t.startup_timeout_seconds, 1));
  KT_RETURN_IF_ERROR(CheckFinite(path + ".barrierTimeoutSeconds", t.barrier_timeout_seconds));
  KT_RETURN_IF_ERROR(CheckAtLeast(path + ".barrierTimeoutSeconds", t.barrier_timeout_seconds, 0.0));
  return absl::OkStatus();
}

}  // namespace

std::string ShortestDouble(double value) {
  for (int digits = 6; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

int TrainingJob::num_ps() const {
  auto it = replica_specs.find("PS");
  return it == replica_specs.end() ? 0 : it->second.replicas;
}

int TrainingJob::num_workers() const {
  auto it = replica_specs.find("Worker");
  return it == replica_specs.end() ? 0 : it->second.replicas;
}

int TrainingJob::num_tasks() const {
  int n = 0;
  for (const auto& [type, replica] : replica_specs) n += replica.replicas;
  return n;
}

std::string TrainingJob::scheduler_name() const {
  for (const auto& [type, replica] : replica_specs) {
    if (!replica.scheduler_name.empty()) return replica.scheduler_name;
  }
  return "";
}

int TrainingJob::min_available() const {
  const auto& p = run_policy.scheduling_policy;
  return p.has_value() && p->min_available.has_value() ? *p->min_available : num_tasks();
}

GangScheduler GangSchedulerOf(const std::string& scheduler_name) {
  return scheduler_name == "volcano" ? GangScheduler::kVolcano : GangScheduler::kSchedulerPlugins;
}

const char* GangSchedulerName(GangScheduler scheduler) {
  return scheduler == GangScheduler::kVolcano ? "volcano" : "scheduler-plugins";
}

int TrainingJob::effective_replicas_to_aggregate() const {
  return training.replicas_to_aggregate > 0 ? training.replicas_to_aggregate : num_workers();
}

int64_t TrainingJob::TargetSteps(int64_t train_examples) const {
  if (training.steps.has_value()) return *training.steps;
  if (!training.epochs.has_value() || train_examples <= 0) return 0;
  const int64_t per_step =
      training.mode == TrainingMode::kSync ? std::max(1, effective_replicas_to_aggregate()) : 1;
  const long double examples_per_step =
      static_cast<long double>(std::max(1, training.batch_size)) * per_step;
  long double steps =
      static_cast<long double>(*training.epochs) * train_examples / examples_per_step;
  // Decimal epochs are inexact in binary (0.1 * 60000 / 100 is 60.000...03);
  // an exact quotient must not round up to one extra step.
  const long double nearest = std::round(steps);
  if (std::fabs(steps - nearest) <= 1e-9L * std::max(1.0L, nearest)) steps = nearest;
  if (steps >= static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(steps)));
}

namespace {

absl::Status TooLarge(int64_t size) {
  return absl::InvalidArgumentError(
      absl::StrCat("is ", size, " bytes; a TrainingJob may be at most ", kMaxTrainingJobBytes,
                   " bytes (1.5 MiB, the size Kubernetes allows an object)"));
}

// yaml-cpp reads a quoted scalar whose closing quote is missing to the end of
// the input without an error, so `name: "test` swallows the rest of the file
// and the message would be about whatever went missing ("spec: required").
// Each quoted scalar the parser made is checked against the text it came
// from: its closing quote must exist.
absl::Status CheckQuotesClosed(const YAML::Node& node, const std::string& text) {
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      KT_RETURN_IF_ERROR(CheckQuotesClosed(it->first, text));
      KT_RETURN_IF_ERROR(CheckQuotesClosed(it->second, text));
    }
    return absl::OkStatus();
  }
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) KT_RETURN_IF_ERROR(CheckQuotesClosed(item, text));
    return absl::OkStatus();
  }
  if (!node.IsScalar() || node.Tag() != "!") return absl::OkStatus();
  const YAML::Mark mark = node.Mark();
  if (mark.pos < 0 || static_cast<size_t>(mark.pos) >= text.size()) return absl::OkStatus();
  const char quote = text[mark.pos];
  if (quote != '"' && quote != '\'') return absl::OkStatus();
  for (size_t i = mark.pos + 1; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') {
      ++i;  // an escaped character
    } else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;  // '' is a quote inside a single-quoted string
      } else {
        return absl::OkStatus();
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid YAML at line ", mark.line + 1, ", column ", mark.column + 1,
      ": unterminated quoted string (no closing ", std::string(1, quote), " before the end)"));
}

}  // namespace

absl::StatusOr<TrainingJob> ParseTrainingJob(const std::string& yaml_text) {
  TrainingJob job;
  if (static_cast<int64_t>(yaml_text.size()) > kMaxTrainingJobBytes) {
    return TooLarge(static_cast<int64_t>(yaml_text.size()));
  }
  // Before the tree is built and walked (CheckQuotesClosed visits every node
  // an alias repeats; an alias bomb would keep it busy for hours).
  KT_RETURN_IF_ERROR(CheckAliasExpansion(yaml_text));
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    for (const YAML::Node& doc : docs) KT_RETURN_IF_ERROR(CheckQuotesClosed(doc, yaml_text));
    // A trailing "---" yields an empty document; ignore those.
    docs.erase(
        std::remove_if(docs.begin(), docs.end(), [](const YAML::Node& n) { return n.IsNull(); }),
        docs.end());
    if (docs.empty()) return absl::InvalidArgumentError("empty document, expected a TrainingJob");
    if (docs.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected one YAML document, got ", docs.size()));
    }
    absl::Status status = ParseDocument(docs[0], &job);
    if (!status.ok()) return status;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  } catch (const std::exception& e) {
    // yaml-cpp may throw standard exceptions too; none may escape the API.
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML: ", e.what()));
  }
  return job;
}

absl::StatusOr<TrainingJob> LoadTrainingJobFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot read ", path));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, expected a TrainingJob YAML file"));
  }
  // The limit is checked before reading (a regular file says its size) and
  // while reading (a pipe does not): a huge file is never held in memory.
  if (S_ISREG(st.st_mode) && st.st_size > kMaxTrainingJobBytes) {
    ::close(fd);
    return absl::Status(TooLarge(st.st_size).code(),
                        absl::StrCat(path, ": ", TooLarge(st.st_size).message()));
  }
  std::string text;
  char buf[64 << 10];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > kMaxTrainingJobBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": is more than ", kMaxTrainingJobBytes,
                       " bytes; a TrainingJob may be at most 1.5 MiB (the size Kubernetes allows "
                       "an object)"));
    }
  }
  ::close(fd);
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(text);
  if (!job.ok()) {
    return absl::Status(job.status().code(), absl::StrCat(path, ": ", job.status().message()));
  }
  return job;
}

absl::Status ValidateTrainingJob(const TrainingJob& job) {
  if (job.name.empty()) return FieldError("metadata.name", "required");
  if (!IsDns1035Label(job.name)) {
    return FieldError(
        "metadata.name",
        absl::StrCat("must be a DNS-1035 label (lowercase letters, digits and '-', "
                     "starting with a letter and ending with a letter or digit), got ",
                     Quote(job.name)));
  }
  if (job.name.size() > kMaxNameLength) {
    return FieldError(
        "metadata.name",
        absl::StrCat("must be at most ", kMaxNameLength,
                     " characters (pod names append e.g. \"-worker-12\"), got ", job.name.size()));
  }
  if (!IsDns1123Label(job.namespace_)) {
    return FieldError("metadata.namespace",
                      absl::StrCat("must be a DNS-1123 label, got ", Quote(job.namespace_)));
  }
  KT_RETURN_IF_ERROR(ValidateReplicas(job));

  const RunPolicy& rp = job.run_policy;
  KT_RETURN_IF_ERROR(
      CheckOneOf("spec.runPolicy.cleanPodPolicy", rp.clean_pod_policy, {"All", "Running", "None"}));
  if (rp.ttl_seconds_after_finished.has_value()) {
    KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>("spec.runPolicy.ttlSecondsAfterFinished",
                                             *rp.ttl_seconds_after_finished, 0));
  }
  if (rp.active_deadline_seconds.has_value()) {
    KT_RETURN_IF_ERROR(CheckAtLeast<int64_t>("spec.runPolicy.activeDeadlineSeconds",
                                             *rp.active_deadline_seconds, 1));
  }
  if (rp.backoff_limit.has_value()) {
    KT_RETURN_IF_ERROR(CheckAtLeast("spec.runPolicy.backoffLimit", *rp.backoff_limit, 0));
  }
  if (rp.scheduling_policy.has_value()) KT_RETURN_IF_ERROR(ValidateSchedulingPolicy(job));
  if (!job.success_policy.empty() && job.success_policy != "AllWorkers") {
    return FieldError("spec.successPolicy", absl::StrCat("must be \"\" or \"AllWorkers\", got ",
                                                         Quote(job.success_policy)));
  }
  return job.has_training ? ValidateTraining(job) : absl::OkStatus();
}

absl::Status ParseDatasetSection(const std::string& yaml_text, TrainingSpec* out) {
  // The section comes from a model file, which anyone may hand to eval.
  if (absl::Status status = CheckAliasExpansion(yaml_text); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.training.dataset: ", status.message()));
  }
  YAML::Node node;
  try {
    node = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec.training.dataset: ", e.what()));
  }
  Fields f;
  KT_RETURN_IF_ERROR(Fields::Read(node, "spec.training.dataset", DatasetKeys(), &f));
  KT_RETURN_IF_ERROR(ParseDatasetFields(f, out));
  out->dataset_yaml = yaml_text;
  return absl::OkStatus();
}

const char* TrainingModeName(TrainingMode mode) {
  switch (mode) {
    case TrainingMode::kSync:
      return "sync";
    case TrainingMode::kAsync:
      return "async";
  }
  return "unknown";
}

const char* RestartPolicyName(RestartPolicy policy) {
  switch (policy) {
    case RestartPolicy::kNever:
      return "Never";
    case RestartPolicy::kOnFailure:
      return "OnFailure";
    case RestartPolicy::kAlways:
      return "Always";
    case RestartPolicy::kExitCode:
      return "ExitCode";
  }
  return "unknown";
}

std::optional<RestartPolicy> RestartPolicyFromName(const std::string& name) {
  for (auto policy : {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways,
                      RestartPolicy::kExitCode}) {
    if (name == RestartPolicyName(policy)) return policy;
  }
  return std::nullopt;
}

bool IsRetryable(RestartPolicy policy, int exit_code) {
  if (exit_code == 0) return false;
  switch (policy) {
    case RestartPolicy::kNever:
      return false;
    case RestartPolicy::kOnFailure:
    case RestartPolicy::kAlways:
      return true;
    case RestartPolicy::kExitCode:
      return exit_code >= 128;
  }
  return false;
}

}  // namespace kubetrain
