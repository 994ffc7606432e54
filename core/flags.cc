#include "core/flags.h"

#include <malloc.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kubetrain {

void FlagParser::String(const std::string& name, std::string* value, const std::string& help) {
  flags_.push_back(
      {name, help, "string", "\"" + *value + "\"", false, [value](const std::string& v) {
         *value = v;
         return true;
       }});
}

void FlagParser::Int(const std::string& name, int64_t* value, const std::string& help) {
  flags_.push_back({name, help, "int", absl::StrCat(*value), false,
                    [value](const std::string& v) { return absl::SimpleAtoi(v, value); }});
}

void FlagParser::Double(const std::string& name, double* value, const std::string& help) {
  flags_.push_back({name, help, "number", absl::StrCat(*value), false,
                    [value](const std::string& v) { return absl::SimpleAtod(v, value); }});
}

void FlagParser::Bool(const std::string& name, bool* value, const std::string& help) {
  flags_.push_back({name, help, "bool", *value ? "true" : "false", true,
                    [value](const std::string& v) { return absl::SimpleAtob(v, value); }});
}

absl::Status FlagParser::Parse(int argc, char** argv, int first,
                               std::vector<std::string>* positional) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (positional == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
      }
      positional->push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    // Accept snake_case and kebab-case alike.
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    const Flag* flag = nullptr;
    for (const auto& f : flags_) {
      std::string canon = f.name;
      for (char& c : canon) {
        if (c == '_') c = '-';
      }
      if (canon == name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    if (!flag->set(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, ": \"", value, "\" is not a valid ", flag->kind));
    }
  }
  return absl::OkStatus();
}

std::string FlagParser::Usage() const {
  std::string out = absl::StrCat("usage: ", program_, "\n\nflags:\n");
  for (const auto& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, " (", f.kind, ", default ", f.default_text, ")\n      ",
                    f.help, "\n");
  }
  return out;
}

std::optional<int> FlagParser::ParseMain(int argc, char** argv, int first,
                                         std::vector<std::string>* positional) {
  absl::Status st = Parse(argc, argv, first, positional);
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n\n%s", std::string(st.message()).c_str(), Usage().c_str());
    return 2;
  }
  if (help_) {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

namespace {

void WriteStderr(const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {
    ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

// No allocation here: we may be out of memory.
[[noreturn]] void OnTerminate() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      WriteStderr(
          "error: out of memory (std::bad_alloc): this task cannot hold the model or its buffers "
          "in the memory it has; use a smaller spec.training.model, more PS replicas, or give the "
          "task more memory\n");
      ::_exit(2);
    } catch (const std::exception& ex) {
      WriteStderr("error: uncaught exception: ");
      WriteStderr(ex.what());
      WriteStderr("\n");
    } catch (...) {
      WriteStderr("error: uncaught exception of unknown type\n");
    }
  }
  std::abort();
}

}  // namespace

void InitProcess(ProcessProfile profile) {
  std::signal(SIGPIPE, SIG_IGN);
  std::set_terminate(OnTerminate);
  if (profile == ProcessProfile::kTensorBuffers) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
}

}  // namespace kubetrain
