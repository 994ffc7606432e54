#include "tests/transport/raw_ps_client.h"

#include <algorithm>
#include <chrono>

#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

namespace kubetrain {
namespace {

std::string MethodPath(const std::string& method) {
  return "/kubetrain.v1.ParameterServer/" + method;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

void RawPsClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  for (const auto& [key, value] : metadata_) ctx->AddMetadata(key, value);
}

grpc::Status RawPsClient::Unary(const std::string& method, const std::string& request,
                                std::string* response, absl::Duration timeout) {
  const std::string path = MethodPath(method);
  grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  grpc::ByteBuffer out;
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel_.get(), rpc, &ctx, ToBuffer(request), &out);
  if (response) *response = FromBuffer(out);
  return s;
}

grpc::Status RawPsClient::Pull(const std::string& request, std::vector<std::string>* messages,
                               absl::Duration timeout) {
  const std::string path = MethodPath("Pull");
  grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING);
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), rpc, &ctx,
                                                                    ToBuffer(request)));
  grpc::ByteBuffer msg;
  while (reader->Read(&msg)) {
    if (messages) messages->push_back(FromBuffer(msg));
  }
  return reader->Finish();
}

grpc::Status RawPsClient::Push(const std::vector<std::string>& messages, End end,
                               std::string* response, const std::function<void()>& before_end,
                               absl::Duration timeout) {
  const std::string path = MethodPath("Push");
  grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING);
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  grpc::ByteBuffer out;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), rpc, &ctx,
                                                                    &out));
  bool ok = true;
  for (size_t i = 0; ok && i < messages.size(); ++i) ok = writer->Write(ToBuffer(messages[i]));
  if (before_end) before_end();
  if (end == End::kCancel) {
    ctx.TryCancel();
  } else if (ok) {
    writer->WritesDone();
  }
  grpc::Status s = writer->Finish();
  if (response) *response = FromBuffer(out);
  return s;
}

std::vector<std::string> EncodePush(const v1::PushRequest::Header& header,
                                    const std::vector<PartGradient>& grads, size_t chunk_elements) {
  std::vector<std::string> out;
  v1::PushRequest msg;
  *msg.mutable_header() = header;
  out.push_back(msg.SerializeAsString());
  for (const auto& g : grads) {
    for (size_t off = 0; off < g.values.size(); off += chunk_elements) {
      const size_t n = std::min(chunk_elements, g.values.size() - off);
      msg.Clear();
      auto* c = msg.mutable_chunk();
      c->set_part(g.part);
      c->set_offset(off);
      c->set_data(reinterpret_cast<const char*>(g.values.data() + off), n * sizeof(float));
      out.push_back(msg.SerializeAsString());
    }
  }
  return out;
}

}  // namespace kubetrain
