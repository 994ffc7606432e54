#include "core/job_credentials.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/file_env.h"

namespace kubetrain {
namespace {

constexpr size_t kJobKeyBytes = 32;
constexpr size_t kHexSecretChars = 64;      // a job key and a token alike
constexpr size_t kMaxCommonNameChars = 64;  // ub-common-name (RFC 5280)

template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
template <typename T, void (*Free)(T*)>
using OpenSslPtr = std::unique_ptr<T, OpenSslDeleter<T, Free>>;
using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using KeyPtr = OpenSslPtr<EVP_PKEY, EVP_PKEY_free>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using StorePtr = OpenSslPtr<X509_STORE, X509_STORE_free>;
using StoreCtxPtr = OpenSslPtr<X509_STORE_CTX, X509_STORE_CTX_free>;
using BignumPtr = OpenSslPtr<BIGNUM, BN_free>;

// OpenSSL's last error, emptying its (thread-local) error queue.
std::string OpenSslReason() {
  unsigned long code = 0;
  unsigned long last = 0;
  while ((code = ERR_get_error()) != 0) last = code;
  char text[256] = "unknown OpenSSL error";
  if (last != 0) ERR_error_string_n(last, text, sizeof(text));
  return text;
}

// An InternalError "<what>: <OpenSSL's last error>".
absl::Status OpenSslError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", OpenSslReason()));
}

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Generation.

absl::StatusOr<KeyPtr> NewP256Key() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("cannot generate an EC P-256 key");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return OpenSslError(absl::StrCat("cannot make extension ", value));
  int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return OpenSslError(absl::StrCat("cannot add extension ", value));
  return absl::OkStatus();
}

// A v3 certificate for `key` named `common_name`, valid as the header says,
// with a random 127-bit serial; not yet signed, no extensions.
absl::StatusOr<X509Ptr> NewCertificate(const std::string& common_name, EVP_PKEY* key) {
  X509Ptr cert(X509_new());
  if (cert == nullptr) return OpenSslError("cannot allocate a certificate");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("cannot draw a serial number");
  serial[0] &= 0x7f;  // positive
  BignumPtr bn(BN_bin2bn(serial, sizeof(serial), nullptr));
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_set_version(cert.get(), 2) != 1 || bn == nullptr ||
      BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get())) == nullptr ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400L * kCertificateValidityDays) ==
          nullptr ||
      X509_set_pubkey(cert.get(), key) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1) {
    return OpenSslError(absl::StrCat("cannot fill in the certificate ", common_name));
  }
  return cert;
}

absl::StatusOr<std::string> CertificatePem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) {
    return OpenSslError("cannot write a certificate as PEM");
  }
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> PrivateKeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("cannot write a private key as PEM");
  }
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

// Fills in the CA and task certificate of `creds`.
absl::Status GenerateTls(absl::string_view job_name, JobCredentials* creds) {
  absl::StatusOr<KeyPtr> ca_key = NewP256Key();
  if (!ca_key.ok()) return ca_key.status();
  const std::string prefix = "kubetrain job ";
  const std::string suffix = " CA";
  const size_t room = kMaxCommonNameChars - prefix.size() - suffix.size();
  absl::StatusOr<X509Ptr> ca =
      NewCertificate(absl::StrCat(prefix, job_name.substr(0, room), suffix), ca_key->get());
  if (!ca.ok()) return ca.status();
  X509* ca_cert = ca->get();
  if (X509_set_issuer_name(ca_cert, X509_get_subject_name(ca_cert)) != 1) {
    return OpenSslError("cannot name the CA's issuer");
  }
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                            std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                            std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(ca_cert, ca_cert, nid, value); !s.ok()) return s;
  }
  if (X509_sign(ca_cert, ca_key->get(), EVP_sha256()) == 0)
    return OpenSslError("cannot sign the CA");

  absl::StatusOr<KeyPtr> task_key = NewP256Key();
  if (!task_key.ok()) return task_key.status();
  absl::StatusOr<X509Ptr> task = NewCertificate(kTaskTlsName, task_key->get());
  if (!task.ok()) return task.status();
  X509* task_cert = task->get();
  if (X509_set_issuer_name(task_cert, X509_get_subject_name(ca_cert)) != 1) {
    return OpenSslError("cannot name the task certificate's issuer");
  }
  const std::string san = absl::StrCat("DNS:", kTaskTlsName);
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:FALSE"},
        std::pair{NID_key_usage, "critical,digitalSignature"},
        std::pair{NID_ext_key_usage, "serverAuth,clientAuth"},
        std::pair{NID_subject_alt_name, san.c_str()}, std::pair{NID_subject_key_identifier, "hash"},
        std::pair{NID_authority_key_identifier, "keyid:always"}}) {
    if (absl::Status s = AddExtension(task_cert, ca_cert, nid, value); !s.ok()) return s;
  }
  if (X509_sign(task_cert, ca_key->get(), EVP_sha256()) == 0) {
    return OpenSslError("cannot sign the task certificate");
  }

  absl::StatusOr<std::string> ca_pem = CertificatePem(ca_cert);
  absl::StatusOr<std::string> cert_pem = CertificatePem(task_cert);
  absl::StatusOr<std::string> key_pem = PrivateKeyPem(task_key->get());
  for (const auto* s : {&ca_pem, &cert_pem, &key_pem}) {
    if (!s->ok()) return s->status();
  }
  creds->ca_cert_pem = *std::move(ca_pem);
  creds->cert_pem = *std::move(cert_pem);
  creds->key_pem = *std::move(key_pem);
  return absl::OkStatus();  // ca_key is freed here: nothing can sign for this job again
}

