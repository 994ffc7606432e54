// The shard's update path (ps/shard.h): the new values are written straight
// into the next version's buffer, which pulls share as it is (no snapshot
// copy), and an async push's gradient is checked for finiteness in the same
// pass as its update. What must not change with that: the values and slots
// each optimizer leaves (bit for bit, sync and async), a pull's snapshot
// (never written while a pull holds it), and a push is applied whole or not
// at all (a non-finite gradient is refused before anything changes, a push
// broken in the middle changes nothing).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/clock.h"
#include "core/model.h"
#include "core/placement.h"
#include "gtest/gtest.h"
#include "ps/optimizer.h"
#include "ps/shard.h"
#include "ps/shard_wire.h"

namespace kubetrain {
namespace {

// An mlp 37-61-7: parts of 2257, 61, 427 and 7 floats, so parts start at
// offsets that are not multiples of a vector register, and the big one spans
// several of the optimizer's 1024-element blocks.
struct ApplyFixture {
  ApplyFixture(const std::string& optimizer, TrainingMode mode, int workers) {
    ModelSpec spec;
    spec.type = "mlp";
    spec.input_dim = 37;
    spec.hidden_units = {61};
    spec.num_classes = 7;
    model = std::make_unique<Model>(*Model::Create(spec));
    placement = PlaceVariables(model->variables(), 1, 1 << 20);
    options.num_workers = workers;
    options.mode = mode;
    options.replicas_to_aggregate = mode == TrainingMode::kSync ? workers : 1;
    options.target_steps = 1000;
    options.seed = 7;
    opt.type = optimizer;
    opt.learning_rate = 0.01;
    auto s = Shard::Create(options, *model, placement, opt, &clock, ShardMetrics{});
    EXPECT_TRUE(s.ok()) << s.status();
    shard = std::move(*s);
  }

  // The shard's current snapshot (a pull of a reader that waits for nothing).
  Shard::Snapshot Pull() {
    Shard::Snapshot out;
    shard->Pull({0, 0, 0, 0, TaskRole::kWorker}, absl::InfiniteFuture(),
                [&](absl::StatusOr<Shard::Snapshot> s) {
                  ASSERT_TRUE(s.ok()) << s.status();
                  out = *s;
                });
    return out;
  }

  // Pseudo-random gradients, fixed by `seed`.
  std::vector<std::vector<float>> Grads(uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::vector<float>> g;
    for (const auto& p : shard->parts()) {
      g.emplace_back(p.num_elements());
      for (float& x : g.back()) x = normal(rng);
    }
    return g;
  }

  absl::StatusOr<Shard::PushResult> Push(int worker, std::vector<std::vector<float>> grads) {
    Shard::PushHeader h;
    h.worker = worker;
    h.version = shard->version();
    h.worker_clock = shard->version() + 1;
    return shard->Push(h, std::move(grads));
  }

