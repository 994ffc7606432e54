// A push that carries embedding-table gradient rows allocates nothing in the
// PS's code in steady state (issue 25), in sync mode (2 workers, the rows
// summed by id: SparseRowSum) and async mode (each push's rows applied on
// arrival), like a dense push (ps/push_alloc_test.cc, whose style this
// follows): the rows go into a pooled set of SparseGrad buffers
// (Shard::TakePooledSparse), the sum and the staged update into buffers the
// shard keeps, and the set goes back to the pool after the step.
//
// What is counted: every global operator new on the test's thread between the
// first message of a step and the shard's answer to its last push, i.e.
// AddRawChunk for the dense chunks, PushAssembler::Add/AddSparse for the
// rows, PushAssembler::Finish and Shard::Push (validation, the sync sum, the
// optimizer's staging and commit). Not counted: parsing the SparseRows
// messages (the test builds the parsed v1::PushRequest messages once, before,
// as ps/service.cc's AddParsedLocked would hand them over; protobuf's parse
// allocates its repeated ids and data string, as gRPC's own transport
// allocates per RPC), and the messages of the dense chunks (as in
// push_alloc_test.cc).
//
// Steady state: every push carries the same number of rows per table, with
// ids drawn at random (duplicates within and across pushes), so the number
// of distinct ids per step varies; the counted steps include ids patterns
// the warm-up did not see. Dynamic tables: a push creates the rows it names
// that are missing, and creating a row may allocate (the slab, the slots and
// the hash map grow); the dynamic case below uses ids the warm-up created
// already, so it too allocates nothing.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "core/model.h"
#include "core/placement.h"
#include "core/push_wire.h"
#include "core/testing/counting_new.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "ps/raw_push.h"
#include "ps/shard.h"
#include "ps/shard_wire.h"

namespace kubetrain {
namespace {

constexpr uint64_t kChunkBytes = 16 << 10;
constexpr int kWorkers = 2;
// Steps of different ids, cycled; the warm-up runs fewer than these.
constexpr int kVariants = 7;
constexpr int kWarmSteps = 4;

grpc::ByteBuffer ChunkMessage(const std::string& part, uint64_t offset, const float* data,
                              uint64_t bytes) {
  std::string wire;
  AppendChunkPrefix(part, offset, bytes, &wire);
  wire.append(reinterpret_cast<const char*>(data), bytes);
  grpc::Slice slice(wire.data(), wire.size());
  return grpc::ByteBuffer(&slice, 1);
}

// (mode, dynamic tables)
class SparsePushAllocTest : public ::testing::TestWithParam<std::tuple<TrainingMode, bool>> {
 protected:
  TrainingMode mode() const { return std::get<0>(GetParam()); }
  bool dynamic() const { return std::get<1>(GetParam()); }

  void SetUp() override {
    // Wide & deep: two embeddings (adagrad, one slot) and the wide part's
    // weight tables of dim 1 (ftrl, two slots).
    ModelSpec spec;
    spec.type = "layers";
    spec.input_shape = {4};
    spec.input_dim = 4;
    LayerSpec hidden;
    hidden.units = 8;
    hidden.activation = Activation::kRelu;
    LayerSpec out;
    out.units = 1;
    spec.layers = {hidden, out};
    spec.head = HeadType::kWideAndDeep;
    spec.num_classes = 2;
    spec.sparse_inputs = {{"a", 1000, 2}, {"b", 40, 1}};
    spec.embeddings = {{"a", 16, Combiner::kSum}, {"b", 8, Combiner::kMean}};
    spec.wide.columns = {"a", "b"};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    Placement placement = PlaceVariables(model_->variables(), 1, 1 << 20);
    ASSERT_EQ(placement.tables.size(), 4u);
    std::vector<int64_t> vocab;
    for (const TablePlacement& t : placement.tables) vocab.push_back(t.rows);
    if (dynamic()) {
      for (TablePlacement& t : placement.tables) {
        t.dynamic = true;
        t.rows = 0;
        t.max_rows = 0;
      }
    }
    ShardOptions options;
    options.num_workers = kWorkers;
    options.mode = mode();
    options.replicas_to_aggregate = mode() == TrainingMode::kSync ? kWorkers : 1;
    options.target_steps = 1 << 30;
    OptimizerSpec opt;
    opt.type = "adagrad";
    opt.learning_rate = 0.01;
    OptimizerSpec wide;
    wide.type = "ftrl";
    wide.learning_rate = 0.1;
    options.wide_optimizer = wide;
    auto shard = Shard::Create(options, *model_, placement, opt, &clock_, ShardMetrics{});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    for (const PartPlacement& p : shard_->parts()) {
      grads_.emplace_back(p.num_elements(), 1e-3f);
      const uint64_t bytes = grads_.back().size() * 4;
      for (uint64_t at = 0; at < bytes; at += kChunkBytes) {
        dense_.push_back(ChunkMessage(p.name, at / 4, grads_.back().data() + at / 4,
                                      std::min(kChunkBytes, bytes - at)));
      }
    }
    // Per variant and worker: rows for every table, ids from a small space
    // (so duplicates within a push and across workers are common).
    std::mt19937_64 rng(25);
    std::uniform_real_distribution<float> value(-1e-2f, 1e-2f);
    const int rows_per_table[] = {48, 16, 48, 16};
    sparse_.resize(kVariants);
    for (auto& variant : sparse_) {
      variant.resize(kWorkers);
      for (auto& push : variant) {
        for (size_t t = 0; t < shard_->tables().size(); ++t) {
          const TablePlacement& table = shard_->tables()[t];
          const int64_t space = std::min<int64_t>(60, vocab[t]);
          v1::PushRequest m;
          v1::SparseRows* rows = m.mutable_sparse();
          rows->set_table(table.name);
          std::vector<float> data;
          for (int i = 0; i < rows_per_table[t]; ++i) {
            rows->add_ids(rng() % space);
            for (int64_t k = 0; k < table.dim; ++k) data.push_back(value(rng));
          }
          rows->set_data(reinterpret_cast<const char*>(data.data()), data.size() * 4);
          push.push_back(std::move(m));
        }
      }
    }
  }