// ---------------------------------------------------------------------------
// Reading.

// The file's content; "" (and *present false) if it does not exist.
absl::StatusOr<std::string> ReadOptionalFile(const std::string& path, bool* present) {
  absl::StatusOr<std::string> data = ReadWholeFile(path);
  *present = data.ok();
  if (absl::IsNotFound(data.status())) return std::string();
  return data;
}

absl::StatusOr<std::string> ReadHexSecret(const std::string& path) {
  bool present = false;
  absl::StatusOr<std::string> data = ReadOptionalFile(path, &present);
  if (!data.ok() || !present) return data;
  absl::string_view secret = absl::StripAsciiWhitespace(*data);
  if (secret.size() != kHexSecretChars || !IsLowerHex(secret)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": must be ", kHexSecretChars, " lowercase hex characters, got ",
                     secret.size(), " characters", IsLowerHex(secret) ? "" : " (not all hex)"));
  }
  return std::string(secret);
}

absl::StatusOr<X509Ptr> ParseCertificate(const std::string& path, const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PEM certificate (", OpenSslReason(), ")"));
  }
  return cert;
}

// Checks that the TLS files belong together: the key is the certificate's,
// and the certificate is valid under the CA now.
absl::Status CheckTlsFiles(const std::string& dir, const TaskCredentials& creds) {
  const std::string ca_path = absl::StrCat(dir, "/", kCaCertFile);
  const std::string cert_path = absl::StrCat(dir, "/", kCertFile);
  const std::string key_path = absl::StrCat(dir, "/", kKeyFile);
  absl::StatusOr<X509Ptr> ca = ParseCertificate(ca_path, creds.ca_cert_pem);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<X509Ptr> cert = ParseCertificate(cert_path, creds.cert_pem);
  if (!cert.ok()) return cert.status();
  BioPtr bio(BIO_new_mem_buf(creds.key_pem.data(), static_cast<int>(creds.key_pem.size())));
  KeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_path, ": not a PEM private key (", OpenSslReason(), ")"));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_path, ": not the key of the certificate in ", cert_path));
  }
  StorePtr store(X509_STORE_new());
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (store == nullptr || ctx == nullptr || X509_STORE_add_cert(store.get(), ca->get()) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert->get(), nullptr) != 1) {
    return OpenSslError(absl::StrCat("cannot check ", cert_path));
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(cert_path, ": not valid under ", ca_path, ": ",
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())),
                     " (the files must come from the same job's credentials)"));
  }
  return absl::OkStatus();
}

absl::Status WriteSecretFile(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return OsError(errno, absl::StrCat("cannot create ", path));
  absl::Status status;
  if (::fchmod(fd, 0600) != 0) status = OsError(errno, absl::StrCat("cannot chmod ", path));
  size_t off = 0;
  while (status.ok() && off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = OsError(errno, absl::StrCat("cannot write ", path));
      break;
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && status.ok()) status = OsError(errno, absl::StrCat("cannot write ", path));
  return status;
}

}  // namespace

absl::StatusOr<JobCredentials> GenerateJobCredentials(absl::string_view job_name, bool with_tls) {
  unsigned char key[kJobKeyBytes];
  if (RAND_bytes(key, sizeof(key)) != 1) return OpenSslError("cannot draw a job key");
  JobCredentials creds;
  creds.job_key =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(key), sizeof(key)));
  OPENSSL_cleanse(key, sizeof(key));
  if (with_tls) {
    if (absl::Status s = GenerateTls(job_name, &creds); !s.ok()) return s;
  }
  return creds;
}

