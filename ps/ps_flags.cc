#include "ps/ps_flags.h"

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/cluster_spec.h"
#include "core/job_credentials.h"
#include "core/log.h"

namespace kubetrain {
namespace {

// bulk_port_ when $KUBETRAIN_BULK_PORT is no number (a flag overrides it).
constexpr int64_t kBadBulkPortEnv = INT64_MIN;

}  // namespace

void PsFlags::Register(FlagParser* parser) {
  if (const char* tf = std::getenv("TF_CONFIG")) tf_config = tf;
  if (const char* dir = std::getenv(kAuthDirEnv)) auth_dir = dir;
  // The environment's port is the flag's default (the operator's PS pods);
  // a value that is no number is reported by Finish().
  if (const char* bulk = std::getenv(kBulkPortEnv)) {
    bulk_port_env_ = bulk;
    if (!absl::SimpleAtoi(bulk_port_env_, &bulk_port_)) bulk_port_ = kBadBulkPortEnv;
  }
  shutdown_grace_seconds_ = absl::ToInt64Seconds(task.shutdown_grace);
  keep_serving_seconds_ = absl::ToInt64Seconds(task.keep_serving_after_checkpoint_failure);
  parser->String("config", &config_file, "TrainingJob YAML file");
  parser->String("tf_config", &tf_config, "cluster spec JSON (default: $TF_CONFIG)");
  parser->String("auth_dir", &auth_dir,
                 "the job's credentials: job.key, and ca.crt, tls.crt, tls.key for TLS (default: "
                 "$KUBETRAIN_AUTH_DIR; none: refused unless --insecure)");
  parser->Bool("insecure", &task.insecure,
               "without an auth directory, serve any client that reaches the port (pushes, "
               "pulls, Shutdown) instead of refusing to start (default: $KUBETRAIN_INSECURE=1); "
               "only on a network no one but the job can reach");
  parser->String("bind_host", &task.bind_host,
                 "address to listen on; the port comes from TF_CONFIG");
  parser->Int("bulk_port", &bulk_port_,
              "serve Pull/Push/PushPull also over the bulk data plane (framed TCP, faster than "
              "gRPC; mutual TLS when the job has TLS files) on this port: -1 = off, 0 = any "
              "free port; workers learn it from the PS (default: $KUBETRAIN_BULK_PORT, else "
              "-1)");
  parser->String("metrics_address", &task.metrics_address, "host:port for /metrics; empty = off");
  parser->Int("shutdown_grace_seconds", &shutdown_grace_seconds_,
              "after the chief's shutdown, how long to wait for workers to leave");
  parser->Int("keep_serving_after_checkpoint_failure_seconds", &keep_serving_seconds_,
              "when the final checkpoint cannot be written, serve the parameters read-only this "
              "long for `kubetrain export --from-ps` before exiting 1 (0: exit at once)");
  AddTerminationLogFlag(*parser, &termination_log);
}

absl::Status PsFlags::Finish() {
  // The flag wins; unset, the environment says (the operator's PS pods of a
  // job without credentials set it).
  if (!task.insecure) {
    const char* env = std::getenv(kInsecureEnv);
    const std::string v = env == nullptr ? "" : env;
    if (v == "1" || v == "true") {
      task.insecure = true;
    } else if (!v.empty() && v != "0" && v != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("$", kInsecureEnv, ": must be 1, true, 0 or false, got \"", v, "\""));
    }
  }
  if (config_file.empty()) return absl::InvalidArgumentError("--config is required");
  if (keep_serving_seconds_ < 0) {
    return absl::InvalidArgumentError(
        "--keep_serving_after_checkpoint_failure_seconds: must be >= 0");
  }
  if (bulk_port_ == kBadBulkPortEnv) {
    return absl::InvalidArgumentError(absl::StrCat("$", kBulkPortEnv,
                                                   ": must be -1 (off), 0 (any free port) or a "
                                                   "port, got \"",
                                                   bulk_port_env_, "\""));
  }
  if (bulk_port_ < -1 || bulk_port_ > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bulk_port", bulk_port_env_.empty() ? "" : absl::StrCat(" (or $", kBulkPortEnv, ")"),
        ": must be -1 (off), 0 (any free port) or a port, got ", bulk_port_));
  }
  task.bulk_port = static_cast<int>(bulk_port_);
  task.shutdown_grace = absl::Seconds(shutdown_grace_seconds_);
  task.keep_serving_after_checkpoint_failure = absl::Seconds(keep_serving_seconds_);
  return absl::OkStatus();
}

absl::Status PsFlags::ReadCredentials() {
  if (auth_dir.empty()) return absl::OkStatus();
  auto credentials = ReadTaskCredentials(auth_dir);
  if (!credentials.ok()) return credentials.status();
  if (credentials->job_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(auth_dir, "/", kJobKeyFile,
                     ": missing: a PS task checks its callers' tokens with the job key"));
  }
  task.credentials = *std::move(credentials);
  return absl::OkStatus();
}

}  // namespace kubetrain
