// Connection settings for the Kubernetes API server, loaded either from a
// kubeconfig file (kubectl's format) or from a pod's in-cluster service
// account. Nothing here reads environment variables: main() decides where the
// config comes from (--kubeconfig flag, $KUBECONFIG, or in-cluster with
// KUBERNETES_SERVICE_HOST/PORT) and passes the result to RestKubeClient.
//
// Errors are InvalidArgument (malformed content) or NotFound (a file that does
// not exist) and name the file and the field, e.g.
//   "/root/.kube/config: users[admin].user.client-key-data: invalid base64".
#ifndef KUBETRAIN_OPERATOR_KUBECONFIG_H_
#define KUBETRAIN_OPERATOR_KUBECONFIG_H_

#include <string>

#include "absl/status/statusor.h"

namespace kubetrain {

struct KubeConfig {
  // "https://127.0.0.1:6443" (scheme, host, port; a path prefix is kept).
  std::string server;
  // PEM CA bundle to verify the server with; empty = the system's roots.
  std::string ca_pem;
  // Do not verify the server's certificate (tests only).
  bool insecure_skip_tls_verify = false;

  // Bearer token. If token_file is set too, the client re-reads the file
  // periodically (service-account tokens are rotated) and bearer_token holds
  // the content read at load time.
  std::string bearer_token;
  std::string token_file;

  // PEM client certificate (chain) and private key for mutual TLS; both or
  // neither.
  std::string client_cert_pem;
  std::string client_key_pem;

  // Default namespace of the context (or of the pod's service account);
  // "default" when unset.
  std::string namespace_ = "default";

  // Where this came from, for messages: "kubeconfig /path (context x)" or
  // "in-cluster".
  std::string source;
};

// Parses a kubeconfig file. `context` selects a context by name; empty means
// the file's current-context. Supports, per kubectl:
//   cluster: server, certificate-authority-data (base64 PEM),
//            certificate-authority (file path), insecure-skip-tls-verify
//   user:    token, tokenFile, client-certificate-data / client-certificate,
//            client-key-data / client-key
//   context: cluster, user, namespace
// Relative file paths are resolved against the kubeconfig's directory.
// exec/auth-provider plugins and username/password are rejected with
// Unimplemented.
absl::StatusOr<KubeConfig> LoadKubeConfigFile(const std::string& path,
                                              const std::string& context = "");

// Same, from the file's content (`path` is used for messages and relative paths).
absl::StatusOr<KubeConfig> ParseKubeConfig(const std::string& yaml, const std::string& path,
                                           const std::string& context = "");

// In-cluster configuration: the files Kubernetes mounts into every pod and
// the API server address. main() fills host/port from KUBERNETES_SERVICE_HOST
// and KUBERNETES_SERVICE_PORT.
struct InClusterOptions {
  std::string host;  // e.g. "10.96.0.1" (IPv6 literals are bracketed for you)
  std::string port;  // e.g. "443"
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  // Optional: the pod's namespace; missing file -> "default".
  std::string namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

absl::StatusOr<KubeConfig> LoadInClusterConfig(const InClusterOptions& options);

// The operator's choice: the pod's service account when `in_cluster` (the API
// server from $KUBERNETES_SERVICE_HOST/PORT), else the kubeconfig file at
// `kubeconfig_path`; an error names the flags when neither is given.
absl::StatusOr<KubeConfig> LoadClientConfig(bool in_cluster, const std::string& kubeconfig_path);

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_KUBECONFIG_H_
