#include "operator/kubeconfig.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

// gtest only (gmock is not among the system deps).
#define EXPECT_CONTAINS(haystack, needle)          \
  EXPECT_TRUE(absl::StrContains(haystack, needle)) \
      << "expected to contain \"" << (needle) << "\":\n  " << (haystack)

constexpr char kCaPem[] = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
constexpr char kCertPem[] = "-----BEGIN CERTIFICATE-----\nMIIBclient\n-----END CERTIFICATE-----\n";
constexpr char kKeyPem[] = "-----BEGIN PRIVATE KEY-----\nMIIBkey\n-----END PRIVATE KEY-----\n";

class KubeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/kubeconfig_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }

  std::string Write(const std::string& name, const std::string& content) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  std::string dir_;
};

std::string B64(const std::string& s) { return absl::Base64Escape(s); }

TEST_F(KubeConfigTest, TokenKubeconfigWithCaData) {
  std::string path = Write("config", R"(apiVersion: v1
kind: Config
clusters:
- name: other
  cluster: {server: "https://10.0.0.9:443"}
- name: kubetrain
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority-data: )" + B64(kCaPem) +
                                         R"(
users:
- name: admin
  user:
    token: s3cret
contexts:
- name: kubetrain
  context: {cluster: kubetrain, user: admin, namespace: training}
current-context: kubetrain
)");
  absl::StatusOr<KubeConfig> cfg = LoadKubeConfigFile(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://127.0.0.1:6443");  // trailing slash dropped
  EXPECT_EQ(cfg->ca_pem, kCaPem);
  EXPECT_FALSE(cfg->insecure_skip_tls_verify);
  EXPECT_EQ(cfg->bearer_token, "s3cret");
  EXPECT_TRUE(cfg->token_file.empty());
  EXPECT_TRUE(cfg->client_cert_pem.empty());
  EXPECT_EQ(cfg->namespace_, "training");
  EXPECT_CONTAINS(cfg->source, "context kubetrain");
}

TEST_F(KubeConfigTest, ClientCertKubeconfigWithExplicitContext) {
  std::string path = Write("config", R"(apiVersion: v1
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1234
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    client-certificate-data: )" + B64(kCertPem) +
                                         R"(
    client-key-data: )" + B64(kKeyPem) + R"(
contexts:
- name: a
  context: {cluster: nope, user: u}
- name: b
  context: {cluster: c, user: u}
current-context: a
)");
  absl::StatusOr<KubeConfig> cfg = LoadKubeConfigFile(path, "b");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://127.0.0.1:1234");
  EXPECT_TRUE(cfg->insecure_skip_tls_verify);
  EXPECT_TRUE(cfg->ca_pem.empty());
  EXPECT_EQ(cfg->client_cert_pem, kCertPem);
  EXPECT_EQ(cfg->client_key_pem, kKeyPem);
  EXPECT_TRUE(cfg->bearer_token.empty());
  EXPECT_EQ(cfg->namespace_, "default");
}

TEST_F(KubeConfigTest, FilesAreResolvedRelativeToTheKubeconfig) {
  Write("ca.crt", kCaPem);
  Write("client.crt", kCertPem);
  Write("client.key", kKeyPem);
  Write("token", "  tok-from-file\n");
  std::string path = Write("config", R"(
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", certificate-authority: ca.crt}
users:
- name: u
  user: {tokenFile: token, client-certificate: client.crt, client-key: )" +
                                         dir_ + R"(/client.key}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
)");
  absl::StatusOr<KubeConfig> cfg = LoadKubeConfigFile(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->ca_pem, kCaPem);
  EXPECT_EQ(cfg->bearer_token, "tok-from-file");
  EXPECT_EQ(cfg->token_file, dir_ + "/token");
  EXPECT_EQ(cfg->client_cert_pem, kCertPem);
  EXPECT_EQ(cfg->client_key_pem, kKeyPem);
}

TEST_F(KubeConfigTest, MissingFileIsNotFound) {
  auto cfg = LoadKubeConfigFile(dir_ + "/nope");
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(cfg.status().message(), dir_ + "/nope");
}

struct BadCase {
  const char* name;
  std::string yaml;
  std::string want_substr;
};

