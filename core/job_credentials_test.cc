#include "core/job_credentials.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <string>

#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// Computed independently, with
//   printf %s kubetrain/v1/worker/0 | openssl dgst -sha256 -hmac "$KEY"
// (OpenSSL 3.0.19's command line) for kKey and each message.
TEST(TaskTokenTest, MatchesAnIndependentHmacSha256) {
  EXPECT_EQ(TaskToken(kKey, "worker", 0),
            "0df43a27d6ab29eba57a49c68aee4b48ede658bc895c5a41e2a04ebe92736bc5");
  EXPECT_EQ(TaskToken(kKey, "worker", 3),
            "488f54cd1586a03ddac6f449e0cee627f3aa08e7ee1336424c71784dc13460a9");
  EXPECT_EQ(TaskToken(kKey, "chief", 0),
            "048aa065fe185555c85bf39a5343a1fe29fe465536c652b3bb02c12f88ec4bfd");
  EXPECT_EQ(TaskToken(kKey, "exporter", 0),
            "f429b97aa0f6732d27f768c07a6a6894695e59e029d805692d87aca392ec3da4");
}

TEST(TaskTokenTest, DiffersByKeyTypeAndIndex) {
  absl::StatusOr<JobCredentials> other = GenerateJobCredentials("other", false);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(TaskToken(kKey, "worker", 1), TaskToken(other->job_key, "worker", 1));
  EXPECT_NE(TaskToken(kKey, "worker", 1), TaskToken(kKey, "worker", 10));
  EXPECT_NE(TaskToken(kKey, "worker", 0), TaskToken(kKey, "evaluator", 0));
}

