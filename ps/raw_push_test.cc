#include "ps/raw_push.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "core/model.h"
#include "core/placement.h"
#include "core/push_wire.h"
#include "gtest/gtest.h"
#include "ps/shard.h"
#include "ps/shard_wire.h"

namespace kubetrain {
namespace {

// `wire` as gRPC may hand it over: in slices of `piece` bytes.
grpc::ByteBuffer Sliced(const std::string& wire, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += piece) {
    slices.emplace_back(wire.data() + at, std::min(piece, wire.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Chunk(const std::string& part, uint64_t offset, const float* data, size_t n) {
  v1::PushRequest msg;
  auto* c = msg.mutable_chunk();
  c->set_part(part);
  c->set_offset(offset);
  c->set_data(reinterpret_cast<const char*>(data), n * 4);
  return msg.SerializeAsString();
}

class RawPushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelSpec spec;
    spec.type = "mlp";
    spec.input_dim = 8;
    spec.hidden_units = {16};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    placement_ = PlaceVariables(model_->variables(), 1, 1 << 20);
  }
  std::unique_ptr<Shard> MakeShard() {
    ShardOptions options;
    options.num_workers = 1;
    options.mode = TrainingMode::kAsync;
    options.replicas_to_aggregate = 1;
    options.target_steps = 100;
    OptimizerSpec opt;
    opt.type = "sgd";
    opt.learning_rate = 1;
    auto shard = Shard::Create(options, *model_, placement_, opt, &clock_, ShardMetrics{});
    EXPECT_TRUE(shard.ok()) << shard.status();
    return std::move(*shard);
  }
  static void Start(PushAssembler* a) {
    v1::PushRequest::Header h;
    ASSERT_TRUE(a->SetHeader(h).ok());
  }
  static std::string Values(Shard* shard) {
    std::string bytes;
    shard->Pull({}, absl::InfiniteFuture(), [&bytes](absl::StatusOr<Shard::Snapshot> s) {
      ASSERT_TRUE(s.ok()) << s.status();
      bytes = *s->bytes;
    });
    return bytes;
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  Placement placement_;
};

TEST_F(RawPushTest, AppliesWhatProtobufWouldInAnySlicing) {
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, size_t{1000}}) {
    std::unique_ptr<Shard> raw = MakeShard(), parsed = MakeShard();
    PushAssembler a(raw.get()), b(parsed.get());
    Start(&a);
    Start(&b);
    for (const PartPlacement& p : raw->parts()) {
      std::vector<float> g(p.num_elements());
      for (size_t i = 0; i < g.size(); ++i) g[i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;
      // Two chunks per part, the second at a non-zero offset.
      const size_t half = g.size() / 2;
      for (size_t from : {size_t{0}, half}) {
        const size_t n = from == 0 ? half : g.size() - half;
        const std::string wire = Chunk(p.name, from, g.data() + from, n);
        grpc::ByteBuffer in = Sliced(wire, piece);
        absl::Status s;
        uint64_t bytes = 0;
        ASSERT_TRUE(AddRawChunk(&in, &a, &s, &bytes));
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(bytes, n * 4);
        v1::PushRequest msg;
        ASSERT_TRUE(msg.ParseFromString(wire));
        ASSERT_TRUE(b.Add(msg).ok());
      }
    }
    EXPECT_EQ(a.received_bytes(), b.received_bytes());
    const std::string before = Values(raw.get());
    ASSERT_TRUE(a.Finish().ok());
    ASSERT_TRUE(b.Finish().ok());
    EXPECT_NE(Values(raw.get()), before) << piece;
    EXPECT_EQ(Values(raw.get()), Values(parsed.get())) << piece;
  }
}

// An overlapped push (worker/ps_client.h, StartPushPull) sends its parts in
// backprop order, the last layer's first: the PS takes the parts in any
// order, each part's chunks in order, and applies what an in-order push
// would.
TEST_F(RawPushTest, TakesThePartsOfAPushInAnyOrderEachPartsChunksInOrder) {
  std::unique_ptr<Shard> raw = MakeShard(), parsed = MakeShard();
  PushAssembler a(raw.get()), b(parsed.get());
  Start(&a);
  Start(&b);
  std::vector<std::vector<float>> grads;
  for (const PartPlacement& p : raw->parts()) {
    std::vector<float> g(p.num_elements());
    for (size_t i = 0; i < g.size(); ++i) g[i] = 1e-3f * static_cast<float>(i % 89) - 0.04f;
    grads.push_back(std::move(g));
  }
  ASSERT_GE(grads.size(), 4u);
  auto add = [&](PushAssembler* to, bool raw_path, size_t part) {
    const std::vector<float>& g = grads[part];
    const size_t half = g.size() / 2;
    for (size_t from : {size_t{0}, half}) {
      const std::string wire =
          Chunk(raw->parts()[part].name, from, g.data() + from, from == 0 ? half : g.size() - half);
      if (raw_path) {
        grpc::ByteBuffer in = Sliced(wire, 5);
        absl::Status s;
        uint64_t bytes = 0;
        ASSERT_TRUE(AddRawChunk(&in, to, &s, &bytes));
        ASSERT_TRUE(s.ok()) << s;
      } else {
        v1::PushRequest msg;
        ASSERT_TRUE(msg.ParseFromString(wire));
        ASSERT_TRUE(to->Add(msg).ok());
      }
    }
  };
  for (size_t part = grads.size(); part-- > 0;) add(&a, true, part);  // last part first
  for (size_t part = 0; part < grads.size(); ++part) add(&b, false, part);
  const std::string before = Values(raw.get());
  ASSERT_TRUE(a.Finish().ok());
  ASSERT_TRUE(b.Finish().ok());
  EXPECT_NE(Values(raw.get()), before);
  EXPECT_EQ(Values(raw.get()), Values(parsed.get()));

  // A part's chunks out of order are refused (its elements must follow).
  std::unique_ptr<Shard> other = MakeShard();
  PushAssembler c(other.get());
  Start(&c);
  const std::vector<float>& g = grads[0];
  const size_t half = g.size() / 2;
  grpc::ByteBuffer in = Sliced(Chunk(other->parts()[0].name, half, g.data() + half, half), 5);
  absl::Status s;
  uint64_t bytes = 0;
  ASSERT_TRUE(AddRawChunk(&in, &c, &s, &bytes));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST_F(RawPushTest, LeavesOtherMessagesToProtobuf) {
  std::unique_ptr<Shard> shard = MakeShard();
  PushAssembler a(shard.get());
  Start(&a);
  const float f[2] = {1, 2};
  const std::string chunk = Chunk(shard->parts()[0].name, 0, f, 2);
  v1::PushRequest header;
  header.mutable_header()->set_worker_index(0);
  v1::PushRequest rows;
  rows.mutable_sparse()->set_table("t");
  for (const std::string& wire :
       {header.SerializeAsString(), rows.SerializeAsString(), chunk + chunk, std::string()}) {
    grpc::ByteBuffer in = Sliced(wire, 5);
    absl::Status s;
    uint64_t bytes = 0;
    EXPECT_FALSE(AddRawChunk(&in, &a, &s, &bytes));
    EXPECT_EQ(in.Length(), wire.size());  // read, not consumed
  }
  EXPECT_EQ(a.received_bytes(), 0u);
}

// A chunk the assembler refuses gets the words it gets through protobuf.
TEST_F(RawPushTest, RefusesAsTheProtobufPathDoes) {
  std::unique_ptr<Shard> shard = MakeShard();
  const std::string part = shard->parts()[0].name;
  const float f[3] = {1, 2, 3};
  std::string misaligned = Chunk(part, 0, f, 1);
  // data of 5 bytes: the lengths of the chunk and of its data grow by one.
  misaligned[1] += 1;
  misaligned[misaligned.size() - 5] += 1;
  misaligned += '\0';
  for (const std::string& wire :
       {Chunk("no/such/part", 0, f, 3), Chunk(part, 1, f, 3), misaligned, Chunk("", 0, f, 0)}) {
    v1::PushRequest msg;
    ASSERT_TRUE(msg.ParseFromString(wire));
    PushAssembler a(shard.get()), b(shard.get());
    Start(&a);
    Start(&b);
    grpc::ByteBuffer in = Sliced(wire, 4);
    absl::Status raw;
    uint64_t bytes = 0;
    ASSERT_TRUE(AddRawChunk(&in, &a, &raw, &bytes));
    const absl::Status parsed = b.Add(msg);
    EXPECT_FALSE(raw.ok());
    EXPECT_EQ(raw, parsed);
  }
}

}  // namespace
}  // namespace kubetrain
