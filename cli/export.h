// `kubetrain export --from-ps HOST:PORT[,HOST:PORT...] --job FILE.yaml
// --output MODEL`: saves the model of a job whose PS tasks are still up --
// typically PS tasks that could not write their final checkpoint and hold the
// parameters read-only for a while (docs/trainingjob.md, "Full, read-only and
// failing disks") -- to a model file elsewhere, which `kubetrain eval` reads.
//
// The work is the exporter's, in kubetrain-worker (worker/model_export.h:
// the chief's own export code, over the PS client and its gRPC channels); this
// command checks its flags and runs `kubetrain-worker --export_from_ps` from
// --bin-dir in its place, so its output and exit code are the exporter's:
// 0 written, 1 the PS tasks cannot be read or the file cannot be written, 2
// bad input (flags, a PS count or job fingerprint that does not match).
#ifndef KUBETRAIN_CLI_EXPORT_H_
#define KUBETRAIN_CLI_EXPORT_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kubetrain {

struct ExportOptions {
  std::string from_ps;  // "host:port,host:port": ps:0, ps:1, ... in order
  std::string job_file;
  std::string output;
  std::string bin_dir;  // holds kubetrain-worker
  // The job's credentials (job.key, and the TLS files when the job uses
  // TLS): the exporter derives its token from the key. Empty: none.
  std::string auth_dir;
};

// The exporter's command line, or an error naming the flag that is missing.
absl::StatusOr<std::vector<std::string>> ExportArgv(const ExportOptions& options);

// "kubetrain export --from-ps A,B --job FILE --output PATH [--auth-dir DIR]",
// quoted for a shell where needed: what `kubetrain run` tells the user to run.
std::string ExportCommandLine(const std::vector<std::string>& ps_addresses,
                              const std::string& job_file, const std::string& output,
                              const std::string& auth_dir = "");

// The command: argv[0] is the program, argv[1] "export"; --bin-dir defaults
// to `bin_dir`. Returns only on error (the exit code); else it has become
// the exporter.
int ExportCommand(int argc, char** argv, const std::string& bin_dir, std::FILE* err = stderr);

}  // namespace kubetrain

#endif  // KUBETRAIN_CLI_EXPORT_H_
