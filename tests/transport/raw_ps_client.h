// Test-only: a client of the PS's gRPC service that sends arbitrary bytes as
// requests (what a buggy or hostile client could send), and can end a push
// stream the way it likes (half-close or cancel). Used by the transport tests
// and the wire fuzzer.
#ifndef KUBETRAIN_TESTS_TRANSPORT_RAW_PS_CLIENT_H_
#define KUBETRAIN_TESTS_TRANSPORT_RAW_PS_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "proto/ps.pb.h"

namespace kubetrain {

class RawPsClient {
 public:
  // `metadata` goes with every call (e.g. a task's x-kubetrain-task and
  // authorization, right or wrong).
  using Metadata = std::vector<std::pair<std::string, std::string>>;
  explicit RawPsClient(std::shared_ptr<grpc::Channel> channel, Metadata metadata = {})
      : channel_(std::move(channel)), metadata_(std::move(metadata)) {}

  // A unary call of ParameterServer.`method` ("GetInfo", "Leave", ...).
  grpc::Status Unary(const std::string& method, const std::string& request, std::string* response,
                     absl::Duration timeout = absl::Seconds(10));
  // A Pull; the raw messages read go to *messages (may be null).
  grpc::Status Pull(const std::string& request, std::vector<std::string>* messages,
                    absl::Duration timeout = absl::Seconds(10));

  enum class End { kHalfClose, kCancel };
  // A Push stream of `messages` (each one encoded message). `before_end` runs
  // after the last write and before the stream is ended with `end`.
  grpc::Status Push(const std::vector<std::string>& messages, End end, std::string* response,
                    const std::function<void()>& before_end = nullptr,
                    absl::Duration timeout = absl::Seconds(10));

 private:
  // A context with the deadline and the metadata.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;

  std::shared_ptr<grpc::Channel> channel_;
  const Metadata metadata_;
};

struct PartGradient {
  std::string part;
  std::vector<float> values;
};
// A valid push, encoded: the header, then each part in chunks of at most
// `chunk_elements`.
std::vector<std::string> EncodePush(const v1::PushRequest::Header& header,
                                    const std::vector<PartGradient>& grads, size_t chunk_elements);

}  // namespace kubetrain

#endif  // KUBETRAIN_TESTS_TRANSPORT_RAW_PS_CLIENT_H_