  FakeClock clock;
  std::unique_ptr<Model> model;
  Placement placement;
  ShardOptions options;
  OptimizerSpec opt;
  std::unique_ptr<Shard> shard;
};

// The values of `parts` concatenated as a pull sends them.
std::string Concat(const std::vector<std::vector<float>>& parts) {
  std::string out;
  for (const auto& p : parts) out.append(reinterpret_cast<const char*>(p.data()), p.size() * 4);
  return out;
}

// The update as the shard did it before values and snapshot became one
// buffer: each part in its own vector, the optimizer's Stage and Commit per
// part, the sync mean summed in double in worker order.
struct Reference {
  explicit Reference(const ApplyFixture& f) {
    std::vector<int64_t> sizes;
    for (const auto& p : f.shard->parts()) {
      const std::vector<float> full = f.model->InitialValue(p.variable, f.options.seed);
      values.emplace_back(full.begin() + p.element_offset(),
                          full.begin() + p.element_offset() + p.num_elements());
      sizes.push_back(p.num_elements());
    }
    opt = *CreateOptimizer(f.opt, sizes);
  }
  void Apply(const std::vector<std::vector<std::vector<float>>>& per_worker) {
    ++step;
    for (size_t i = 0; i < values.size(); ++i) {
      std::vector<float> mean(values[i].size());
      for (size_t e = 0; e < mean.size(); ++e) {
        double sum = 0;
        for (const auto& g : per_worker) sum += g[i][e];
        mean[e] = static_cast<float>(sum / static_cast<double>(per_worker.size()));
      }
      std::vector<float> out(values[i].size());
      ASSERT_TRUE(opt->Stage(static_cast<int>(i), values[i].data(), mean.data(),
                             static_cast<int64_t>(mean.size()), step, out.data()));
      opt->Commit(static_cast<int>(i));
      values[i] = out;
    }
  }
  std::vector<std::vector<float>> values;
  std::unique_ptr<Optimizer> opt;
  int64_t step = 0;
};

void ExpectSameSlots(Shard* shard, Reference* ref, const std::string& what) {
  const ShardCheckpoint c = shard->Checkpoint();
  for (size_t i = 0; i < ref->values.size(); ++i) {
    EXPECT_EQ(c.values[i], ref->values[i]) << what << " part " << i;
    const auto slots = ref->opt->Slots(static_cast<int>(i));
    ASSERT_EQ(c.slots[i].size(), slots.size()) << what;
    for (size_t k = 0; k < slots.size(); ++k) {
      EXPECT_EQ(std::memcmp(c.slots[i][k].data(), slots[k]->data(), slots[k]->size() * 4), 0)
          << what << " part " << i << " slot " << k;
    }
  }
}

class ShardApplyTest : public ::testing::TestWithParam<std::tuple<std::string, TrainingMode, int>> {
};

TEST_P(ShardApplyTest, SameBitsAsPartByPartUpdate) {
  const auto& [optimizer, mode, workers] = GetParam();
  ApplyFixture f(optimizer, mode, workers);
  Reference ref(f);
  ASSERT_EQ(f.Pull().bytes->size(), Concat(ref.values).size());
  EXPECT_TRUE(*f.Pull().bytes == Concat(ref.values)) << "initial values";
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<std::vector<float>>> grads;
    for (int w = 0; w < workers; ++w) grads.push_back(f.Grads(step * 10 + w));
    if (mode == TrainingMode::kSync) {
      for (int w = workers - 1; w >= 0; --w) {  // arrival order does not matter
        auto r = f.Push(w, grads[w]);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_FALSE(r->dropped);
      }
      ref.Apply(grads);
    } else {
      for (int w = 0; w < workers; ++w) {
        auto r = f.Push(w, grads[w]);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_FALSE(r->dropped);
        ref.Apply({grads[w]});
      }
    }
    ASSERT_EQ(f.shard->version(), ref.step);
    EXPECT_TRUE(*f.Pull().bytes == Concat(ref.values)) << optimizer << " step " << step;
  }
  ExpectSameSlots(f.shard.get(), &ref, optimizer);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ShardApplyTest,
    ::testing::Combine(::testing::Values("sgd", "momentum", "adam", "adagrad", "ftrl"),
                       ::testing::Values(TrainingMode::kSync, TrainingMode::kAsync),
                       ::testing::Values(1, 2)));

// A snapshot handed to a pull is never written: later updates go to other
// buffers, whoever still reads it.
TEST(ShardApplyBuffersTest, HeldSnapshotNeverChanges) {
  for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
    ApplyFixture f("adam", mode, 1);
    const Shard::Snapshot first = f.Pull();
    const std::string first_copy = *first.bytes;
    std::vector<Shard::Snapshot> held;
    std::vector<std::string> copies;
    for (int step = 0; step < 8; ++step) {
      ASSERT_TRUE(f.Push(0, f.Grads(step)).ok());
      const Shard::Snapshot s = f.Pull();
      EXPECT_NE(*s.bytes, first_copy) << "the push changed nothing";
      if (step % 3 == 0) {  // some held, some dropped (their buffers reused)
        held.push_back(s);
        copies.push_back(*s.bytes);
      }
    }
    EXPECT_EQ(*first.bytes, first_copy);
    for (size_t i = 0; i < held.size(); ++i) EXPECT_EQ(*held[i].bytes, copies[i]) << i;
  }
}

