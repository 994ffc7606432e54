#include "cli/export.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/flags.h"

namespace kubetrain {
namespace {

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./:,=@+") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExportArgv(const ExportOptions& o) {
  if (o.from_ps.empty()) {
    return absl::InvalidArgumentError(
        "--from-ps is required: the PS tasks' host:port, ps:0 first, comma-separated (kubetrain "
        "run and the PS log line print them)");
  }
  if (o.job_file.empty()) {
    return absl::InvalidArgumentError("--job is required: the job's TrainingJob file");
  }
  if (o.output.empty()) {
    return absl::InvalidArgumentError("--output is required: the model file to write");
  }
  std::vector<std::string> argv = {o.bin_dir + "/kubetrain-worker", "--config=" + o.job_file,
                                   "--export_from_ps=" + o.from_ps, "--export_model=" + o.output,
                                   "--metrics_address="};
  if (!o.auth_dir.empty()) argv.push_back("--auth_dir=" + o.auth_dir);
  return argv;
}

std::string ExportCommandLine(const std::vector<std::string>& ps_addresses,
                              const std::string& job_file, const std::string& output,
                              const std::string& auth_dir) {
  return absl::StrCat("kubetrain export --from-ps ", ShellQuote(absl::StrJoin(ps_addresses, ",")),
                      " --job ", ShellQuote(job_file), " --output ", ShellQuote(output),
                      auth_dir.empty() ? "" : absl::StrCat(" --auth-dir ", ShellQuote(auth_dir)));
}

int ExportCommand(int argc, char** argv, const std::string& bin_dir, std::FILE* err) {
  ExportOptions options;
  options.bin_dir = bin_dir;
  FlagParser parser(
      "kubetrain export --from-ps HOST:PORT[,HOST:PORT...] --job FILE.yaml --output "
      "MODEL [--auth-dir DIR]");
  parser.String("from_ps", &options.from_ps,
                "the job's live PS tasks, host:port of ps:0, ps:1, ... comma-separated");
  parser.String("job", &options.job_file, "the TrainingJob file the PS tasks run");
  parser.String("output", &options.output, "the model file to write (then: kubetrain eval FILE)");
  parser.String("bin_dir", &options.bin_dir, "directory holding kubetrain-worker");
  parser.String("auth_dir", &options.auth_dir,
                "the job's credentials: a directory with its job.key (and ca.crt, tls.crt, "
                "tls.key when the job uses TLS), e.g. the one `kubetrain run` prints, or the "
                "job's Secret on Kubernetes");
  std::vector<std::string> rest;
  if (auto exit_code = parser.ParseMain(argc, argv, 2, &rest)) return *exit_code;
  if (!rest.empty()) {
    std::fprintf(err, "error: unexpected argument \"%s\"\n\n%s", rest[0].c_str(),
                 parser.Usage().c_str());
    return 2;
  }
  auto args = ExportArgv(options);
  if (!args.ok()) {
    std::fprintf(err, "error: %s\n\n%s", std::string(args.status().message()).c_str(),
                 parser.Usage().c_str());
    return 2;
  }
  std::vector<char*> argv_exec;
  for (std::string& a : *args) argv_exec.push_back(a.data());
  argv_exec.push_back(nullptr);
  execv(argv_exec[0], argv_exec.data());
  std::fprintf(err, "error: cannot run %s: %s\n", argv_exec[0], std::strerror(errno));
  return 1;
}

}  // namespace kubetrain
