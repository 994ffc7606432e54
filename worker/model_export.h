// The model file a job leaves behind (core/model_file.h), written from values
// pulled off the PS tasks. One writer for both of its users:
//
//   the chief      at the end of training (worker/trainer.h), with the values
//                  at the target version;
//   the exporter   `kubetrain export --from-ps` (kubetrain-worker
//                  --export_from_ps): a reader (TASK_TYPE_EXPORTER) that pulls
//                  the whole model from live PS tasks as it is now -- e.g.
//                  from PS tasks that hold parameters they could not
//                  checkpoint (ps/ps_task.h) -- and writes it elsewhere.
#ifndef KUBETRAIN_WORKER_MODEL_EXPORT_H_
#define KUBETRAIN_WORKER_MODEL_EXPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/dataset.h"
#include "core/file_env.h"
#include "core/model_file.h"
#include "core/task_config.h"
#include "ps/shard_channel.h"
#include "worker/ps_client.h"

namespace kubetrain {

// How the model file is written: a failed write is retried `attempts` times
// in all, `backoff` apart and doubling; nothing is trained again meanwhile.
struct ExportPolicy {
  FileEnv* env = FileEnv::Default();  // not owned
  int attempts = 5;
  absl::Duration backoff = absl::Seconds(1);
  // What set the path, for the error: "spec.training.checkpoint.directory"
  // or "--export_model".
  std::string field = "--export_model";
};

// The rows of the model's dynamic tables as the PS tasks hold them, listed
// off the shards a page at a time while the model file is written
// (PsClient::ListRows: shard by shard, each in increasing id order, so a sync
// rerun writes the same bytes): the exporting task never holds a dynamic
// table.
class PsRowSource : public DynamicRowSource {
 public:
  // `client` and `placement` must outlive the source.
  PsRowSource(PsClient* client, const Placement* placement)
      : client_(client), placement_(placement) {}
  absl::StatusOr<int64_t> CountRows(int variable) override;
  absl::Status ForEachPage(int variable, const Page& page) override;

 private:
  // Index into placement_->tables of the table variable `variable`.
  absl::StatusOr<int> TableOf(int variable) const;

  PsClient* const client_;
  const Placement* const placement_;
};

// Writes `params` (the model's layout, fixed tables whole) at `version` to
// `path`, with the dynamic tables' rows from `dynamic_rows` (required if the
// model has one), the dataset section, `test`'s normalisation (so
// `kubetrain eval` reads data as training did) and the seed, retried per
// `policy`. *failures counts the attempts that failed. The error: "cannot
// export the final model to PATH (FIELD) after N attempts: <error>".
absl::Status WriteModelExport(const TaskConfig& config, const Params& params, int64_t version,
                              const Dataset& test, const std::string& path,
                              const ExportPolicy& policy, const Clock* clock, int64_t* failures,
                              DynamicRowSource* dynamic_rows = nullptr);

struct ExportFromPsOptions {
  std::string job_file;                   // the job's TrainingJob file
  std::vector<std::string> ps_addresses;  // "host:port" of ps:0, ps:1, ... in order
  std::string output;                     // the model file to write
  absl::Duration connect_timeout = absl::Seconds(30);
};

struct ExportFromPsResult {
  int64_t global_step = 0;
  EvalMetrics test_metrics;  // of the exported values on the job's test set
  std::string path;
};

// Channels to the PS tasks, one per address (gRPC in kubetrain-worker).
using ChannelFactory =
    std::function<std::unique_ptr<ShardChannel>(const std::string& address, int64_t chunk_bytes)>;

// `kubetrain export --from-ps`: loads the job (its model, placement and
// fingerprint), connects to every PS as the exporter, refuses PS tasks of
// another job or shape (a count that differs from spec.replicaSpecs.PS, a
// fingerprint that differs: the fields are named), pulls the dense values
// (answered at once: no hold), evaluates them with the test set's table rows,
// pulls the fixed tables whole and writes the model to options.output,
// listing the dynamic tables' rows off the PS tasks as it goes.
absl::StatusOr<ExportFromPsResult> ExportFromPs(const ExportFromPsOptions& options,
                                                const ChannelFactory& channels, const Clock* clock);

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_MODEL_EXPORT_H_