TEST(TokensEqualTest, EqualOnlyForTheSameBytes) {
  const std::string token = TaskToken(kKey, "worker", 0);
  EXPECT_TRUE(TokensEqual(token, std::string(token)));
  EXPECT_TRUE(TokensEqual("", ""));
  std::string last_differs = token;
  last_differs.back() = last_differs.back() == '0' ? '1' : '0';
  EXPECT_FALSE(TokensEqual(token, last_differs));
  std::string first_differs = token;
  first_differs.front() = first_differs.front() == '0' ? '1' : '0';
  EXPECT_FALSE(TokensEqual(token, first_differs));
  EXPECT_FALSE(TokensEqual(token, token.substr(0, 63)));  // a prefix is not the token
  EXPECT_FALSE(TokensEqual(token, token + "0"));
  EXPECT_FALSE(TokensEqual(token, ""));
  // Bytes past a NUL still count (not a C-string compare).
  EXPECT_FALSE(TokensEqual(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(GenerateJobCredentialsTest, KeyIsFreshLowercaseHex) {
  absl::StatusOr<JobCredentials> a = GenerateJobCredentials("job", false);
  absl::StatusOr<JobCredentials> b = GenerateJobCredentials("job", false);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->job_key.size(), 64u);
  EXPECT_EQ(a->job_key.find_first_not_of("0123456789abcdef"), std::string::npos) << a->job_key;
  EXPECT_NE(a->job_key, b->job_key);
  EXPECT_EQ(a->ca_cert_pem, "");
  EXPECT_EQ(a->cert_pem, "");
  EXPECT_EQ(a->key_pem, "");
}

// Test-side OpenSSL helpers, independent of the code under test.
X509* ParsePem(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return cert;
}

std::string CommonName(X509* cert) {
  char cn[256] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
  return cn;
}

// X509_verify_cert of `leaf_pem` under `ca_pem` as a TLS peer named
// kTaskTlsName with `purpose` (X509_PURPOSE_SSL_SERVER/CLIENT); "" if it
// verifies, else OpenSSL's reason.
std::string Verify(const std::string& ca_pem, const std::string& leaf_pem, int purpose) {
  X509* ca = ParsePem(ca_pem);
  X509* leaf = ParsePem(leaf_pem);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(ctx), kTaskTlsName, 0);
  std::string result = X509_verify_cert(ctx) == 1
                           ? ""
                           : X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(leaf);
  X509_free(ca);
  return result;
}

TEST(GenerateJobCredentialsTest, TaskCertificateVerifiesUnderItsOwnCaOnly) {
  absl::StatusOr<JobCredentials> job = GenerateJobCredentials("mnist", true);
  absl::StatusOr<JobCredentials> other = GenerateJobCredentials("mnist", true);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(Verify(job->ca_cert_pem, job->cert_pem, X509_PURPOSE_SSL_SERVER), "");
  EXPECT_EQ(Verify(job->ca_cert_pem, job->cert_pem, X509_PURPOSE_SSL_CLIENT), "");
  // Another job's CA, even with the same job name, does not vouch for it.
  EXPECT_EQ(Verify(other->ca_cert_pem, job->cert_pem, X509_PURPOSE_SSL_SERVER),
            "unable to get local issuer certificate");
  EXPECT_EQ(Verify(job->ca_cert_pem, other->cert_pem, X509_PURPOSE_SSL_CLIENT),
            "unable to get local issuer certificate");
}

TEST(GenerateJobCredentialsTest, CertificateShapes) {
  absl::StatusOr<JobCredentials> job = GenerateJobCredentials("mnist", true);
  ASSERT_TRUE(job.ok()) << job.status();
  X509* ca = ParsePem(job->ca_cert_pem);
  X509* leaf = ParsePem(job->cert_pem);
  ASSERT_NE(ca, nullptr);
  ASSERT_NE(leaf, nullptr);
  EXPECT_EQ(CommonName(ca), "kubetrain job mnist CA");
  EXPECT_EQ(X509_check_ca(ca), 1);
  EXPECT_TRUE(X509_get_key_usage(ca) & KU_KEY_CERT_SIGN);
  EXPECT_EQ(X509_check_ca(leaf), 0);
  EXPECT_EQ(X509_check_host(leaf, kTaskTlsName, 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_host(leaf, "localhost", 0, 0, nullptr), 0);
  EXPECT_TRUE(X509_get_extended_key_usage(leaf) & XKU_SSL_SERVER);
  EXPECT_TRUE(X509_get_extended_key_usage(leaf) & XKU_SSL_CLIENT);
  EXPECT_EQ(EVP_PKEY_get_base_id(X509_get0_pubkey(leaf)), EVP_PKEY_EC);
  // Valid from about an hour ago for kCertificateValidityDays.
  int days = 0;
  int seconds = 0;
  ASSERT_EQ(ASN1_TIME_diff(&days, &seconds, X509_get0_notBefore(leaf), X509_get0_notAfter(leaf)),
            1);
  EXPECT_EQ(days, kCertificateValidityDays);
  EXPECT_EQ(seconds, 3600);
  EXPECT_LT(X509_cmp_current_time(X509_get0_notBefore(leaf)), 0);
  EXPECT_NE(job->key_pem.find("-----BEGIN PRIVATE KEY-----"), std::string::npos);
  X509_free(leaf);
  X509_free(ca);
}

TEST(GenerateJobCredentialsTest, LongJobNameIsCutToTheCommonNameLimit) {
  const std::string name(48, 'j');  // metadata.name's limit
  absl::StatusOr<JobCredentials> job = GenerateJobCredentials(name, true);
  ASSERT_TRUE(job.ok()) << job.status();
  X509* ca = ParsePem(job->ca_cert_pem);
  EXPECT_EQ(CommonName(ca), "kubetrain job " + std::string(47, 'j') + " CA");
  X509_free(ca);
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(TaskCredentialsFilesTest, RoundTripWithPrivateModes) {
  absl::StatusOr<JobCredentials> job = GenerateJobCredentials("mnist", true);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string dir = NewTestDir("auth");
  TaskCredentials written;
  written.job_key = job->job_key;
  written.token = TaskToken(job->job_key, "worker", 1);
  written.ca_cert_pem = job->ca_cert_pem;
  written.cert_pem = job->cert_pem;
  written.key_pem = job->key_pem;
  ASSERT_TRUE(WriteTaskCredentials(dir, written).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
  for (const char* name : {kJobKeyFile, kTokenFile, kCaCertFile, kCertFile, kKeyFile}) {
    EXPECT_EQ(ModeOf(dir + "/" + name), 0600u) << name;
  }
  absl::StatusOr<TaskCredentials> read = ReadTaskCredentials(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_key, written.job_key);
  EXPECT_EQ(read->token, written.token);
  EXPECT_EQ(read->ca_cert_pem, written.ca_cert_pem);
  EXPECT_EQ(read->cert_pem, written.cert_pem);
  EXPECT_EQ(read->key_pem, written.key_pem);
  EXPECT_TRUE(read->tls());
}

TEST(TaskCredentialsFilesTest, OnlyNonEmptyFilesAreWrittenAndAnExistingDirIsMadePrivate) {
  const std::string dir = NewTestDir("auth");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  TaskCredentials written;
  written.token = TaskToken(kKey, "chief", 0);
  ASSERT_TRUE(WriteTaskCredentials(dir, written).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{kTokenFile});
  absl::StatusOr<TaskCredentials> read = ReadTaskCredentials(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_key, "");
  EXPECT_EQ(read->token, written.token);
  EXPECT_FALSE(read->tls());
}

TEST(TaskCredentialsFilesTest, WriteErrorNamesTheDirectory) {
  const std::string dir = NewTestDir("auth") + "/missing-parent/task";
  TaskCredentials creds;
  creds.token = TaskToken(kKey, "worker", 0);
  absl::Status s = WriteTaskCredentials(dir, creds);
  EXPECT_FALSE(s.ok());
  EXPECT_CONTAINS(std::string(s.message()), "cannot create directory " + dir);
}

TEST(TaskCredentialsFilesTest, SecretsMayEndInANewline) {
  const std::string dir = NewTestDir("auth");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  WriteFile(dir + "/job.key", std::string(kKey) + "\n");
  absl::StatusOr<TaskCredentials> read = ReadTaskCredentials(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_key, kKey);
}

// The error of ReadTaskCredentials on `dir`.
std::string ReadError(const std::string& dir) {
  absl::StatusOr<TaskCredentials> read = ReadTaskCredentials(dir);
  EXPECT_FALSE(read.ok());
  return read.ok() ? "" : std::string(read.status().message());
}

TEST(TaskCredentialsFilesTest, ReadErrorsNameTheFile) {
  const std::string missing = NewTestDir("auth");
  EXPECT_EQ(ReadError(missing), "auth directory " + missing + ": No such file or directory");

  const std::string dir = NewTestDir("auth");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  WriteFile(dir + "/job.key", "not-a-key");
  EXPECT_EQ(ReadError(dir), dir +
                                "/job.key: must be 64 lowercase hex characters, got 9 characters "
                                "(not all hex)");
  WriteFile(dir + "/job.key", std::string(64, 'A'));
  EXPECT_EQ(ReadError(dir),
            dir + "/job.key: must be 64 lowercase hex characters, got 64 characters (not all hex)");
  WriteFile(dir + "/job.key", kKey);
  ASSERT_EQ(::mkdir((dir + "/token").c_str(), 0700), 0);
  EXPECT_EQ(ReadError(dir), dir + "/token: not a regular file");
}

TEST(TaskCredentialsFilesTest, TlsFilesMustBeCompleteAndBelongTogether) {
  absl::StatusOr<JobCredentials> job = GenerateJobCredentials("mnist", true);
  absl::StatusOr<JobCredentials> other = GenerateJobCredentials("mnist", true);
  ASSERT_TRUE(job.ok() && other.ok());
  const std::string dir = NewTestDir("auth");
  TaskCredentials creds;
  creds.token = TaskToken(job->job_key, "worker", 0);
  creds.ca_cert_pem = job->ca_cert_pem;
  ASSERT_TRUE(WriteTaskCredentials(dir, creds).ok());
  EXPECT_EQ(ReadError(dir), dir + "/tls.crt: missing, but " + dir +
                                "/ca.crt is there (TLS needs ca.crt, tls.crt and tls.key)");

  WriteFile(dir + "/tls.crt", job->cert_pem);
  WriteFile(dir + "/tls.key", other->key_pem);
  EXPECT_EQ(ReadError(dir),
            dir + "/tls.key: not the key of the certificate in " + dir + "/tls.crt");

  // Another job's certificate and key under this job's CA.
  WriteFile(dir + "/tls.crt", other->cert_pem);
  EXPECT_EQ(ReadError(dir), dir + "/tls.crt: not valid under " + dir +
                                "/ca.crt: unable to get local issuer certificate (the files must "
                                "come from the same job's credentials)");

  WriteFile(dir + "/ca.crt", "garbage");
  EXPECT_CONTAINS(ReadError(dir), dir + "/ca.crt: not a PEM certificate (");
  WriteFile(dir + "/ca.crt", job->ca_cert_pem);
  WriteFile(dir + "/tls.crt", job->cert_pem);
  WriteFile(dir + "/tls.key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
  EXPECT_CONTAINS(ReadError(dir), dir + "/tls.key: not a PEM private key (");

  WriteFile(dir + "/tls.key", job->key_pem);
  absl::StatusOr<TaskCredentials> read = ReadTaskCredentials(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->tls());
}

TEST(CredentialsForTaskTest, PsTasksGetTheKeyOthersTheirToken) {
  absl::StatusOr<JobCredentials> job = GenerateJobCredentials("mnist", true);
  ASSERT_TRUE(job.ok()) << job.status();
  const TaskCredentials ps = CredentialsForTask(*job, "ps", 1);
  EXPECT_EQ(ps.job_key, job->job_key);
  EXPECT_EQ(ps.token, "");
  const TaskCredentials worker = CredentialsForTask(*job, "worker", 1);
  EXPECT_EQ(worker.job_key, "");
  EXPECT_EQ(worker.token, TaskToken(job->job_key, "worker", 1));
  for (const TaskCredentials* task : {&ps, &worker}) {
    EXPECT_EQ(task->ca_cert_pem, job->ca_cert_pem);
    EXPECT_EQ(task->cert_pem, job->cert_pem);
    EXPECT_EQ(task->key_pem, job->key_pem);
  }
  absl::StatusOr<JobCredentials> plain = GenerateJobCredentials("mnist", false);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(CredentialsForTask(*plain, "chief", 0).tls());
}

TEST(CallerCredentialsTest, TheTokenFileOrOneDerivedFromTheJobKey) {
  const std::string dir = NewTestDir("auth");
  TaskCredentials files;
  files.token = TaskToken(kKey, "worker", 2);
  ASSERT_TRUE(WriteTaskCredentials(dir, files).ok());
  absl::StatusOr<CallerCredentials> worker = ReadCallerCredentials(dir, "worker", 2);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->task, "worker/2");
  EXPECT_EQ(worker->token, files.token);
  EXPECT_FALSE(worker->tls());

  const std::string launcher = NewTestDir("auth");
  files = TaskCredentials();
  files.job_key = kKey;
  ASSERT_TRUE(WriteTaskCredentials(launcher, files).ok());
  absl::StatusOr<CallerCredentials> exporter = ReadCallerCredentials(launcher, "exporter", 0);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  EXPECT_EQ(exporter->task, "exporter/0");
  EXPECT_EQ(exporter->token, "f429b97aa0f6732d27f768c07a6a6894695e59e029d805692d87aca392ec3da4");

  const std::string empty = NewTestDir("auth");
  ASSERT_EQ(::mkdir(empty.c_str(), 0700), 0);
  absl::StatusOr<CallerCredentials> none = ReadCallerCredentials(empty, "worker", 0);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "auth directory " + empty +
                                         ": has neither token nor job.key (the task's "
                                         "credentials are missing)");
}

}  // namespace
}  // namespace kubetrain
