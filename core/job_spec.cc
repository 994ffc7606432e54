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
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/job_spec_fields.h"
#include "core/yaml_limits.h"

namespace kubetrain {

using namespace spec_internal;  // NOLINT(build/namespaces): the sections and field helpers

namespace {

constexpr char kApiVersion[] = "kubetrain.io/v1";
constexpr char kKind[] = "TrainingJob";

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

  KT_RETURN_IF_ERROR(ValidateRunPolicy(job));
  if (!job.success_policy.empty() && job.success_policy != "AllWorkers") {
    return FieldError("spec.successPolicy", absl::StrCat("must be \"\" or \"AllWorkers\", got ",
                                                         Quote(job.success_policy)));
  }
  return job.has_training ? ValidateTraining(job) : absl::OkStatus();
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

}  // namespace kubetrain
