// A push in steady state allocates nothing in the PS's code (issue 25): the
// chunk messages go from gRPC's slices through AddRawChunk and the
// PushAssembler into pooled buffers, and the shard applies them, with no
// operator new on the way once the first steps have filled the pools.
//
// What is counted: every global operator new on the test's thread between the
// first message of a step and the shard's answer to its last push, i.e.
// AddRawChunk (ps/raw_push.h), PushAssembler (ps/shard_wire.h) and
// Shard::Push. Not counted: the messages themselves (built once, before,
// as gRPC would hand them over; the test reads the same ones every step) and
// what gRPC's transport and the PushReactor's call do per RPC, which
// allocate through gRPC's own allocator (gpr_malloc), outside our code.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "core/model.h"
#include "core/placement.h"
#include "core/push_wire.h"
#include "core/testing/counting_new.h"
#include "gtest/gtest.h"
#include "ps/raw_push.h"
#include "ps/shard.h"
#include "ps/shard_wire.h"

namespace kubetrain {
namespace {

// Chunks of this many bytes, each message in several slices cut at odd
// places (as a socket's reads cut them), the prefix split too.
constexpr uint64_t kChunkBytes = 64 << 10;

grpc::ByteBuffer ChunkMessage(const std::string& part, uint64_t offset, const float* data,
                              uint64_t bytes) {
  std::string wire;
  AppendChunkPrefix(part, offset, bytes, &wire);
  wire.append(reinterpret_cast<const char*>(data), bytes);
  std::vector<grpc::Slice> slices;
  const size_t cuts[] = {0, 3, wire.size() / 3 + 1, wire.size() / 2 + 2, wire.size()};
  for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); ++i) {
    if (cuts[i] < cuts[i + 1]) slices.emplace_back(wire.data() + cuts[i], cuts[i + 1] - cuts[i]);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

class PushAllocTest : public ::testing::TestWithParam<TrainingMode> {
 protected:
  void SetUp() override {
    ModelSpec spec;
    spec.type = "mlp";
    spec.input_dim = 64;
    spec.hidden_units = {256, 128};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    const Placement placement = PlaceVariables(model_->variables(), 1, 1 << 20);
    ShardOptions options;
    options.num_workers = 2;
    options.mode = GetParam();
    options.replicas_to_aggregate = GetParam() == TrainingMode::kSync ? 2 : 1;
    options.target_steps = 1 << 30;
    OptimizerSpec opt;
    opt.type = "adam";
    opt.learning_rate = 0.001;
    auto shard = Shard::Create(options, *model_, placement, opt, &clock_, ShardMetrics{});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    for (const PartPlacement& p : shard_->parts()) {
      grads_.emplace_back(p.num_elements(), 1e-3f);
      const uint64_t bytes = grads_.back().size() * 4;
      for (uint64_t at = 0; at < bytes; at += kChunkBytes) {
        messages_.push_back(ChunkMessage(p.name, at / 4, grads_.back().data() + at / 4,
                                         std::min(kChunkBytes, bytes - at)));
      }
    }
  }

  // Every worker pushes the gradient once; the shard's version advances.
  void Step() {
    const int64_t version = shard_->version();
    for (int w = 0; w < 2; ++w) {
      PushAssembler assembler(shard_.get());
      v1::PushRequest::Header header;
      header.set_worker_index(w);
      header.set_version(shard_->version());
      header.set_worker_clock(version + 1);
      header.set_push_id(static_cast<uint64_t>(version) * 2 + w + 1);
      ASSERT_TRUE(assembler.SetHeader(header).ok());
      for (grpc::ByteBuffer& m : messages_) {
        absl::Status s;
        uint64_t bytes = 0;
        ASSERT_TRUE(AddRawChunk(&m, &assembler, &s, &bytes));
        ASSERT_TRUE(s.ok()) << s;
      }
      auto r = assembler.Finish();
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_FALSE(r->dropped);
    }
    ASSERT_EQ(shard_->version(), version + (GetParam() == TrainingMode::kSync ? 1 : 2));
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Shard> shard_;
  std::vector<std::vector<float>> grads_;
  std::vector<grpc::ByteBuffer> messages_;
};

TEST_P(PushAllocTest, NoAllocationPerStepOnceWarm) {
  ASSERT_GT(messages_.size(), shard_->parts().size());  // parts of several chunks
  for (int i = 0; i < 5; ++i) Step();                   // fills the pools and the shard's maps
  EXPECT_EQ(CountNewCalls([this] {
              for (int i = 0; i < 50; ++i) Step();
            }),
            0)
      << "operator new calls in 50 steps of 2 pushes";
  // The counter counts: the same test with an allocation in it fails.
  std::unique_ptr<int> extra;
  EXPECT_EQ(CountNewCalls([&extra] { extra = std::make_unique<int>(25); }), 1);
}

INSTANTIATE_TEST_SUITE_P(Modes, PushAllocTest,
                         ::testing::Values(TrainingMode::kSync, TrainingMode::kAsync));

}  // namespace
}  // namespace kubetrain