TEST_F(KubeConfigTest, MissingOrBadFieldsNameTheFileAndField) {
  const std::string ctx =
      "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
  const std::string user = "users:\n- name: u\n  user: {token: t}\n";
  const std::string cluster =
      "clusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\n";
  const std::vector<BadCase> cases = {
      {"no current-context", cluster + user + "contexts: []\n", "current-context: missing"},
      {"unknown context", cluster + user + "contexts: []\ncurrent-context: x\n",
       "current-context: refers to contexts entry \"x\", which does not exist"},
      {"unknown cluster", user + ctx,
       "contexts[x].context.cluster: refers to clusters entry \"c\""},
      {"unknown user", cluster + ctx, "contexts[x].context.user: refers to users entry \"u\""},
      {"no server",
       "clusters:\n- name: c\n  cluster: {insecure-skip-tls-verify: true}\n" + user + ctx,
       "clusters[c].cluster.server: missing"},
      {"bad scheme", "clusters:\n- name: c\n  cluster: {server: \"127.0.0.1:6443\"}\n" + user + ctx,
       "clusters[c].cluster.server: must start with https://"},
      {"bad base64",
       "clusters:\n- name: c\n  cluster: {server: \"https://h\", certificate-authority-data: "
       "\"!!notb64\"}\n" +
           user + ctx,
       "clusters[c].cluster.certificate-authority-data: invalid base64"},
      {"missing ca file",
       "clusters:\n- name: c\n  cluster: {server: \"https://h\", certificate-authority: "
       "missing.crt}\n" +
           user + ctx,
       "clusters[c].cluster.certificate-authority: cannot read file"},
      {"cert without key",
       cluster + "users:\n- name: u\n  user: {client-certificate-data: " + B64(kCertPem) + "}\n" +
           ctx,
       "users[u].user.client-key-data: missing"},
      {"exec plugin", cluster + "users:\n- name: u\n  user: {exec: {command: aws}}\n" + ctx,
       "users[u].user.exec: not supported"},
      {"bad bool",
       "clusters:\n- name: c\n  cluster: {server: \"https://h\", insecure-skip-tls-verify: "
       "maybe}\n" +
           user + ctx,
       "insecure-skip-tls-verify: must be true or false"},
      // Syntax errors are found by the alias check, before the tree is loaded.
      {"not yaml", "clusters: [\n", "invalid YAML at line 2, column 1: end of sequence flow"},
      {"not a map", "- 1\n- 2\n", "expected a map"},
  };
  for (const BadCase& c : cases) {
    std::string path = Write("bad", c.yaml);
    auto cfg = LoadKubeConfigFile(path);
    ASSERT_FALSE(cfg.ok()) << c.name;
    EXPECT_CONTAINS(cfg.status().message(), path + ": ") << c.name;
    EXPECT_CONTAINS(cfg.status().message(), c.want_substr) << c.name << ": " << cfg.status();
  }
}

TEST_F(KubeConfigTest, AliasBombsAreRefusedWithTheirPosition) {
  const std::string valid =
      "clusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\n"
      "users:\n- name: u\n  user: {token: t}\n"
      "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
  ASSERT_TRUE(LoadKubeConfigFile(Write("ok", valid)).ok());
  // Ten anchors, each ten aliases of the previous one (10^9 nodes), under a
  // free-form map; the fourth *a4 of the a5 line crosses the limit.
  std::string bomb = "preferences:\n  a0: &a0 [lol]\n";
  for (int i = 1; i < 10; ++i) {
    bomb += "  a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 10; ++j) bomb += (j > 0 ? ", *a" : "*a") + std::to_string(i - 1);
    bomb += "]\n";
  }
  std::string path = Write("bomb", valid + bomb);
  auto cfg = LoadKubeConfigFile(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(cfg.status().message()),
            path +
                ": invalid YAML at line 17, column 27: alias *a4 would expand the document past "
                "100000 nodes (aliases of aliases multiply: an alias bomb)");
  // An alias inside its own node.
  path = Write("cycle", valid + "preferences: &p {again: *p}\n");
  cfg = LoadKubeConfigFile(path);
  ASSERT_FALSE(cfg.ok());
  EXPECT_CONTAINS(cfg.status().message(),
                  path +
                      ": invalid YAML at line 11, column 25: alias *p is inside the node it "
                      "names");
}

TEST_F(KubeConfigTest, InCluster) {
  InClusterOptions o;
  o.host = "10.96.0.1";
  o.port = "443";
  o.token_file = Write("token", "sa-token\n");
  o.ca_file = Write("ca.crt", kCaPem);
  o.namespace_file = Write("namespace", "kubetrain-system");
  auto cfg = LoadInClusterConfig(o);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://10.96.0.1:443");
  EXPECT_EQ(cfg->bearer_token, "sa-token");
  EXPECT_EQ(cfg->token_file, o.token_file);
  EXPECT_EQ(cfg->ca_pem, kCaPem);
  EXPECT_EQ(cfg->namespace_, "kubetrain-system");

  o.host = "fd00::1";
  o.namespace_file = dir_ + "/absent";
  cfg = LoadInClusterConfig(o);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://[fd00::1]:443");
  EXPECT_EQ(cfg->namespace_, "default");
}

TEST_F(KubeConfigTest, InClusterErrors) {
  InClusterOptions o;
  EXPECT_EQ(LoadInClusterConfig(o).status().code(), absl::StatusCode::kFailedPrecondition);
  o.host = "10.0.0.1";
  o.port = "443";
  o.token_file = dir_ + "/no-token";
  o.ca_file = Write("ca.crt", kCaPem);
  auto cfg = LoadInClusterConfig(o);
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(cfg.status().message(), dir_ + "/no-token");
  o.token_file = Write("token", "t");
  o.ca_file = Write("bad.crt", "garbage");
  cfg = LoadInClusterConfig(o);
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(cfg.status().message(), "bad.crt holds no PEM certificate");
}

TEST(LoadClientConfigTest, NeedsAKubeconfigOrInCluster) {
  auto none = LoadClientConfig(false, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--kubeconfig"), std::string::npos);
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  auto in_cluster = LoadClientConfig(true, "");
  ASSERT_FALSE(in_cluster.ok());
  EXPECT_NE(in_cluster.status().message().find("KUBERNETES_SERVICE_HOST"), std::string::npos);
  auto missing = LoadClientConfig(false, "/nonexistent/kubeconfig");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/kubeconfig"), std::string::npos);
}

}  // namespace
}  // namespace kubetrain
