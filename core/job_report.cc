#include "core/job_report.h"

#include <cctype>
#include <map>
#include <sstream>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

using nlohmann::json;

// One row per field: its snake_case name and where it lives in the struct.
template <typename T>
struct Field {
  const char* name;
  std::variant<int64_t T::*, double T::*, std::string T::*, std::optional<double> T::*> member;
};

const std::vector<Field<Progress>>& ProgressFields() {
  static const auto* fields = new std::vector<Field<Progress>>{
      {"global_step", &Progress::global_step},
      {"target_steps", &Progress::target_steps},
      {"loss", &Progress::loss},
      {"examples_per_second", &Progress::examples_per_second},
      {"accuracy", &Progress::accuracy},
      {"absent_workers", &Progress::absent_workers},
      {"checkpoint_failures", &Progress::checkpoint_failures},
      {"checkpoints_failing", &Progress::checkpoints_failing},
      {"checkpoint_error", &Progress::checkpoint_error},
  };
  return *fields;
}

const std::vector<Field<JobResult>>& JobResultFields() {
  static const auto* fields = new std::vector<Field<JobResult>>{
      {"status", &JobResult::status},
      {"mode", &JobResult::mode},
      {"global_step", &JobResult::global_step},
      {"target_steps", &JobResult::target_steps},
      {"test_accuracy", &JobResult::test_accuracy},
      {"test_auc", &JobResult::test_auc},
      {"test_log_loss", &JobResult::test_log_loss},
      {"test_rmse", &JobResult::test_rmse},
      {"records_skipped", &JobResult::records_skipped},
      {"final_loss", &JobResult::final_loss},
      {"wall_seconds", &JobResult::wall_seconds},
      {"examples_per_second", &JobResult::examples_per_second},
      {"gradients_applied", &JobResult::gradients_applied},
      {"stale_gradients_dropped", &JobResult::stale_gradients_dropped},
      {"pushes_rejected", &JobResult::pushes_rejected},
      {"barrier_timeouts", &JobResult::barrier_timeouts},
      {"restored_version", &JobResult::restored_version},
      {"steps_lost", &JobResult::steps_lost},
      {"ps_restarts_seen", &JobResult::ps_restarts_seen},
      {"max_staleness", &JobResult::max_staleness},
      {"mean_staleness", &JobResult::mean_staleness},
      {"model_path", &JobResult::model_path},
      {"export_failures", &JobResult::export_failures},
      {"absent_workers", &JobResult::absent_workers},
      {"checkpoint_failures", &JobResult::checkpoint_failures},
      {"checkpoints_failing", &JobResult::checkpoints_failing},
      {"checkpoint_error", &JobResult::checkpoint_error},
      {"dynamic_rows", &JobResult::dynamic_rows},
      {"dynamic_rows_evicted", &JobResult::dynamic_rows_evicted},
  };
  return *fields;
}

template <typename T>
json Write(const T& value, const std::vector<Field<T>>& fields, NameStyle style) {
  json j = json::object();
  for (const auto& f : fields) {
    const std::string key = style == NameStyle::kCamel ? CamelCase(f.name) : f.name;
    std::visit(
        [&](auto member) {
          const auto& v = value.*member;
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::optional<double>>) {
            if (v) j[key] = *v;
          } else {
            j[key] = v;
          }
        },
        f.member);
  }
  return j;
}

template <typename T>
absl::StatusOr<T> Read(const json& j, const std::vector<Field<T>>& fields, const char* what) {
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected a JSON object"));
  T out;
  for (const auto& f : fields) {
    const json* v = nullptr;
    for (const std::string& key : {std::string(f.name), CamelCase(f.name)}) {
      auto it = j.find(key);
      if (it != j.end() && !it->is_null()) v = &*it;
    }
    if (v == nullptr) continue;
    absl::Status st = std::visit(
        [&](auto member) -> absl::Status {
          auto& dst = out.*member;
          using V = std::decay_t<decltype(dst)>;
          if constexpr (std::is_same_v<V, std::string>) {
            if (!v->is_string())
              return absl::InvalidArgumentError(
                  absl::StrCat(what, ".", f.name, ": expected a string"));
            dst = v->get<std::string>();
          } else if constexpr (std::is_same_v<V, int64_t>) {
            if (!v->is_number())
              return absl::InvalidArgumentError(
                  absl::StrCat(what, ".", f.name, ": expected a number"));
            dst = v->get<int64_t>();
          } else {
            if (!v->is_number())
              return absl::InvalidArgumentError(
                  absl::StrCat(what, ".", f.name, ": expected a number"));
            dst = v->get<double>();
          }
          return absl::OkStatus();
        },
        f.member);
    if (!st.ok()) return st;
  }
  return out;
}

