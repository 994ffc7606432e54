#include "worker/exporter_task.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/log.h"

namespace kubetrain {

absl::StatusOr<std::unique_ptr<ExporterTask>> ExporterTask::Create(ExporterTaskOptions options,
                                                                   CallerChannelFactory channels,
                                                                   const Clock* clock) {
  if (options.export_options.output.empty()) {
    return absl::InvalidArgumentError("--export_from_ps needs --export_model (the file to write)");
  }
  CallerCredentials caller;
  if (!options.auth_dir.empty()) {
    absl::StatusOr<CallerCredentials> read = ReadCallerCredentials(options.auth_dir, "exporter", 0);
    if (!read.ok()) return read.status();
    caller = *std::move(read);
  }
  return std::unique_ptr<ExporterTask>(
      new ExporterTask(std::move(options), std::move(caller), std::move(channels), clock));
}

ExporterTask::ExporterTask(ExporterTaskOptions options, CallerCredentials caller,
                           CallerChannelFactory channels, const Clock* clock)
    : options_(std::move(options)),
      caller_(std::move(caller)),
      channels_(std::move(channels)),
      clock_(clock) {}

absl::StatusOr<ExportFromPsResult> ExporterTask::Run() {
  const ExportFromPsOptions& o = options_.export_options;
  auto exported = ExportFromPs(
      o,
      [this](const std::string& address, int64_t chunk_bytes) {
        return channels_(address, chunk_bytes, caller_);
      },
      clock_);
  if (!exported.ok()) return exported.status();
  Log("exported ", o.job_file, "'s model at global step ", exported->global_step, " from ",
      o.ps_addresses.size(), " PS tasks to ", exported->path,
      exported->test_metrics.accuracy
          ? absl::StrCat(", test accuracy ", *exported->test_metrics.accuracy)
          : std::string(),
      " (kubetrain eval ", exported->path, ")");
  return exported;
}

int ExporterTask::ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  const bool bad_input = absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status) ||
                         absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status);
  return bad_input ? 2 : 1;
}

}  // namespace kubetrain