// A pull's snapshot may outlive the shard (a bulk connection still sending it).
TEST(ShardApplyBuffersTest, SnapshotOutlivesShard) {
  Shard::Snapshot s;
  std::string copy;
  {
    ApplyFixture f("sgd", TrainingMode::kAsync, 1);
    ASSERT_TRUE(f.Push(0, f.Grads(1)).ok());
    s = f.Pull();
    copy = *s.bytes;
  }
  EXPECT_EQ(*s.bytes, copy);
}

struct State {
  std::string values;
  int64_t version = 0;
  ShardStatsSnapshot stats;
  ShardCheckpoint checkpoint;
};

State StateOf(ApplyFixture* f) {
  return {*f->Pull().bytes, f->shard->version(), f->shard->stats(), f->shard->Checkpoint()};
}

void ExpectUnchanged(const State& before, const State& after) {
  EXPECT_EQ(after.values, before.values);
  EXPECT_EQ(after.version, before.version);
  EXPECT_EQ(after.stats.gradients_applied, before.stats.gradients_applied);
  EXPECT_EQ(after.stats.staleness_sum, before.stats.staleness_sum);
  EXPECT_EQ(after.checkpoint.values, before.checkpoint.values);
  EXPECT_EQ(after.checkpoint.slots, before.checkpoint.slots);
  EXPECT_EQ(after.checkpoint.worker_clocks, before.checkpoint.worker_clocks);
}

// A non-finite gradient element anywhere (first block, a later block, the
// last part) is refused as INVALID_ARGUMENT naming its part, before anything
// changes, in both modes, as before the check moved into the update pass.
TEST(ShardApplyRefusalTest, NonFiniteGradientRefusedNothingChanged) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
    for (const std::string optimizer : {"sgd", "adam"}) {
      ApplyFixture f(optimizer, mode, 1);
      ASSERT_TRUE(f.Push(0, f.Grads(1)).ok());  // slots are not all initial
      for (size_t part = 0; part < f.shard->parts().size(); ++part) {
        const int64_t n = f.shard->parts()[part].num_elements();
        for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
          for (float v : bad) {
            auto grads = f.Grads(2);
            grads[part][at] = v;
            const State before = StateOf(&f);
            auto r = f.Push(0, grads);
            ASSERT_FALSE(r.ok()) << optimizer << " part " << part << " at " << at;
            EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
            EXPECT_NE(r.status().message().find(f.shard->parts()[part].name), std::string::npos)
                << r.status();
            EXPECT_NE(r.status().message().find("non-finite"), std::string::npos) << r.status();
            const State after = StateOf(&f);
            ExpectUnchanged(before, after);
            EXPECT_EQ(after.stats.pushes_rejected, before.stats.pushes_rejected + 1);
            EXPECT_EQ(after.stats.nonfinite_updates, before.stats.nonfinite_updates);
          }
        }
      }
      // And the shard goes on as if nothing had been sent.
      ApplyFixture g(optimizer, mode, 1);
      ASSERT_TRUE(g.Push(0, g.Grads(1)).ok());
      ASSERT_TRUE(f.Push(0, f.Grads(3)).ok());
      ASSERT_TRUE(g.Push(0, g.Grads(3)).ok());
      EXPECT_EQ(*f.Pull().bytes, *g.Pull().bytes);
    }
  }
}