// One sample line of the text exposition format: `name{label="value",...} v`
// (label values with \\, \" and \n escapes; an optional timestamp after v).
bool ParseSample(const std::string& line, std::string* name,
                 std::map<std::string, std::string>* labels, double* value) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  *name = line.substr(0, i);
  if (name->empty()) return false;
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
      std::string key = line.substr(i, eq - i), val;
      for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) {
          ++i;
          val += line[i] == 'n' ? '\n' : line[i];
        } else {
          val += line[i];
        }
      }
      if (i >= line.size()) return false;  // unterminated value
      ++i;                                 // the closing quote
      if (i < line.size() && line[i] == ',') ++i;
      (*labels)[key] = val;
    }
    if (i >= line.size()) return false;
    ++i;  // '}'
  }
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t end = line.find(' ', i);
  return absl::SimpleAtod(line.substr(i, end == std::string::npos ? end : end - i), value);
}

// The JSON after `tag` and one space, if `line` starts with them.
std::optional<json> Tagged(const std::string& line, const char* tag) {
  const std::string prefix = absl::StrCat(tag, " ");
  if (line.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  json j = json::parse(line.substr(prefix.size()), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

}  // namespace

std::string CamelCase(const std::string& snake) {
  std::string out;
  bool upper = false;
  for (char c : snake) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out;
}

json ToJson(const Progress& p, NameStyle style) { return Write(p, ProgressFields(), style); }
json ToJson(const JobResult& r, NameStyle style) { return Write(r, JobResultFields(), style); }

absl::StatusOr<Progress> ProgressFromJson(const json& j) {
  return Read(j, ProgressFields(), "progress");
}
absl::StatusOr<JobResult> JobResultFromJson(const json& j) {
  return Read(j, JobResultFields(), "result");
}

Progress FinalProgress(const JobResult& r) {
  Progress p;
  p.global_step = r.global_step;
  p.target_steps = r.target_steps;
  p.loss = r.final_loss;
  p.examples_per_second = r.examples_per_second;
  if (r.test_accuracy >= 0) p.accuracy = r.test_accuracy;
  p.absent_workers = r.absent_workers;
  p.checkpoint_failures = r.checkpoint_failures;
  p.checkpoints_failing = r.checkpoints_failing;
  p.checkpoint_error = r.checkpoint_error;
  return p;
}

std::string CheckpointHealthText(int64_t failures, int64_t failing, const std::string& error) {
  if (failures <= 0) return "";
  std::string s = absl::StrCat(failures, failures == 1 ? " checkpoint write" : " checkpoint writes",
                               " failed, ");
  if (failing > 0) {
    absl::StrAppend(&s, failing, failing == 1 ? " PS task" : " PS tasks", " failing now");
  } else {
    absl::StrAppend(&s, "the latest ones written");
  }
  if (!error.empty()) absl::StrAppend(&s, "; last: ", error);
  return s;
}

std::string FormatReportLine(const Progress& p) {
  return absl::StrCat(kProgressTag, " ", ToJson(p).dump());
}
std::string FormatReportLine(const JobResult& r) {
  return absl::StrCat(kResultTag, " ", ToJson(r).dump());
}

std::optional<ReportLine> ParseReportLine(const std::string& line) {
  if (auto j = Tagged(line, kProgressTag)) {
    auto p = ProgressFromJson(*j);
    if (!p.ok()) return std::nullopt;
    return ReportLine{*p, std::nullopt};
  }
  if (auto j = Tagged(line, kResultTag)) {
    auto r = JobResultFromJson(*j);
    if (!r.ok()) return std::nullopt;
    return ReportLine{std::nullopt, *r};
  }
  return std::nullopt;
}

std::optional<Progress> ProgressFromMetrics(const std::string& text) {
  Progress p;
  bool have_step = false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::string name;
    std::map<std::string, std::string> labels;
    double v = 0;
    if (!ParseSample(line, &name, &labels, &v)) continue;
    if (name == kAbsentWorkersMetric) {
      p.absent_workers = static_cast<int64_t>(v);
    } else if (name == kCheckpointFailuresMetric) {
      p.checkpoint_failures = static_cast<int64_t>(v);
    } else if (name == kCheckpointsFailingMetric) {
      p.checkpoints_failing = static_cast<int64_t>(v);
      p.checkpoint_error = labels[kCheckpointErrorLabel];
    } else if (name == kGlobalStepMetric) {
      p.global_step = static_cast<int64_t>(v);
      have_step = true;
    } else if (name == kTargetStepsMetric) {
      p.target_steps = static_cast<int64_t>(v);
    } else if (name == kTrainingLossMetric) {
      p.loss = v;
    } else if (name == kExamplesPerSecondMetric) {
      p.examples_per_second = v;
    } else if (name == kEvalAccuracyMetric && v > 0) {
      p.accuracy = v;  // 0 until the first evaluation
    }
  }
  if (!have_step) return std::nullopt;
  return p;
}

std::optional<double> MetricValue(const std::string& metrics_text, const std::string& name) {
  std::istringstream in(metrics_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.compare(0, name.size(), name) != 0) continue;
    std::string sample;
    std::map<std::string, std::string> labels;
    double v = 0;
    if (ParseSample(line, &sample, &labels, &v) && sample == name) return v;
  }
  return std::nullopt;
}

}  // namespace kubetrain
