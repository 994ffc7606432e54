#include "worker/model_export.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cluster_spec.h"
#include "core/log.h"
#include "core/model_file.h"
#include "worker/eval_data.h"

namespace kubetrain {

absl::StatusOr<int> PsRowSource::TableOf(int variable) const {
  for (size_t t = 0; t < placement_->tables.size(); ++t) {
    if (placement_->tables[t].variable == variable && placement_->tables[t].dynamic) {
      return static_cast<int>(t);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("variable ", variable, " is not a dynamic table"));
}

absl::StatusOr<int64_t> PsRowSource::CountRows(int variable) {
  auto table = TableOf(variable);
  if (!table.ok()) return table.status();
  return client_->CountRows(*table);
}

absl::Status PsRowSource::ForEachPage(int variable, const Page& page) {
  auto table = TableOf(variable);
  if (!table.ok()) return table.status();
  return client_->ListRows(*table, page);
}

absl::Status WriteModelExport(const TaskConfig& config, const Params& params, int64_t version,
                              const Dataset& test, const std::string& path,
                              const ExportPolicy& policy, const Clock* clock, int64_t* failures,
                              DynamicRowSource* dynamic_rows) {
  ModelFile file{config.model->spec(), params, version, config.job.name};
  file.dataset_yaml = config.job.training.dataset_yaml;
  file.norm_mean = test.norm_mean;
  file.norm_std = test.norm_std;
  file.seed = config.job.training.seed;
  file.dynamic_rows = dynamic_rows;
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
  // The dense values (one pull per shard, answered at once: no hold), the
  // figures on the test set (its table rows only), then the fixed tables
  // whole; the dynamic tables are listed as the file is written.
  Params params;
  auto pulled = client.Pull(/*next_version=*/false, 0, config->model->variables(), &params);
  if (!pulled.ok()) return pulled.status();
  const EvalData eval(*config->model, *test);
  auto metrics = eval.Evaluate(&client, &params);
  if (!metrics.ok()) return metrics.status();
  if (config->model->sparse()) {
    if (absl::Status s = client.PullTables(&params); !s.ok()) return s;
  }
  ExportFromPsResult result;
  result.global_step = pulled->version;
  result.test_metrics = *metrics;
  ExportPolicy policy;
  policy.field = "--output";
  int64_t failures = 0;
  PsRowSource rows(&client, &config->placement);
  if (absl::Status s = WriteModelExport(*config, params, pulled->version, *test, options.output,
                                        policy, clock, &failures, &rows);
      !s.ok()) {
    return s;
  }
  result.path = options.output;
  return result;
}

}  // namespace kubetrain
