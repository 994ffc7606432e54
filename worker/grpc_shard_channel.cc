#include "worker/grpc_shard_channel.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/push_wire.h"
#include "proto/chunk_slices.h"
#include "proto/ps.grpc.pb.h"

namespace kubetrain {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  // The PS's service always sends text (ps/service.cc ToGrpcStatus); a status
  // without any was made by gRPC itself (a transport limit or a broken
  // connection), so say that rather than log an empty reason.
  if (s.error_message().empty()) {
    return absl::Status(
        static_cast<absl::StatusCode>(s.error_code()),
        absl::StrCat("gRPC ended the call with ",
                     absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
                     " and no message (from the transport, not the PS's service)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& msg) {
  grpc::Slice slice(msg.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// A pulled chunk read in place from its message (no copy until CopyTo).
class SlicePulledChunk final : public PulledChunk {
 public:
  explicit SlicePulledChunk(const ChunkSlices* chunk) : chunk_(chunk) {}
  absl::string_view part() const override { return chunk_->part(); }
  uint64_t offset() const override { return chunk_->offset(); }
  uint64_t data_bytes() const override { return chunk_->data_bytes(); }
  void CopyTo(char* out) const override { chunk_->CopyData(out); }

 private:
  const ChunkSlices* const chunk_;
};

// The answer stream of a Pull, or of a PushPull: the push's answer, the
// pull's header, and chunks, each chunk handed to the sink as it comes.
class PulledAnswers {
 public:
  // `what`: "pull from <address>" or the like, for errors.
  explicit PulledAnswers(std::string what) : what_(std::move(what)) {}
  // Takes one message. False once the stream should end: a message that is
  // not a PullResponse, or the sink failed (status() says which).
  bool Take(grpc::ByteBuffer* in, const ShardChannel::ChunkSink& sink) {
    ChunkSlices raw;
    if (raw.Parse(in)) {
      status_ = sink(SlicePulledChunk(&raw));
      return status_.ok();
    }
    msg_.Clear();
    if (!grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::PullResponse>(in, &msg_).ok()) {
      status_ = absl::DataLossError(absl::StrCat(what_, ": an answer is not a PullResponse"));
      return false;
    }
    if (msg_.has_push()) {
      push_ = msg_.push();
    } else if (msg_.has_header()) {
      header_ = msg_.header();
    } else {
      status_ = sink(FlatPulledChunk(msg_.chunk()));
      return status_.ok();
    }
    return true;
  }
  const absl::Status& status() const { return status_; }
  const std::optional<v1::PushResponse>& push() const { return push_; }
  const std::optional<v1::PullResponse::Header>& header() const { return header_; }

 private:
  const std::string what_;
  absl::Status status_;
  std::optional<v1::PushResponse> push_;
  std::optional<v1::PullResponse::Header> header_;
  v1::PullResponse msg_;  // reused: a chunk that protobuf had to parse
};

class GrpcShardChannel final : public ShardChannel {
 public:
  using ShardChannel::Push;
  GrpcShardChannel(const std::string& address, int64_t chunk_bytes, const CallerCredentials& caller)
      : address_(address),
        task_(caller.task),
        authorization_(absl::StrCat(kBearerPrefix, caller.token)),
        tls_(caller.tls()) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(chunk_bytes + (64 << 10)));
    args.SetMaxSendMessageSize(static_cast<int>(chunk_bytes + (64 << 10)));
    // Reconnect quickly after a PS restart instead of gRPC's default 1..120 s backoff.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // Pings find a PS that is gone without a word (its pod killed, a cut
    // link) while a pull is held; the PS accepts one every 10 s or more.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    if (tls_) {
      grpc::SslCredentialsOptions tls;
      tls.pem_root_certs = caller.ca_cert_pem;
      tls.pem_private_key = caller.key_pem;
      tls.pem_cert_chain = caller.cert_pem;
      credentials = grpc::SslCredentials(tls);
      // One certificate serves every task wherever it runs: its name is not the address.
      args.SetSslTargetNameOverride(kTaskTlsName);
    }
    channel_ = grpc::CreateCustomChannel(address, credentials, args);
    stub_ = v1::ParameterServer::NewStub(channel_);
  }

  absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request,
                                        absl::Duration timeout) override {
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    // Wait for the channel to connect (until the deadline) rather than failing
    // fast: a PS that is still starting is the normal case here.
    ctx.set_wait_for_ready(true);
    v1::ShardInfo info;
    auto s = stub_->GetInfo(&ctx, request, &info);
    if (!s.ok() && tls_ &&
        (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_code() == grpc::StatusCode::UNAVAILABLE)) {
      // A TLS handshake that fails looks like a PS that is not there.
      return Annotate(grpc::Status(
          s.error_code(),
          absl::StrCat(s.error_message(),
                       " (TLS is on: if the PS is up, check that it has this job's ca.crt, "
                       "tls.crt and tls.key)")));
    }
    if (!s.ok()) return Annotate(s);
    return info;
  }

  // Raw messages, so a chunk's floats go from the received slices straight
  // to the sink's buffer (proto/chunk_slices.h); the header stays protobuf.
  absl::StatusOr<v1::PullResponse::Header> Pull(const v1::PullRequest& request,
                                                const ChunkSink& sink) override {
    static const grpc::internal::RpcMethod kPull("/kubetrain.v1.ParameterServer/Pull",
                                                 grpc::internal::RpcMethod::SERVER_STREAMING);
    grpc::ClientContext ctx;
    Identify(&ctx);
    // The PS answers a held pull by its wait timeout; allow for the transfer on top.
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(request.wait_timeout_ms() + 60000));
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), kPull, &ctx,
                                                                      Serialize(request)));
    PulledAnswers answers(absl::StrCat("pull from ", address_));
    grpc::ByteBuffer in;
    while (reader->Read(&in)) {
      if (!answers.Take(&in, sink)) {
        ctx.TryCancel();
        break;
      }
    }
    auto s = reader->Finish();
    if (!answers.status().ok()) return answers.status();
    if (!s.ok()) return Annotate(s);
    if (!answers.header().has_value())
      return absl::DataLossError(absl::StrCat("pull from ", address_, ": no header"));
    return *answers.header();
  }

  // Raw messages, so a chunk's floats go out as a slice of their own
  // (core/push_wire.h) rather than copied into a protobuf string and again
  // into a slice; the header and sparse rows stay protobuf.
  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest::Header& header,
                                        const std::vector<ChunkRef>& chunks,
                                        const std::vector<SparseRef>& sparse) override {
    static const grpc::internal::RpcMethod kPush("/kubetrain.v1.ParameterServer/Push",
                                                 grpc::internal::RpcMethod::CLIENT_STREAMING);
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    grpc::ByteBuffer answer;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), kPush, &ctx,
                                                                      &answer));
    absl::Status unready;
    if (WritePush(header, chunks, sparse, writer.get(), &unready)) writer->WritesDone();
    if (!unready.ok()) ctx.TryCancel();  // the PS abandons the push
    auto s = writer->Finish();
    if (!unready.ok()) return unready;
    if (!s.ok()) return Annotate(s);
    v1::PushResponse resp;
    if (!grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::PushResponse>(&answer, &resp).ok()) {
      return Annotate(
          grpc::Status(grpc::StatusCode::INTERNAL, "push answer is not a PushResponse"));
    }
    return resp;
  }

  // The push half as Push sends it (raw chunk messages), then the answers
  // as Pull reads them, on one bidirectional stream.
  PushPullAnswer PushPull(const v1::PushRequest::Header& header,
                          const std::vector<ChunkRef>& chunks, const std::vector<SparseRef>& sparse,
                          const v1::PullRequest& pull, const ChunkSink& sink) override {
    static const grpc::internal::RpcMethod kPushPull("/kubetrain.v1.ParameterServer/PushPull",
                                                     grpc::internal::RpcMethod::BIDI_STREAMING);
    grpc::ClientContext ctx;
    Identify(&ctx);
    // The push's allowance, then the pull's (as Push and Pull set theirs).
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120) +
                     std::chrono::milliseconds(pull.wait_timeout_ms() + 60000));
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel_.get(), kPushPull, &ctx));
    v1::PushRequest::Header with_pull = header;
    *with_pull.mutable_pull() = pull;
    absl::Status unready;
    if (WritePush(with_pull, chunks, sparse, stream.get(), &unready)) stream->WritesDone();
    if (!unready.ok()) {
      ctx.TryCancel();  // the PS abandons the push
      stream->Finish();
      return {unready, unready};
    }
    PulledAnswers answers(absl::StrCat("push-pull with ", address_));
    grpc::ByteBuffer in;
    while (stream->Read(&in)) {
      if (!answers.Take(&in, sink)) {
        ctx.TryCancel();
        break;
      }
    }
    auto s = stream->Finish();
    PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
    if (!answers.push().has_value()) {
      // No answer to the push: whether it was applied is unknown (a retry
      // with the same push id settles it).
      answer.push =
          !answers.status().ok() ? answers.status()
          : !s.ok()
              ? Annotate(s)
              : absl::DataLossError(absl::StrCat("push-pull with ", address_, ": no push answer"));
      answer.pull = answer.push.status();
      return answer;
    }
    answer.push = *answers.push();
    if (!answers.status().ok()) {
      answer.pull = answers.status();
    } else if (!s.ok()) {
      answer.pull = Annotate(s);
    } else if (!answers.header().has_value()) {
      answer.pull = absl::DataLossError(absl::StrCat("push-pull with ", address_, ": no header"));
    } else {
      answer.pull = *answers.header();
    }
    return answer;
  }

  absl::StatusOr<v1::SparsePullResponse> SparsePull(const v1::SparsePullRequest& request) override {
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::SparsePullResponse resp;
    auto s = stub_->SparsePull(&ctx, request, &resp);
    if (!s.ok()) return Annotate(s);
    return resp;
  }

  absl::StatusOr<v1::ListRowsResponse> ListRows(const v1::ListRowsRequest& request) override {
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::ListRowsResponse resp;
    auto s = stub_->ListRows(&ctx, request, &resp);
    if (!s.ok()) return Annotate(s);
    return resp;
  }

  absl::Status Leave(const v1::LeaveRequest& request) override {
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::LeaveResponse resp;
    return Annotate(stub_->Leave(&ctx, request, &resp));
  }

  absl::StatusOr<v1::ShardStats> Shutdown(const v1::ShutdownRequest& request) override {
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ShardStats stats;
    auto s = stub_->Shutdown(&ctx, request, &stats);
    if (!s.ok()) return Annotate(s);
    return stats;
  }

  absl::StatusOr<v1::ShardStats> GetStats(const v1::InfoRequest& request) override {
    grpc::ClientContext ctx;
    Identify(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ShardStats stats;
    auto s = stub_->GetStats(&ctx, request, &stats);
    if (!s.ok()) return Annotate(s);
    return stats;
  }

 private:
  // Writes a push's messages: the header, each chunk raw (its floats a
  // slice of their own, not copied into a protobuf string; core/push_wire.h),
  // the sparse rows as protobuf, each once its data are ready (AwaitRef).
  // False once the stream is broken or a ref's data will never be ready
  // (then *unready says why).
  template <typename Writer>
  static bool WritePush(const v1::PushRequest::Header& header, const std::vector<ChunkRef>& chunks,
                        const std::vector<SparseRef>& sparse, Writer* writer,
                        absl::Status* unready) {
    v1::PushRequest msg;
    *msg.mutable_header() = header;
    bool ok = writer->Write(Serialize(msg));
    std::string prefix;
    for (size_t i = 0; ok && i < chunks.size(); ++i) {
      *unready = AwaitRef(chunks[i]);
      if (!unready->ok()) return false;
      const uint64_t bytes = chunks[i].count * sizeof(float);
      prefix.clear();
      AppendChunkPrefix(*chunks[i].part, chunks[i].offset, bytes, &prefix);
      // The floats are the caller's and outlive the call (the callers return
      // after Finish): a static slice refers to them with nothing to release.
      grpc::Slice slices[2] = {grpc::Slice(prefix.data(), prefix.size()),
                               grpc::Slice(chunks[i].data, bytes, grpc::Slice::STATIC_SLICE)};
      ok = writer->Write(grpc::ByteBuffer(slices, bytes > 0 ? 2 : 1));
    }
    for (size_t i = 0; ok && i < sparse.size(); ++i) {
      *unready = AwaitRef(sparse[i]);
      if (!unready->ok()) return false;
      msg.Clear();
      auto* r = msg.mutable_sparse();
      r->set_table(*sparse[i].table);
      r->mutable_ids()->Add(sparse[i].ids, sparse[i].ids + sparse[i].count);
      r->set_data(reinterpret_cast<const char*>(sparse[i].data),
                  sparse[i].count * sparse[i].dim * sizeof(float));
      ok = writer->Write(Serialize(msg));
    }
    return ok;
  }

  void Identify(grpc::ClientContext* ctx) const {
    if (task_.empty()) return;
    ctx->AddMetadata(kTaskMetadataKey, task_);
    ctx->AddMetadata(kAuthorizationMetadataKey, authorization_);
  }

  absl::Status Annotate(const grpc::Status& s) {
    absl::Status st = FromGrpc(s);
    if (st.ok()) return st;
    return absl::Status(st.code(), absl::StrCat("ps at ", address_, ": ", st.message()));
  }
  const std::string address_;
  const std::string task_;  // empty: no metadata
  const std::string authorization_;
  const bool tls_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

}  // namespace

std::unique_ptr<ShardChannel> NewGrpcShardChannel(const std::string& address, int64_t chunk_bytes,
                                                  const CallerCredentials& caller) {
  return std::make_unique<GrpcShardChannel>(address, chunk_bytes, caller);
}

}  // namespace kubetrain
