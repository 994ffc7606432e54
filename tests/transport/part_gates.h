// What the transport tests of an overlapped push share (grpc_round_trip_test,
// bulk_round_trip_test): gates that open part by part, the gated chunks of a
// gradient, and values compared bit for bit.
#ifndef KUBETRAIN_TESTS_TRANSPORT_PART_GATES_H_
#define KUBETRAIN_TESTS_TRANSPORT_PART_GATES_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/placement.h"
#include "ps/shard_channel.h"

namespace kubetrain {

// One gate per part, all closed at first. Part i's gate opens with
// OpenFrom(j) for any j <= i: parts are readied last first, as backprop does.
class PartGates {
 public:
  explicit PartGates(size_t parts) : open_(parts) {
    for (size_t i = 0; i < parts; ++i) {
      gates_.push_back([this, i]() -> absl::Status {
        absl::MutexLock l(&mu_);
        auto ready = [this, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_ <= i; };
        mu_.Await(absl::Condition(&ready));
        return absl::OkStatus();
      });
    }
  }
  PartGates(const PartGates&) = delete;
  PartGates& operator=(const PartGates&) = delete;

  void OpenFrom(size_t i) {
    absl::MutexLock l(&mu_);
    open_ = i;
  }
  const RefReady* gate(size_t i) const { return &gates_[i]; }

 private:
  absl::Mutex mu_;
  size_t open_ ABSL_GUARDED_BY(mu_);
  std::vector<RefReady> gates_;
};

// `grads` (one vector per part of `parts`) as chunks of at most `piece`
// elements, last part first, each behind its part's gate.
inline std::vector<ChunkRef> GatedChunks(const std::vector<PartPlacement>& parts,
                                         const std::vector<std::vector<float>>& grads,
                                         const PartGates& gates, size_t piece = 10000) {
  std::vector<ChunkRef> chunks;
  for (size_t i = parts.size(); i-- > 0;) {
    for (size_t off = 0; off < grads[i].size(); off += piece) {
      chunks.push_back({&parts[i].name, off, grads[i].data() + off,
                        std::min(piece, grads[i].size() - off), gates.gate(i)});
    }
  }
  return chunks;
}

// Values by part name, bit for bit.
inline bool SameBits(const std::map<std::string, std::vector<float>>& a,
                     const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, v] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != v.size() ||
        std::memcmp(v.data(), it->second.data(), v.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace kubetrain

#endif  // KUBETRAIN_TESTS_TRANSPORT_PART_GATES_H_
