// The exporter: what `kubetrain export --from-ps` runs
// (kubetrain-worker --export_from_ps=HOST:PORT,...). It pulls the whole model
// from the PS tasks of a job (worker/model_export.h: ExportFromPs) and writes
// it to a model file, without TF_CONFIG: it is no task of the job's cluster,
// it acts as the job's "exporter" with a token derived from job.key.
#ifndef KUBETRAIN_WORKER_EXPORTER_TASK_H_
#define KUBETRAIN_WORKER_EXPORTER_TASK_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/job_credentials.h"
#include "worker/model_export.h"

namespace kubetrain {

// A channel to one PS task, presenting `caller` (gRPC in kubetrain-worker:
// NewGrpcShardChannel; in-process in tests).
using CallerChannelFactory = std::function<std::unique_ptr<ShardChannel>(
    const std::string& address, int64_t chunk_bytes, const CallerCredentials& caller)>;

struct ExporterTaskOptions {
  ExportFromPsOptions export_options;  // job_file, ps_addresses, output
  // The job's credentials (job.key, and the TLS files); empty: plaintext, no
  // token (a PS that checks tokens refuses the exporter).
  std::string auth_dir;
};

class ExporterTask {
 public:
  // Errors are configuration errors (exit code 2): InvalidArgument without an
  // output file; the credentials' error (naming the directory) when they
  // cannot be read.
  static absl::StatusOr<std::unique_ptr<ExporterTask>> Create(ExporterTaskOptions options,
                                                              CallerChannelFactory channels,
                                                              const Clock* clock);

  // Pulls, evaluates and writes the model, and logs where it went.
  absl::StatusOr<ExportFromPsResult> Run();

  // The process exit code for Run's status: 0 when written; 2
  // on bad input (InvalidArgument, FailedPrecondition: e.g. a PS count or
  // fingerprint that does not match the job) or credentials a PS refuses
  // (UNAUTHENTICATED, PERMISSION_DENIED: no retry will help); 1 otherwise
  // (the PS tasks cannot be reached or read, the file cannot be written).
  static int ExitCode(const absl::Status& status);

 private:
  ExporterTask(ExporterTaskOptions options, CallerCredentials caller, CallerChannelFactory channels,
               const Clock* clock);

  const ExporterTaskOptions options_;
  const CallerCredentials caller_;
  const CallerChannelFactory channels_;
  const Clock* const clock_;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_EXPORTER_TASK_H_
