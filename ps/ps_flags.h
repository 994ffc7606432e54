// The flags of kubetrain-ps, parsed once in main() and turned into the
// options of its PsTask (ps/ps_task.h).
#ifndef KUBETRAIN_PS_PS_FLAGS_H_
#define KUBETRAIN_PS_PS_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/flags.h"
#include "ps/ps_task.h"

namespace kubetrain {

struct PsFlags {
  std::string config_file;
  std::string tf_config;  // default: $TF_CONFIG
  std::string auth_dir;   // default: $KUBETRAIN_AUTH_DIR
  std::string termination_log;
  PsTaskOptions task;  // filled by Finish() and ReadCredentials()

  // Registers every flag on `parser`, with the environment's defaults.
  void Register(FlagParser* parser);
  // Checks the flags and the environment ($KUBETRAIN_INSECURE,
  // $KUBETRAIN_BULK_PORT) and converts
  // them into `task`; InvalidArgument naming the flag or variable.
  absl::Status Finish();
  // Reads --auth_dir's credentials into task.credentials (none without a
  // directory); the error names the directory or its missing job.key.
  absl::Status ReadCredentials();

 private:
  int64_t shutdown_grace_seconds_ = 0;
  int64_t bulk_port_ = -1;
  std::string bulk_port_env_;  // $KUBETRAIN_BULK_PORT as read by Register()
  int64_t keep_serving_seconds_ = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_PS_FLAGS_H_