  // Every worker pushes its dense gradient and rows once; the shard's version
  // advances.
  void Step(int variant) {
    const int64_t version = shard_->version();
    for (int w = 0; w < kWorkers; ++w) {
      PushAssembler assembler(shard_.get());
      v1::PushRequest::Header header;
      header.set_worker_index(w);
      header.set_version(shard_->version());
      header.set_worker_clock(version + 1);
      header.set_push_id(static_cast<uint64_t>(version) * kWorkers + w + 1);
      ASSERT_TRUE(assembler.SetHeader(header).ok());
      for (grpc::ByteBuffer& m : dense_) {
        absl::Status s;
        uint64_t bytes = 0;
        ASSERT_TRUE(AddRawChunk(&m, &assembler, &s, &bytes));
        ASSERT_TRUE(s.ok()) << s;
      }
      for (const v1::PushRequest& m : sparse_[variant][w]) {
        absl::Status s = assembler.Add(m);
        ASSERT_TRUE(s.ok()) << s;
      }
      auto r = assembler.Finish();
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_FALSE(r->dropped);
    }
    ASSERT_EQ(shard_->version(), version + (mode() == TrainingMode::kSync ? 1 : kWorkers));
  }

  // The rows of table t of the ids the pushes name (read as the exporter, so
  // a dynamic table creates and reorders nothing).
  std::vector<float> Rows(int t) {
    std::vector<int64_t> ids;
    for (const auto& variant : sparse_) {
      for (const auto& push : variant) {
        for (uint64_t id : push[t].sparse().ids()) ids.push_back(static_cast<int64_t>(id));
      }
    }
    auto r = shard_->PullRows({TaskRole::kExporter, 0}, {{t, ids}});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->rows[0] : std::vector<float>();
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Shard> shard_;
  std::vector<std::vector<float>> grads_;
  std::vector<grpc::ByteBuffer> dense_;
  std::vector<std::vector<std::vector<v1::PushRequest>>> sparse_;  // [variant][worker][table]
};

TEST_P(SparsePushAllocTest, NoAllocationPerStepOnceWarm) {
  // Dynamic tables: the warm-up creates every row the counted steps name.
  const int warm = dynamic() ? kVariants : kWarmSteps;
  for (int i = 0; i < warm; ++i) Step(i % kVariants);
  std::vector<std::vector<float>> before;
  for (size_t t = 0; t < shard_->tables().size(); ++t) before.push_back(Rows(static_cast<int>(t)));
  const int64_t applied = shard_->stats().gradients_applied;
  EXPECT_EQ(CountNewCalls([this, warm] {
              for (int i = 0; i < 42; ++i) Step((warm + i) % kVariants);
            }),
            0)
      << "operator new calls in 42 steps of 2 pushes with rows";
  // The rows were applied: every table's rows moved, every push counted.
  EXPECT_EQ(shard_->stats().gradients_applied, applied + 42 * kWorkers);
  for (size_t t = 0; t < shard_->tables().size(); ++t) {
    EXPECT_NE(Rows(static_cast<int>(t)), before[t]) << shard_->tables()[t].name;
  }
  // The counter counts: the same test with an allocation in it fails.
  std::unique_ptr<int> extra;
  EXPECT_EQ(CountNewCalls([&extra] { extra = std::make_unique<int>(25); }), 1);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, SparsePushAllocTest,
    ::testing::Combine(::testing::Values(TrainingMode::kSync, TrainingMode::kAsync),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<TrainingMode, bool>>& info) {
      return std::string(std::get<0>(info.param) == TrainingMode::kSync ? "Sync" : "Async") +
             (std::get<1>(info.param) ? "Dynamic" : "Static");
    });

}  // namespace
}  // namespace kubetrain
