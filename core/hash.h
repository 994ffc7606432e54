// Hashes whose values are part of kubetrain's contracts (hash buckets, crossed
// columns, dynamic-column ids, initial values, data shards): unlike std::hash
// they are the same on every standard library and platform, so every task,
// `kubetrain eval` and a rerun compute the same numbers.
#ifndef KUBETRAIN_CORE_HASH_H_
#define KUBETRAIN_CORE_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace kubetrain {

// FNV-1a, 64 bits, over the bytes of `s`.
inline uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// SplitMix64's output for state x (x + the golden-ratio increment, then the
// finalizer): every input bit reaches every output bit, so consecutive or
// nearby inputs give unrelated outputs (and SplitMix64(key + k) for k = 0, 1,
// ... is SplitMix64's stream from `key`).
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_HASH_H_
