#include "operator/kubeconfig.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/yaml_limits.h"
#include "yaml-cpp/yaml.h"

namespace kubetrain {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(what, ": cannot read file ", path));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(what, ": error reading ", path));
  return ss.str();
}

std::string DirName(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string Resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  return base_dir + "/" + p;
}

// Helper that carries the file name and a field prefix into every message.
class Parser {
 public:
  Parser(std::string path) : path_(std::move(path)), dir_(DirName(path_)) {}

  absl::Status Error(const std::string& field, const std::string& msg) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", field, ": ", msg));
  }

  // Optional scalar string field; "" if absent.
  absl::StatusOr<std::string> Str(const YAML::Node& node, const std::string& key,
                                  const std::string& field) const {
    YAML::Node v = node[key];
    if (!v || v.IsNull()) return std::string();
    if (!v.IsScalar()) return Error(field, "must be a string");
    return v.as<std::string>();
  }

  absl::StatusOr<bool> Bool(const YAML::Node& node, const std::string& key,
                            const std::string& field) const {
    YAML::Node v = node[key];
    if (!v || v.IsNull()) return false;
    bool b = false;
    if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b))
      return Error(field, "must be true or false");
    return b;
  }

  absl::StatusOr<std::string> Base64(const std::string& b64, const std::string& field) const {
    std::string out;
    std::string cleaned;
    for (char c : b64) {
      if (!absl::ascii_isspace(static_cast<unsigned char>(c))) cleaned += c;
    }
    if (!absl::Base64Unescape(cleaned, &out) || out.empty()) return Error(field, "invalid base64");
    return out;
  }

  // Either "<key>-data" (base64) or "<key>" (file path); "" if neither.
  absl::StatusOr<std::string> DataOrFile(const YAML::Node& node, const std::string& key,
                                         const std::string& prefix) const {
    auto data = Str(node, key + "-data", prefix + "." + key + "-data");
    if (!data.ok()) return data.status();
    if (!data->empty()) return Base64(*data, prefix + "." + key + "-data");
    auto file = Str(node, key, prefix + "." + key);
    if (!file.ok()) return file.status();
    if (file->empty()) return std::string();
    auto content = ReadFile(Resolve(dir_, *file), absl::StrCat(path_, ": ", prefix, ".", key));
    if (!content.ok()) return content.status();
    if (content->empty()) return Error(prefix + "." + key, "file " + *file + " is empty");
    return *content;
  }

  // Finds the entry named `name` in a list of {name: ..., <inner>: {...}}.
  absl::StatusOr<YAML::Node> Named(const YAML::Node& root, const std::string& list,
                                   const std::string& inner, const std::string& name,
                                   const std::string& referenced_by) const {
    YAML::Node seq = root[list];
    if (seq && !seq.IsNull() && !seq.IsSequence()) return Error(list, "must be a list");
    if (seq && seq.IsSequence()) {
      for (const YAML::Node& entry : seq) {
        if (!entry.IsMap()) return Error(list, "entries must be maps");
        YAML::Node n = entry["name"];
        if (n && n.IsScalar() && n.as<std::string>() == name) {
          YAML::Node v = entry[inner];
          if (!v || !v.IsMap()) {
            return Error(absl::StrCat(list, "[", name, "].", inner), "missing or not a map");
          }
          return v;
        }
      }
    }
    return Error(referenced_by,
                 absl::StrCat("refers to ", list, " entry \"", name, "\", which does not exist"));
  }

  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string path_;
  std::string dir_;
};

#define KT_ASSIGN(lhs, expr)          \
  do {                                \
    auto _r = (expr);                 \
    if (!_r.ok()) return _r.status(); \
    lhs = std::move(*_r);             \
  } while (0)

}  // namespace

