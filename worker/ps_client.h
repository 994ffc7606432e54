// The worker's view of the parameter servers: one ShardChannel per PS task
// (the transport seam; gRPC today) and a PsClient that fans pulls and pushes
// out over all shards in parallel and maps parts onto whole variables.
//
// Key contract (as in ps-lite): every variable of the model lives on exactly
// one shard or is split by rows over several (core/placement.h); a pull fills
// every element of every variable, a push sends every element of every
// gradient. Params/grads are laid out as Model::variables().
#ifndef KUBETRAIN_WORKER_PS_CLIENT_H_
#define KUBETRAIN_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/model.h"
#include "core/placement.h"
#include "proto/ps.pb.h"

namespace prometheus {
class Counter;
class Histogram;
}  // namespace prometheus

namespace kubetrain {

// A contiguous run of float32 elements of one part.
struct ChunkRef {
  const std::string* part;
  uint64_t offset;  // elements
  const float* data;
  uint64_t count;   // elements
};

// One PS task. Implementations must be thread-safe.
class ShardChannel {
 public:
  virtual ~ShardChannel() = default;
  virtual absl::StatusOr<v1::ShardInfo> GetInfo(int worker, absl::Duration timeout) = 0;
  // Streams the shard's values into `sink`, chunk by chunk, after the PS's hold.
  virtual absl::StatusOr<v1::PullResponse::Header> Pull(
      const v1::PullRequest& request, const std::function<absl::Status(const v1::TensorChunk&)>& sink) = 0;
  virtual absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                                const std::vector<ChunkRef>& chunks) = 0;
  virtual absl::Status Leave(int worker) = 0;
  virtual absl::StatusOr<v1::ShardStats> Shutdown(int worker) = 0;
};

// A gRPC channel to `address` ("host:port"); messages never exceed
// chunk_bytes plus framing, on both ends.
std::unique_ptr<ShardChannel> NewGrpcShardChannel(const std::string& address, int64_t chunk_bytes);

struct PsClientMetrics {  // any pointer may be null
  prometheus::Histogram* pull_seconds = nullptr;
  prometheus::Histogram* push_seconds = nullptr;
  prometheus::Counter* pull_bytes = nullptr;
  prometheus::Counter* push_bytes = nullptr;
};

class PsClient {
 public:
  struct Options {
    int worker_index = 0;
    std::string fingerprint;       // expected from every shard
    int64_t chunk_bytes = 1 << 20;
    absl::Duration retry_timeout = absl::Seconds(300);  // PS unreachable: retry this long
    absl::Duration hold_timeout = absl::Seconds(30);    // one held pull; re-issued after
  };
  struct PullResult {
    int64_t version = 0;        // lowest version over shards (the global step)
    bool done = false;          // every shard reached the target
    double waited_seconds = 0;  // longest hold over shards
    int64_t steps_lost = 0;     // versions lost by shards that restarted from a checkpoint
  };
  struct PushResult {
    int64_t version = 0;
    bool dropped = false;
    bool done = false;
    int64_t staleness = 0;  // largest over shards
  };

  // `placement` and `clock` must outlive the client. channels[i] talks to ps task i.
  PsClient(Options options, const Placement* placement, const Clock* clock,
           std::vector<std::unique_ptr<ShardChannel>> channels, PsClientMetrics metrics);

  // Handshake with every shard, retrying unreachable ones with exponential
  // backoff until options.retry_timeout (their DNS names may not resolve yet).
  // Fails at once on a fingerprint mismatch (different model or placement).
  absl::Status Connect();
  // Steps this worker had done before it (re)started, as the shards recall
  // (valid after Connect): a restarted worker resumes its clock from here.
  int64_t resume_clock() const { return resume_clock_; }

  // Fills `params` (resized to the model layout). With `next_version`, each
  // shard holds the pull until its version passes the one last pulled from it
  // (the sync barrier); the shard may also hold it for bounded staleness
  // (worker_clock). A shard that restarted answers at once; its lost
  // versions are reported in steps_lost.
  absl::StatusOr<PullResult> Pull(bool next_version, int64_t worker_clock,
                                  const std::vector<VariableSpec>& variables, Params* params);
  // Like Pull, but waits until every shard has reached `version`.
  absl::StatusOr<PullResult> PullAtLeast(int64_t version, int64_t worker_clock,
                                         const std::vector<VariableSpec>& variables, Params* params);
  // Pushes each shard its part of `grads`, tagged with the version and
  // incarnation last pulled from that shard.
  absl::StatusOr<PushResult> Push(const Params& grads, int64_t worker_clock);
  absl::Status Leave();
  // Chief only: ends training on every shard and returns the summed stats.
  absl::StatusOr<v1::ShardStats> Shutdown();

 private:
  // Per-shard state from the last pull; each element is written only by the
  // thread serving that shard.
  struct ShardState {
    int64_t version = 0;
    int64_t incarnation = 0;
    bool done = false;
  };
  absl::StatusOr<PullResult> PullImpl(const std::function<int64_t(int)>& min_version,
                                      int64_t worker_clock,
                                      const std::vector<VariableSpec>& variables, Params* params);
  // Runs fn(shard) for every shard concurrently; the first error wins.
  absl::Status ForEachShard(const std::function<absl::Status(int)>& fn);
  // Retries fn while it returns UNAVAILABLE, with backoff, until retry_timeout.
  absl::Status WithRetry(const std::string& what, int shard, const std::function<absl::Status()>& fn);

  const Options options_;
  const Placement* const placement_;
  const Clock* const clock_;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  const PsClientMetrics metrics_;
  std::vector<ShardState> shards_;
  int64_t resume_clock_ = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_WORKER_PS_CLIENT_H_
