#include "tests/bench/aes_gcm_speed.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "tests/bench/bench_util.h"

namespace kubetrain {
namespace bench {
namespace {

constexpr int kTagBytes = 16;
constexpr int kNonceBytes = 12;

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};

// Seals (encrypt) or opens (!encrypt) records [0, n) of `in` into `out`, each
// with nonce = its index, its tag in tags[i]; false on any OpenSSL failure
// or a tag that does not verify.
bool RunRecords(bool encrypt, const unsigned char* key, const std::vector<unsigned char>& in,
                std::vector<unsigned char>* out, std::vector<unsigned char>* tags,
                int64_t record_bytes) {
  std::unique_ptr<EVP_CIPHER_CTX, CtxFree> ctx(EVP_CIPHER_CTX_new());
  if (!ctx || EVP_CipherInit_ex(ctx.get(), EVP_aes_128_gcm(), nullptr, key, nullptr,
                                encrypt ? 1 : 0) != 1) {
    return false;
  }
  const int64_t records = static_cast<int64_t>(in.size()) / record_bytes;
  for (int64_t i = 0; i < records; ++i) {
    unsigned char nonce[kNonceBytes] = {};
    std::memcpy(nonce, &i, sizeof(i));
    unsigned char* tag = tags->data() + i * kTagBytes;
    int n = 0, final_n = 0;
    if (EVP_CipherInit_ex(ctx.get(), nullptr, nullptr, nullptr, nonce, -1) != 1) return false;
    if (!encrypt && EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) != 1) {
      return false;
    }
    if (EVP_CipherUpdate(ctx.get(), out->data() + i * record_bytes, &n,
                         in.data() + i * record_bytes, static_cast<int>(record_bytes)) != 1 ||
        EVP_CipherFinal_ex(ctx.get(), out->data() + i * record_bytes + n, &final_n) != 1) {
      return false;  // opening: the tag did not verify
    }
    if (encrypt && EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) != 1) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<AesGcmSpeed> MeasureAesGcm(int64_t total_bytes, int64_t record_bytes) {
  if (record_bytes <= 0 || total_bytes < record_bytes) {
    return absl::InvalidArgumentError("aes-gcm: total_bytes must hold at least one record");
  }
  const int64_t records = total_bytes / record_bytes;
  std::vector<unsigned char> plain(records * record_bytes), sealed(plain.size()),
      opened(plain.size()), tags(records * kTagBytes);
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<unsigned char>(i * 131 + 7);
  const unsigned char key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const double t0 = NowSeconds();
  const bool sealed_ok = RunRecords(true, key, plain, &sealed, &tags, record_bytes);
  const double t1 = NowSeconds();
  const bool opened_ok = sealed_ok && RunRecords(false, key, sealed, &opened, &tags, record_bytes);
  const double t2 = NowSeconds();
  if (!opened_ok || opened != plain) {
    return absl::InternalError("aes-gcm: OpenSSL failed or a record did not open to its plaintext");
  }
  const double bytes = static_cast<double>(plain.size());
  return AesGcmSpeed{bytes / (t1 - t0) / 1e9, bytes / (t2 - t1) / 1e9};
}

double TlsCryptoBoundRatio(double plain_gbps, double busy_cores, const AesGcmSpeed& speed,
                           int cores) {
  if (plain_gbps <= 0 || busy_cores < 0 || speed.seal_gbps <= 0 || speed.open_gbps <= 0 ||
      cores <= 0) {
    return 0;
  }
  const double crypto_per_s = plain_gbps * (1.0 / speed.seal_gbps + 1.0 / speed.open_gbps);
  return std::min(1.0, cores / (busy_cores + crypto_per_s));
}

}  // namespace bench
}  // namespace kubetrain