absl::StatusOr<KubeConfig> ParseKubeConfig(const std::string& yaml, const std::string& path,
                                           const std::string& context) {
  Parser p(path);
  // Before the tree is built: an alias bomb or an alias inside its own node
  // would make any walk of it endless. Syntax errors surface here too, with
  // their line and column.
  if (absl::Status status = CheckAliasExpansion(yaml); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid YAML: ", e.what()));
  }
  if (!root.IsMap())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a kubeconfig (expected a map)"));

  try {
    std::string ctx_name = context;
    if (ctx_name.empty()) {
      KT_ASSIGN(ctx_name, p.Str(root, "current-context", "current-context"));
      if (ctx_name.empty())
        return p.Error("current-context", "missing (and no context was requested)");
    }
    const std::string ctx_field =
        context.empty() ? "current-context" : "context \"" + context + "\"";
    YAML::Node ctx;
    KT_ASSIGN(ctx, p.Named(root, "contexts", "context", ctx_name, ctx_field));
    const std::string cp = "contexts[" + ctx_name + "].context";

    KubeConfig cfg;
    cfg.source = absl::StrCat("kubeconfig ", path, " (context ", ctx_name, ")");
    std::string cluster_name, user_name, ns;
    KT_ASSIGN(cluster_name, p.Str(ctx, "cluster", cp + ".cluster"));
    KT_ASSIGN(user_name, p.Str(ctx, "user", cp + ".user"));
    KT_ASSIGN(ns, p.Str(ctx, "namespace", cp + ".namespace"));
    if (cluster_name.empty()) return p.Error(cp + ".cluster", "missing");
    if (!ns.empty()) cfg.namespace_ = ns;

    // --- cluster ---
    YAML::Node cluster;
    KT_ASSIGN(cluster, p.Named(root, "clusters", "cluster", cluster_name, cp + ".cluster"));
    const std::string clp = "clusters[" + cluster_name + "].cluster";
    KT_ASSIGN(cfg.server, p.Str(cluster, "server", clp + ".server"));
    if (cfg.server.empty()) return p.Error(clp + ".server", "missing");
    if (!absl::StartsWith(cfg.server, "https://") && !absl::StartsWith(cfg.server, "http://")) {
      return p.Error(clp + ".server",
                     "must start with https:// or http://, got \"" + cfg.server + "\"");
    }
    while (absl::EndsWith(cfg.server, "/")) cfg.server.pop_back();
    KT_ASSIGN(cfg.ca_pem, p.DataOrFile(cluster, "certificate-authority", clp));
    KT_ASSIGN(cfg.insecure_skip_tls_verify,
              p.Bool(cluster, "insecure-skip-tls-verify", clp + ".insecure-skip-tls-verify"));

    // --- user (optional: an unauthenticated context is legal) ---
    if (!user_name.empty()) {
      YAML::Node user;
      KT_ASSIGN(user, p.Named(root, "users", "user", user_name, cp + ".user"));
      const std::string up = "users[" + user_name + "].user";
      for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
        if (user[unsupported]) {
          return absl::UnimplementedError(
              absl::StrCat(path, ": ", up, ".", unsupported,
                           ": not supported; use a token or client certificate"));
        }
      }
      KT_ASSIGN(cfg.bearer_token, p.Str(user, "token", up + ".token"));
      std::string token_file;
      KT_ASSIGN(token_file, p.Str(user, "tokenFile", up + ".tokenFile"));
      if (cfg.bearer_token.empty() && !token_file.empty()) {
        cfg.token_file = Resolve(p.dir(), token_file);
        KT_ASSIGN(cfg.bearer_token,
                  ReadFile(cfg.token_file, absl::StrCat(path, ": ", up, ".tokenFile")));
        cfg.bearer_token = std::string(absl::StripAsciiWhitespace(cfg.bearer_token));
        if (cfg.bearer_token.empty())
          return p.Error(up + ".tokenFile", "file " + cfg.token_file + " is empty");
      }
      KT_ASSIGN(cfg.client_cert_pem, p.DataOrFile(user, "client-certificate", up));
      KT_ASSIGN(cfg.client_key_pem, p.DataOrFile(user, "client-key", up));
      if (cfg.client_cert_pem.empty() != cfg.client_key_pem.empty()) {
        return p.Error(
            cfg.client_cert_pem.empty() ? up + ".client-certificate-data" : up + ".client-key-data",
            "missing (client-certificate and client-key go together)");
      }
    }
    return cfg;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed kubeconfig: ", e.what()));
  }
}

absl::StatusOr<KubeConfig> LoadKubeConfigFile(const std::string& path, const std::string& context) {
  auto content = ReadFile(path, "kubeconfig");
  if (!content.ok()) return content.status();
  return ParseKubeConfig(*content, path, context);
}

absl::StatusOr<KubeConfig> LoadInClusterConfig(const InClusterOptions& options) {
  if (options.host.empty() || options.port.empty()) {
    return absl::FailedPreconditionError(
        "in-cluster config: API server host/port unknown (KUBERNETES_SERVICE_HOST/PORT not set?)");
  }
  KubeConfig cfg;
  cfg.source = "in-cluster";
  std::string host = options.host;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  cfg.server = absl::StrCat("https://", host, ":", options.port);

  auto token = ReadFile(options.token_file, "in-cluster service-account token");
  if (!token.ok()) return token.status();
  cfg.bearer_token = std::string(absl::StripAsciiWhitespace(*token));
  if (cfg.bearer_token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-cluster service-account token: ", options.token_file, " is empty"));
  }
  cfg.token_file = options.token_file;

  auto ca = ReadFile(options.ca_file, "in-cluster CA certificate");
  if (!ca.ok()) return ca.status();
  if (ca->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-cluster CA certificate: ", options.ca_file, " holds no PEM certificate"));
  }
  cfg.ca_pem = *ca;

  if (!options.namespace_file.empty()) {
    auto ns = ReadFile(options.namespace_file, "in-cluster namespace");
    if (ns.ok()) {
      std::string n(absl::StripAsciiWhitespace(*ns));
      if (!n.empty()) cfg.namespace_ = n;
    }
  }
  return cfg;
}

absl::StatusOr<KubeConfig> LoadClientConfig(bool in_cluster, const std::string& kubeconfig_path) {
  if (in_cluster) {
    InClusterOptions options;
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    options.host = host ? host : "";
    options.port = port ? port : "443";
    return LoadInClusterConfig(options);
  }
  if (kubeconfig_path.empty()) {
    return absl::InvalidArgumentError("give --kubeconfig (or set KUBECONFIG) or --in-cluster");
  }
  return LoadKubeConfigFile(kubeconfig_path);
}

}  // namespace kubetrain
