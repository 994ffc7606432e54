// One-line log records on stderr: "<UTC time> <message>". kubetrain run and
// kubectl logs add the task name; the message says what happened and why.
#ifndef KUBETRAIN_CORE_LOG_H_
#define KUBETRAIN_CORE_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kubetrain {

template <typename... Args>
void Log(const Args&... args) {
  std::string line = absl::StrCat(absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone()),
                                  args..., "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_LOG_H_
