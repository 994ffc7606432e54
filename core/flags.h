// A small strict command-line flag parser, used once in each main(): the
// parsed values are then passed down explicitly (no global flag state).
// Accepts --name=value and --name value; booleans also as bare --name.
// Unknown flags, missing values and malformed numbers are errors that name
// the flag.
#ifndef KUBETRAIN_CORE_FLAGS_H_
#define KUBETRAIN_CORE_FLAGS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kubetrain {

class FlagParser {
 public:
  explicit FlagParser(std::string program) : program_(std::move(program)) {}
  void String(const std::string& name, std::string* value, const std::string& help);
  void Int(const std::string& name, int64_t* value, const std::string& help);
  void Double(const std::string& name, double* value, const std::string& help);
  void Bool(const std::string& name, bool* value, const std::string& help);

  // Parses argv[first..argc). Non-flag arguments go to `positional` (an error
  // if it is null). --help/-h sets help_requested() and returns OK.
  absl::Status Parse(int argc, char** argv, int first, std::vector<std::string>* positional);
  bool help_requested() const { return help_; }
  std::string Usage() const;

  // The preamble every main() shares: parses argv[first..argc) and, when
  // main should stop here, returns its exit code: 0 after printing the usage
  // for --help, 2 after printing the error and the usage. nullopt: go on.
  std::optional<int> ParseMain(int argc, char** argv, int first = 1,
                               std::vector<std::string>* positional = nullptr);

 private:
  struct Flag {
    std::string name, help, kind, default_text;
    bool is_bool = false;
    std::function<bool(const std::string&)> set;
  };
  std::string program_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

// Process set-up shared by the long-running binaries: SIGPIPE ignored (a
// peer that goes away is an error on the socket, not a dead process); an
// exception that escapes (on any thread) ends the process with a message
// instead of a bare abort: std::bad_alloc exits with code 2 (a configuration
// error: the model or a buffer does not fit this task's memory); and,
// with kTensorBuffers, malloc tuned to keep tensor-sized buffers in the
// process instead of returning them to the kernel and faulting them in again
// on every RPC.
enum class ProcessProfile { kDefault, kTensorBuffers };
void InitProcess(ProcessProfile profile);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_FLAGS_H_