std::string TaskToken(absl::string_view job_key, absl::string_view task_type, int index) {
  const std::string message = absl::StrCat("kubetrain/v1/", task_type, "/", index);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), job_key.data(), static_cast<int>(job_key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), mac_len));
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

TaskCredentials CredentialsForTask(const JobCredentials& job, absl::string_view task_type,
                                   int index) {
  TaskCredentials task;
  if (task_type == "ps") {
    task.job_key = job.job_key;
  } else {
    task.token = TaskToken(job.job_key, task_type, index);
  }
  task.ca_cert_pem = job.ca_cert_pem;
  task.cert_pem = job.cert_pem;
  task.key_pem = job.key_pem;
  return task;
}

std::string TaskMetadataValue(absl::string_view task_type, int index) {
  return absl::StrCat(task_type, "/", index);
}

absl::StatusOr<TaskCredentials> ReadTaskCredentials(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return OsError(errno, absl::StrCat("auth directory ", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("auth directory ", dir, ": not a directory"));
  }
  TaskCredentials creds;
  absl::StatusOr<std::string> job_key = ReadHexSecret(absl::StrCat(dir, "/", kJobKeyFile));
  if (!job_key.ok()) return job_key.status();
  creds.job_key = *std::move(job_key);
  absl::StatusOr<std::string> token = ReadHexSecret(absl::StrCat(dir, "/", kTokenFile));
  if (!token.ok()) return token.status();
  creds.token = *std::move(token);

  struct TlsFile {
    const char* name;
    std::string* pem;
    bool present = false;
  };
  TlsFile tls[] = {
      {kCaCertFile, &creds.ca_cert_pem}, {kCertFile, &creds.cert_pem}, {kKeyFile, &creds.key_pem}};
  int present = 0;
  for (TlsFile& f : tls) {
    absl::StatusOr<std::string> pem = ReadOptionalFile(absl::StrCat(dir, "/", f.name), &f.present);
    if (!pem.ok()) return pem.status();
    *f.pem = *std::move(pem);
    present += f.present ? 1 : 0;
  }
  if (present != 0 && present != 3) {
    const TlsFile& some = tls[0].present ? tls[0] : tls[1].present ? tls[1] : tls[2];
    const TlsFile& missing = !tls[0].present ? tls[0] : !tls[1].present ? tls[1] : tls[2];
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/", missing.name, ": missing, but ", dir, "/", some.name, " is there (TLS needs ",
        kCaCertFile, ", ", kCertFile, " and ", kKeyFile, ")"));
  }
  if (present == 3) {
    if (absl::Status s = CheckTlsFiles(dir, creds); !s.ok()) return s;
  }
  return creds;
}

absl::StatusOr<CallerCredentials> ReadCallerCredentials(const std::string& dir,
                                                        absl::string_view task_type, int index) {
  absl::StatusOr<TaskCredentials> files = ReadTaskCredentials(dir);
  if (!files.ok()) return files.status();
  CallerCredentials caller;
  caller.task = TaskMetadataValue(task_type, index);
  if (!files->job_key.empty()) {
    caller.token = TaskToken(files->job_key, task_type, index);
  } else if (!files->token.empty()) {
    caller.token = files->token;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("auth directory ", dir, ": has neither ",
                                                   kTokenFile, " nor ", kJobKeyFile,
                                                   " (the task's credentials are missing)"));
  }
  caller.ca_cert_pem = std::move(files->ca_cert_pem);
  caller.cert_pem = std::move(files->cert_pem);
  caller.key_pem = std::move(files->key_pem);
  return caller;
}

absl::Status WriteTaskCredentials(const std::string& dir, const TaskCredentials& creds) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return OsError(errno, absl::StrCat("cannot create directory ", dir));
  }
  // An existing directory (or a mkdir under a umask) is made private too.
  if (::chmod(dir.c_str(), 0700) != 0) return OsError(errno, absl::StrCat("cannot chmod ", dir));
  const std::pair<const char*, const std::string*> files[] = {{kJobKeyFile, &creds.job_key},
                                                              {kTokenFile, &creds.token},
                                                              {kCaCertFile, &creds.ca_cert_pem},
                                                              {kCertFile, &creds.cert_pem},
                                                              {kKeyFile, &creds.key_pem}};
  for (const auto& [name, data] : files) {
    if (data->empty()) continue;
    if (absl::Status s = WriteSecretFile(absl::StrCat(dir, "/", name), *data); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
