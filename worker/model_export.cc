#include "worker/model_export.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cluster_spec.h"
#include "core/log.h"
#include "core/model_file.h"

namespace kubetrain {

absl::Status WriteModelExport(const TaskConfig& config, const Params& params, int64_t version,
                              const Dataset& test, const std::string& path,
                              const ExportPolicy& policy, const Clock* clock, int64_t* failures) {
  ModelFile file{config.model->spec(), params, version, config.job.name};
  file.dataset_yaml = config.job.training.dataset_yaml;
  file.norm_mean = test.norm_mean;
  file.norm_std = test.norm_std;
  absl::Duration delay = policy.backoff;
  for (int attempt = 1;; ++attempt) {
    absl::Status s = WriteModelFile(path, file, policy.env);
    if (s.ok()) return absl::OkStatus();
    ++*failures;
    if (attempt >= std::max(1, policy.attempts)) {
      return absl::Status(
          s.code(), absl::StrCat("cannot export the final model to ", path, " (", policy.field,
                                 ") after ", attempt, " attempts: ", s.message()));
    }
    Log("warning: exporting the model to ", path, " failed (attempt ", attempt, "/",
        policy.attempts, "): ", s.message(), "; retrying in ", absl::FormatDuration(delay));
    clock->SleepFor(delay);
    delay *= 2;
  }
}

absl::StatusOr<int64_t> PullWholeModel(PsClient* client, const Model& model, Params* params) {
  auto pulled = client->Pull(/*next_version=*/false, 0, model.variables(), params);
  if (!pulled.ok()) return pulled.status();
  if (model.sparse()) {
    if (absl::Status s = client->PullTables(params); !s.ok()) return s;
  }
  return pulled->version;
}

absl::StatusOr<ExportFromPsResult> ExportFromPs(const ExportFromPsOptions& options,
                                                const ChannelFactory& channels,
                                                const Clock* clock) {
  auto job = LoadTrainingJobFile(options.job_file);
  if (!job.ok()) return job.status();
  const std::vector<std::string>& ps = options.ps_addresses;
  if (static_cast<int>(ps.size()) != job->num_ps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--from-ps: ", ps.size(), ps.size() == 1 ? " address" : " addresses", " for the ",
        job->num_ps(), " PS tasks of ", job->name, " (spec.replicaSpecs.PS.replicas in ",
        options.job_file, "); give ps:0, ps:1, ... in order"));
  }
  // The job's own TF_CONFIG, as its chief would get it: the PS tasks at the
  // given addresses (no other task is ever contacted).
  const JobTask self = job->has_chief_replica() ? JobTask{"chief", 0} : JobTask{"worker", 0};
  const TfConfig tf = BuildTfConfig(
      *job,
      [&](const JobTask& t) { return t.type == "ps" ? ps[t.index] : std::string("127.0.0.1:1"); },
      self);
  auto config = LoadTaskConfig(options.job_file, SerializeTfConfig(tf));
  if (!config.ok()) return config.status();
  // What the chief's export carries besides the values: the test set's
  // normalisation (from the training files) and the figures to show.
  auto test = LoadTestSet(config->job.training);
  if (!test.ok()) return test.status();

  std::vector<std::unique_ptr<ShardChannel>> shard_channels;
  for (const std::string& address : ps) {
    shard_channels.push_back(channels(address, config->job.training.chunk_bytes));
  }
  PsClient::Options client_options;
  client_options.task_type = v1::TASK_TYPE_EXPORTER;
  client_options.fingerprint = config->fingerprint;
  client_options.chunk_bytes = config->job.training.chunk_bytes;
  client_options.retry_timeout = options.connect_timeout;
  PsClient client(client_options, &config->placement, clock, std::move(shard_channels), {});
  if (absl::Status s = client.Connect(); !s.ok()) {
    return ExplainFingerprintMismatch(
        s, config->fingerprint,
        absl::StrCat("give the job file the PS tasks run with, not ", options.job_file));
  }
  Params params;
  auto version = PullWholeModel(&client, *config->model, &params);
  if (!version.ok()) return version.status();
  ExportFromPsResult result;
  result.global_step = *version;
  Batch all;
  all.x = test->images.data();
  all.labels = test->labels.data();
  all.targets = test->targets.empty() ? nullptr : test->targets.data();
  all.size = test->size;
  result.test_metrics = config->model->Evaluate(params, all);
  ExportPolicy policy;
  policy.field = "--output";
  int64_t failures = 0;
  if (absl::Status s = WriteModelExport(*config, params, *version, *test, options.output, policy,
                                        clock, &failures);
      !s.ok()) {
    return s;
  }
  result.path = options.output;
  return result;
}

}  // namespace kubetrain
