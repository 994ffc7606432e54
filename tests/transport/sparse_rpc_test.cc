// Embedding-table rows over a real loopback gRPC socket: the PS's SparsePull
// and the sparse rows of a Push (ps/service.h) through the worker's channel
// (worker/grpc_shard_channel.h). Bad ids, widths and values are refused
// with INVALID_ARGUMENT naming the table, the server stays up and its rows
// stay unchanged.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <prometheus/counter.h>

#include "proto/ps.grpc.pb.h"
#include "ps/service.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

class SparseRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelSpec spec;
    spec.type = "layers";
    spec.input_shape = {1};
    LayerSpec dense;
    dense.units = 1;
    spec.layers = {dense};
    spec.head = HeadType::kSigmoid;
    spec.num_classes = 2;
    spec.sparse_inputs = {{"c", 9, 1}};
    spec.embeddings = {{"c", 4, Combiner::kSum}};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    placement_ = PlaceVariables(model_->variables(), 3, 1 << 20);  // this is shard 1 of 3
    ShardOptions o;
    o.shard_index = 1;
    o.num_workers = 1;
    o.mode = TrainingMode::kAsync;
    o.target_steps = 100;
    OptimizerSpec opt;
    opt.type = "sgd";
    opt.learning_rate = 1;
    shard_ = *Shard::Create(o, *model_, placement_, opt, &clock_, ShardMetrics{});
    PsServiceOptions so;
    so.model_fingerprint = placement_.Fingerprint();
    PsServiceMetrics metrics;
    pulled_ = std::make_unique<prometheus::Counter>();
    metrics.sparse_pull_bytes = pulled_.get();
    service_ = std::make_unique<PsService>(shard_.get(), &clock_, so, metrics);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    ConfigurePsServer(so.max_chunk_bytes, &b);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_GT(port_, 0);
    channel_ = NewGrpcShardChannel("127.0.0.1:" + std::to_string(port_), 1 << 20);
    ASSERT_TRUE(channel_->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  }
  void TearDown() override { server_->Shutdown(); }

  absl::StatusOr<v1::SparsePullResponse> Pull(const std::string& table,
                                              const std::vector<uint64_t>& ids) {
    v1::SparsePullRequest req;
    auto* t = req.add_tables();
    t->set_table(table);
    for (uint64_t id : ids) t->add_ids(id);
    return channel_->SparsePull(req);
  }
  std::vector<float> Rows(const std::vector<uint64_t>& ids) {
    auto r = Pull("embedding.c", ids);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    std::vector<float> out(r->tables(0).data().size() / 4);
    std::memcpy(out.data(), r->tables(0).data().data(), r->tables(0).data().size());
    return out;
  }
  absl::StatusOr<v1::PushResponse> PushRows(const std::string& table,
                                            const std::vector<uint64_t>& ids,
                                            const std::vector<float>& rows, uint64_t dim = 4) {
    std::vector<std::vector<float>> dense;
    std::vector<ChunkRef> chunks;
    for (const auto& p : shard_->parts()) dense.emplace_back(p.num_elements(), 0.0f);
    for (size_t i = 0; i < dense.size(); ++i) {
      chunks.push_back({&shard_->parts()[i].name, 0, dense[i].data(), dense[i].size()});
    }
    v1::PushRequest::Header h;
    h.set_version(shard_->version());
    h.set_worker_clock(1);
    std::vector<SparseRef> sparse = {{&table, ids.data(), ids.size(), rows.data(), dim}};
    return channel_->Push(h, chunks, sparse);
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  Placement placement_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<prometheus::Counter> pulled_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<ShardChannel> channel_;
};

TEST_F(SparseRpcTest, HandshakeListsTheTableAndRowsRoundTrip) {
  auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->tables_size(), 1);
  EXPECT_EQ(info->tables(0).name(), "embedding.c");
  EXPECT_EQ(info->tables(0).rows(), 9u);
  EXPECT_EQ(info->tables(0).local_rows(), 3u);  // ids 1, 4, 7
  const std::vector<float> init = model_->InitialValue(model_->tables()[0], 1);
  std::vector<float> rows = Rows({7, 1});
  ASSERT_EQ(rows.size(), 8u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(rows[k], init[7 * 4 + k]);
    EXPECT_EQ(rows[4 + k], init[1 * 4 + k]);
  }
  EXPECT_EQ(pulled_->Value(), 32);
  // Duplicate ids within one push are summed (SGD, lr 1).
  auto r = PushRows("embedding.c", {4, 4}, {1, 1, 1, 1, 0.5f, 0.5f, 0.5f, 0.5f});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 1);
  rows = Rows({4});
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(rows[k], init[4 * 4 + k] - 1.5f);
}

TEST_F(SparseRpcTest, BadRequestsAreInvalidArgumentAndTheServerStaysUp) {
  const std::vector<float> before = Rows({1, 4, 7});
  auto pull = Pull("embedding.c", {2});
  EXPECT_EQ(pull.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pull.status().message().find("lives on ps:2"), absl::string_view::npos)
      << pull.status();
  pull = Pull("embedding.c", {10});
  EXPECT_NE(pull.status().message().find("out of range"), absl::string_view::npos);
  pull = Pull("nope", {1});
  EXPECT_NE(pull.status().message().find("unknown table \"nope\""), absl::string_view::npos);
  EXPECT_EQ(PushRows("embedding.c", {7}, {1, 2, 3}, 3).status().code(),
            absl::StatusCode::kInvalidArgument);  // wrong row width
  EXPECT_EQ(PushRows("embedding.c", {8}, {1, 2, 3, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);  // another shard's id
  EXPECT_EQ(PushRows("embedding.c", {1ull << 63}, {1, 2, 3, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto nan = PushRows("embedding.c", {1}, {1, std::nanf(""), 3, 4});
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.status().message().find("non-finite"), absl::string_view::npos) << nan.status();
  EXPECT_EQ(PushRows("nope", {1}, {1, 2, 3, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Up, unchanged, and still serving.
  EXPECT_EQ(Rows({1, 4, 7}), before);
  EXPECT_EQ(shard_->version(), 0);
  EXPECT_TRUE(PushRows("embedding.c", {1}, {1, 2, 3, 4}).ok());
  EXPECT_EQ(shard_->version(), 1);
}

}  // namespace
}  // namespace kubetrain
