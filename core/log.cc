#include "core/log.h"

#include <cstdlib>
#include <fstream>

namespace kubetrain {

void WriteTerminationReason(const std::string& path, absl::string_view reason) {
  std::string line(reason.substr(0, kMaxTerminationReason));
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::ofstream out(path, std::ios::trunc);
  out << line << "\n";
  out.flush();
  if (!out) Log("warning: cannot write the termination message to ", path);
}

int ExitWithError(int exit_code, absl::string_view reason, const std::string& termination_log) {
  Log("error: ", reason);
  if (!termination_log.empty()) WriteTerminationReason(termination_log, reason);
  return exit_code;
}

void AddTerminationLogFlag(FlagParser& parser, std::string* path) {
  if (const char* env = std::getenv(kTerminationLogEnv)) *path = env;
  parser.String("termination_log", path,
                "on a fatal error also write its one-line reason to this file (default "
                "$KUBETRAIN_TERMINATION_LOG, which the operator sets to /dev/termination-log: "
                "the container's termination message)");
}

}  // namespace kubetrain
