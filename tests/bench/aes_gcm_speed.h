// How fast one core seals and opens TLS 1.3 records (AES-128-GCM, the
// cipher the bulk data plane's TLS negotiates first, proto/bulk_tls.cc), in
// this process with this OpenSSL: the crypto a TLS push+pull cannot avoid.
// tests/bench/transport turns it into the ceiling of bulk_tls_ratio.
#ifndef KUBETRAIN_TESTS_BENCH_AES_GCM_SPEED_H_
#define KUBETRAIN_TESTS_BENCH_AES_GCM_SPEED_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace kubetrain {
namespace bench {

struct AesGcmSpeed {
  double seal_gbps = 0;  // encrypt + tag, 1e9 bytes/s of plaintext
  double open_gbps = 0;  // decrypt + tag check
};

// Seals `total_bytes` of data in `record_bytes` records (a fresh nonce
// each, as TLS does), then opens them all again, checking every tag. One
// thread. INTERNAL if OpenSSL fails or a tag does not verify.
absl::StatusOr<AesGcmSpeed> MeasureAesGcm(int64_t total_bytes, int64_t record_bytes = 16384);

// The best bulk_tls_ratio (TLS push+pull over plain push+pull) a machine with
// `cores` cores could reach if TLS added nothing but its crypto, given plain
// push+pull at `plain_gbps` (2 x model bytes per round) keeping `busy_cores`
// busy (worker + PS CPU seconds per second): every byte moved is sealed once
// and opened once, which costs crypto_per_s = plain_gbps * (1/seal + 1/open)
// cores per second of plain transfer; at best it runs on the idle cores,
// then the time stretches: min(1, cores / (busy_cores + crypto_per_s)).
double TlsCryptoBoundRatio(double plain_gbps, double busy_cores, const AesGcmSpeed& speed,
                           int cores);

}  // namespace bench
}  // namespace kubetrain

#endif  // KUBETRAIN_TESTS_BENCH_AES_GCM_SPEED_H_