// A finite gradient whose update overflows in part 0 while part 3's gradient
// is not finite: still the refused push (the gradient decides first), not a
// refused update; and the overflowing update alone is a refused update
// (dropped, counted), nothing changed either way.
TEST(ShardApplyRefusalTest, NonFiniteUpdateAndGradient) {
  for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
    ApplyFixture f("sgd", mode, 1);
    auto grads = f.Grads(1);
    grads[0][5] = std::numeric_limits<float>::max();  // x - 0.01 * max: finite
    grads[0][1500] = -std::numeric_limits<float>::max();
    f.opt.learning_rate = 1e30;  // not the fixture's: rebuild with an overflowing rate
    auto s = Shard::Create(f.options, *f.model, f.placement, f.opt, &f.clock, ShardMetrics{});
    ASSERT_TRUE(s.ok());
    f.shard = std::move(*s);
    auto both = grads;
    both[3][2] = std::numeric_limits<float>::quiet_NaN();
    State before = StateOf(&f);
    auto r = f.Push(0, both);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_NE(r.status().message().find(f.shard->parts()[3].name), std::string::npos);
    State after = StateOf(&f);
    ExpectUnchanged(before, after);
    EXPECT_EQ(after.stats.nonfinite_updates, 0);
    EXPECT_EQ(after.stats.pushes_rejected, 1);

    before = after;
    r = f.Push(0, grads);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->dropped);
    after = StateOf(&f);
    EXPECT_EQ(after.values, before.values);
    EXPECT_EQ(after.checkpoint.values, before.checkpoint.values);
    EXPECT_EQ(after.checkpoint.slots, before.checkpoint.slots);
    EXPECT_EQ(after.stats.nonfinite_updates, 1);
    EXPECT_EQ(after.stats.gradients_applied, 0);
    // Sync skips the step (the version moves); async drops the push.
    EXPECT_EQ(after.version, mode == TrainingMode::kSync ? 1 : 0);
  }
}

// A push broken off in the middle (the connection gone after some chunks)
// changes nothing, and the next whole push applies as on a fresh shard.
TEST(ShardApplyRefusalTest, PushBrokenInTheMiddleChangesNothing) {
  for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
    ApplyFixture f("adam", mode, 1);
    ApplyFixture g("adam", mode, 1);
    ASSERT_TRUE(f.Push(0, f.Grads(1)).ok());
    ASSERT_TRUE(g.Push(0, g.Grads(1)).ok());
    const State before = StateOf(&f);
    const auto grads = f.Grads(2);
    {
      PushAssembler a(f.shard.get());
      v1::PushRequest::Header h;
      h.set_worker_index(0);
      h.set_version(f.shard->version());
      ASSERT_TRUE(a.SetHeader(h).ok());
      // Parts 0 and 1 whole, half of part 2, then the stream ends.
      for (size_t part = 0; part < 3; ++part) {
        const auto& p = f.shard->parts()[part];
        const size_t n = part == 2 ? grads[part].size() / 2 : grads[part].size();
        ASSERT_TRUE(
            a.AddChunk(p.name, 0,
                       absl::string_view(reinterpret_cast<const char*>(grads[part].data()), n * 4))
                .ok());
      }
      a.Abandon();
    }
    ExpectUnchanged(before, StateOf(&f));
    // Incomplete at the end frame: refused, nothing changed either.
    {
      PushAssembler a(f.shard.get());
      v1::PushRequest::Header h;
      h.set_worker_index(0);
      h.set_version(f.shard->version());
      ASSERT_TRUE(a.SetHeader(h).ok());
      const auto& p = f.shard->parts()[0];
      ASSERT_TRUE(a.AddChunk(p.name, 0,
                             absl::string_view(reinterpret_cast<const char*>(grads[0].data()), 40))
                      .ok());
      auto r = a.Finish();
      EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    }
    ExpectUnchanged(before, StateOf(&f));
    ASSERT_TRUE(f.Push(0, grads).ok());
    ASSERT_TRUE(g.Push(0, grads).ok());
    EXPECT_EQ(*f.Pull().bytes, *g.Pull().bytes);
  }
}

}  // namespace
}  // namespace kubetrain
