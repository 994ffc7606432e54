// The fixture of the bulk data plane's end-to-end tests (bulk_round_trip_test,
// bulk_refusals_test): a Shard served by the gRPC PsService and, beside it, a
// BulkServer (ps/bulk_server.h), reached by the worker's channel
// (worker/bulk_shard_channel.h, NewPsChannel), with each transport's counters.
#ifndef KUBETRAIN_TESTS_TRANSPORT_BULK_FIXTURE_H_
#define KUBETRAIN_TESTS_TRANSPORT_BULK_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/job_credentials.h"
#include "proto/bulk_wire.h"
#include "ps/bulk_server.h"
#include "ps/service.h"
#include "tests/transport/part_gates.h"
#include "worker/bulk_shard_channel.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace bulk_testing {

constexpr uint64_t kChunk = 64 << 10;  // a part spans many chunks (784x300 kernel: 15)

// Waits (polling, up to a generous limit) until `done()`; false if it never is.
template <typename F>
bool Eventually(F done, absl::Duration limit = absl::Seconds(30)) {
  const absl::Time end = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// One transport's counters: bytes moved, and pushes handled (push_seconds is
// observed once a push is handled, before its answer goes out).
struct Counters {
  prometheus::Counter pull_bytes;
  prometheus::Counter push_bytes;
  prometheus::Histogram push_seconds{prometheus::Histogram::BucketBoundaries{1.0}};
  prometheus::Counter unauthenticated;
  prometheus::Counter permission_denied;
  PsServiceMetrics Get() {
    PsServiceMetrics m;
    m.pull_bytes = &pull_bytes;
    m.push_bytes = &push_bytes;
    m.push_seconds = &push_seconds;
    m.auth_unauthenticated = &unauthenticated;
    m.auth_permission_denied = &permission_denied;
    return m;
  }
  uint64_t pushes_handled() const { return push_seconds.Collect().histogram.sample_count; }
};

struct PsOptions {
  TrainingMode mode = TrainingMode::kSync;
  bool bulk = true;
  // The port GetInfo advertises, if not the bulk server's.
  std::optional<int> advertised_port;
  std::string job_key;
  int max_connections = 256;
  absl::Duration push_idle_timeout = absl::Seconds(30);
};

// One PS task in the test's process: a Shard, its gRPC service on
// 127.0.0.1:0 and (options.bulk) its BulkServer, each with its own counters.
class TestPs {
 public:
  TestPs(const Model* model, const Placement* placement, const Clock* clock)
      : model_(model), placement_(placement), clock_(clock) {}
  ~TestPs() { Stop(); }

  void Start(const PsOptions& o) {
    Stop();
    ShardOptions so;
    so.num_workers = 2;
    so.mode = o.mode;
    so.replicas_to_aggregate = o.mode == TrainingMode::kSync ? 2 : 1;
    so.target_steps = 100;
    OptimizerSpec opt;
    opt.type = "sgd";
    opt.learning_rate = 0.5;
    shard_ = *Shard::Create(so, *model_, *placement_, opt, clock_, ShardMetrics{});
    bulk_counters_ = std::make_unique<Counters>();
    grpc_counters_ = std::make_unique<Counters>();
    if (o.bulk) {
      BulkServerOptions bo;
      bo.bind_host = "127.0.0.1";
      bo.max_chunk_bytes = kChunk;
      bo.job_key = o.job_key;
      bo.max_connections = o.max_connections;
      bo.push_idle_timeout = o.push_idle_timeout;
      auto started = BulkServer::Start(shard_.get(), clock_, bo, bulk_counters_->Get());
      ASSERT_TRUE(started.ok()) << started.status();
      bulk_ = *std::move(started);
    }
    PsServiceOptions po;
    po.model_fingerprint = placement_->Fingerprint();
    po.max_chunk_bytes = kChunk;
    po.job_key = o.job_key;
    po.bulk_port = o.advertised_port.has_value() ? *o.advertised_port : bulk_ ? bulk_->port() : 0;
    service_ = std::make_unique<PsService>(shard_.get(), clock_, po, grpc_counters_->Get());
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    ConfigurePsServer(kChunk, &b);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_GT(port_, 0);
  }
  void Stop() {
    if (bulk_) bulk_->Stop();
    if (server_) server_->Shutdown();
    server_.reset();
    service_.reset();
    bulk_.reset();
    shard_.reset();
  }

  Shard* shard() const { return shard_.get(); }
  BulkServer* bulk() const { return bulk_.get(); }
  const Counters& bulk_counters() const { return *bulk_counters_; }
  const Counters& grpc_counters() const { return *grpc_counters_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  const Model* const model_;
  const Placement* const placement_;
  const Clock* const clock_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Counters> bulk_counters_;
  std::unique_ptr<Counters> grpc_counters_;
  std::unique_ptr<BulkServer> bulk_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

using Values = std::map<std::string, std::vector<float>>;

// Worker `worker`'s push of step 0.
inline v1::PushRequest::Header Header1(int worker) {
  v1::PushRequest::Header h;
  h.set_worker_index(worker);
  h.set_worker_clock(1);
  return h;
}
using Grads = std::vector<std::vector<float>>;

class BulkRoundTripTest : public ::testing::Test {
 protected:
  BulkRoundTripTest() {
    ModelSpec spec;
    spec.type = "mlp";
    spec.hidden_units = {300};
    model_ = std::make_unique<Model>(*Model::Create(spec));
    placement_ = PlaceVariables(model_->variables(), 1, 1 << 30);
    ps_ = std::make_unique<TestPs>(model_.get(), &placement_, &clock_);
  }
  void SetUp() override { Start(); }
  void TearDown() override {
    channel_.reset();
    ps().Stop();
  }

  // (Re)starts the PS and connects channel_ (worker 0's, with the job's
  // token if it has a key) through GetInfo, which tells it the bulk port.
  void Start(PsOptions o = PsOptions()) {
    channel_.reset();
    job_key_ = o.job_key;
    ps().Start(o);
    channel_ = NewChannel(0);
    auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(10));
    ASSERT_TRUE(info.ok()) << info.status();
  }
  std::unique_ptr<ShardChannel> NewChannel(int worker) {
    return NewPsChannel(ps().address(), kChunk, Caller(worker));
  }
  CallerCredentials Caller(int worker) const {
    CallerCredentials c;
    if (!job_key_.empty()) {
      c.task = TaskMetadataValue("worker", worker);
      c.token = TaskToken(job_key_, "worker", worker);
    }
    return c;
  }
  TestPs& ps() const { return *ps_; }
  Shard* shard() const { return ps().shard(); }
  uint64_t GradientBytes() const { return shard()->gradient_bytes(); }
  double BulkPushBytes() const { return ps().bulk_counters().push_bytes.Value(); }
  double BulkPullBytes() const { return ps().bulk_counters().pull_bytes.Value(); }
  double GrpcPushBytes() const { return ps().grpc_counters().push_bytes.Value(); }
  double GrpcPullBytes() const { return ps().grpc_counters().pull_bytes.Value(); }

  static ShardChannel::ChunkSink SinkInto(Values* out, int* chunks = nullptr) {
    return [out, chunks](const PulledChunk& c) {
      auto& v = (*out)[std::string(c.part())];
      v.resize(std::max<size_t>(v.size(), c.offset() + c.data_bytes() / 4));
      c.CopyTo(reinterpret_cast<char*>(v.data() + c.offset()));
      if (chunks != nullptr) ++*chunks;
      return absl::OkStatus();
    };
  }
  // Everything, pulled at once (min_version 0) into part -> values.
  static Values PullAll(ShardChannel* channel, int worker = 0, int64_t* version = nullptr,
                        int* chunks = nullptr) {
    Values out;
    v1::PullRequest req;
    req.set_worker_index(worker);
    auto h = channel->Pull(req, SinkInto(&out, chunks));
    EXPECT_TRUE(h.ok()) << h.status();
    if (version != nullptr && h.ok()) *version = h->version();
    return out;
  }
  Values PullAll(int64_t* version = nullptr) { return PullAll(channel_.get(), 0, version); }

  // The shard's values as it holds them (parts in order, float32 LE), read
  // directly, not through any transport.
  std::string ShardBytes() const {
    absl::Notification done;
    std::string bytes;
    shard()->Pull({0, 0, 0, 0, TaskRole::kExporter}, absl::InfiniteFuture(),
                  [&](absl::StatusOr<Shard::Snapshot> s) {
                    if (s.ok()) bytes = *s->bytes;
                    done.Notify();
                  });
    done.WaitForNotification();
    return bytes;
  }
  // Pulled values in the shard's layout (parts in order), to compare with ShardBytes.
  std::string Flat(const Values& v) const {
    std::string out;
    for (const auto& p : shard()->parts()) {
      auto it = v.find(p.name);
      if (it == v.end()) return "missing " + p.name;
      out.append(reinterpret_cast<const char*>(it->second.data()), it->second.size() * 4);
    }
    return out;
  }

  // A gradient with values that differ by worker, step and element, so that
  // bit-identical results mean the same floats went the same way.
  Grads GradsOf(int worker, int64_t step) const {
    Grads g;
    for (const auto& p : shard()->parts()) {
      std::vector<float> v(p.num_elements());
      for (size_t k = 0; k < v.size(); ++k) {
        v[k] = 0.01f * std::sin(0.37f * k + 1.3f * worker + 0.7f * step);
      }
      g.push_back(std::move(v));
    }
    return g;
  }
  Grads Filled(float x) const {
    Grads g;
    for (const auto& p : shard()->parts()) g.emplace_back(p.num_elements(), x);
    return g;
  }
  // A gradient as the worker's chunks (10000 elements each).
  std::vector<ChunkRef> ChunksOf(const Grads& g) const {
    std::vector<ChunkRef> chunks;
    for (size_t i = 0; i < g.size(); ++i) {
      for (size_t off = 0; off < g[i].size(); off += 10000) {
        chunks.push_back({&shard()->parts()[i].name, off, g[i].data() + off,
                          std::min<size_t>(10000, g[i].size() - off)});
      }
    }
    return chunks;
  }
  static v1::PushRequest::Header Header(int worker, int64_t version, uint64_t push_id = 0) {
    v1::PushRequest::Header h;
    h.set_worker_index(worker);
    h.set_version(version);
    h.set_worker_clock(version + 1);
    h.set_push_id(push_id);
    return h;
  }
  // Worker `worker`'s pull at the barrier after step `step`.
  static v1::PullRequest BarrierPull(int64_t step) {
    v1::PullRequest pull;
    pull.set_min_version(step + 1);
    pull.set_worker_clock(step + 1);
    pull.set_wait_timeout_ms(30000);
    return pull;
  }

  // --- raw connections, for what a well-behaved channel never sends ---

  // A connection to the bulk port whose hello got `*hello` (OK: ready for calls).
  std::unique_ptr<BulkSocket> RawConnect(absl::Status* hello, const std::string& task = "",
                                         const std::string& authorization = "") const {
    auto socket =
        ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimitsFor(kChunk));
    EXPECT_TRUE(socket.ok()) << socket.status();
    if (!socket.ok()) return nullptr;
    v1::BulkFrame frame;
    frame.mutable_hello()->set_task(task);
    frame.mutable_hello()->set_authorization(authorization);
    *hello = (*socket)->WriteFrame(frame, {}, absl::Now() + absl::Seconds(10));
    if (hello->ok()) *hello = ReadStatus(socket->get());
    return *std::move(socket);
  }
  std::unique_ptr<BulkSocket> RawConnect() const {
    absl::Status hello;
    auto socket =
        RawConnect(&hello, Caller(0).task, job_key_.empty() ? "" : "Bearer " + Caller(0).token);
    EXPECT_TRUE(hello.ok()) << hello;
    return socket;
  }
  // Reads frames (their data skipped) until a status frame: its status, or
  // the read's error if the connection ends first.
  static absl::Status ReadStatus(BulkSocket* socket, int* answers = nullptr) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (;;) {
      v1::BulkFrame frame;
      uint64_t n = 0;
      if (absl::Status s = socket->ReadFrame(&frame, &n, deadline); !s.ok()) return s;
      if (frame.has_status()) return FromBulkStatus(frame.status());
      if (answers != nullptr) ++*answers;
      if (absl::Status s = socket->SkipData(n, deadline); !s.ok()) return s;
    }
  }
  // True once the server closed the connection (a read ends UNAVAILABLE).
  static bool ClosedByServer(BulkSocket* socket) {
    v1::BulkFrame frame;
    uint64_t n = 0;
    absl::Status s;
    do {
      s = socket->ReadFrame(&frame, &n, absl::Now() + absl::Seconds(30));
      if (s.ok()) s = socket->SkipData(n, absl::Now() + absl::Seconds(30));
    } while (s.ok());
    return absl::IsUnavailable(s);
  }
  static absl::Status WritePushHeader(BulkSocket* socket, const v1::PushRequest::Header& h) {
    v1::BulkFrame frame;
    *frame.mutable_push()->mutable_header() = h;
    return socket->WriteFrame(frame, {}, absl::Now() + absl::Seconds(30));
  }
  static absl::Status WriteChunk(BulkSocket* socket, const std::string& part, uint64_t offset,
                                 absl::string_view data) {
    v1::BulkFrame frame;
    frame.mutable_push()->mutable_chunk()->set_part(part);
    frame.mutable_push()->mutable_chunk()->set_offset(offset);
    return socket->WriteFrame(frame, absl::MakeConstSpan(&data, 1),
                              absl::Now() + absl::Seconds(30));
  }
  // The first `max_chunks` chunks (all: -1) of `g` in order; their bytes.
  // `expect_ok` false: the server may refuse and close at any point.
  uint64_t WriteChunks(BulkSocket* socket, const Grads& g, int max_chunks = -1,
                       bool expect_ok = true) const {
    uint64_t bytes = 0;
    int sent = 0;
    for (const ChunkRef& c : ChunksOf(g)) {
      if (max_chunks >= 0 && sent++ >= max_chunks) break;
      const absl::string_view data(reinterpret_cast<const char*>(c.data), c.count * 4);
      const absl::Status s = WriteChunk(socket, *c.part, c.offset, data);
      if (!s.ok()) {
        EXPECT_FALSE(expect_ok) << s;
        break;
      }
      bytes += data.size();
    }
    return bytes;
  }
  static absl::Status WriteEnd(BulkSocket* socket, bool pull = false) {
    v1::BulkFrame frame;
    frame.mutable_end()->set_pull(pull);
    return socket->WriteFrame(frame, {}, absl::Now() + absl::Seconds(30));
  }
  // The shard is as it started: version 0, nothing applied, values as `before`.
  void ExpectUnchanged(const std::string& before) const {
    EXPECT_EQ(shard()->version(), 0);
    EXPECT_EQ(shard()->stats().gradients_applied, 0);
    EXPECT_TRUE(ShardBytes() == before) << "the shard's values changed";
  }
  // A new channel still pulls the shard's values, over the data plane.
  void ExpectAFreshChannelPulls() {
    auto fresh = NewChannel(0);
    ASSERT_TRUE(fresh->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
    const double bulk_before = BulkPullBytes();
    EXPECT_TRUE(Flat(PullAll(fresh.get())) == ShardBytes())
        << "pulled values differ from the shard\'s";
    EXPECT_EQ(BulkPullBytes() - bulk_before, static_cast<double>(GradientBytes()));
  }

  FakeClock clock_;
  std::unique_ptr<Model> model_;
  Placement placement_;
  std::unique_ptr<TestPs> ps_;
  std::string job_key_;
  std::unique_ptr<ShardChannel> channel_;
};

class HeldPushPull {
 public:
  HeldPushPull(ShardChannel* channel, const Counters& counters, std::vector<ChunkRef> chunks)
      : answer_{absl::UnknownError(""), absl::UnknownError("")} {
    const uint64_t handled = counters.pushes_handled();
    thread_ = std::thread([this, channel, chunks = std::move(chunks)] {
      v1::PushRequest::Header h;
      h.set_worker_index(0);
      h.set_worker_clock(1);
      h.set_push_id(9);
      answer_ = channel->PushPull(
          h, chunks, {},
          [] {
            v1::PullRequest pull;
            pull.set_min_version(1);
            pull.set_worker_clock(1);
            pull.set_wait_timeout_ms(30000);
            return pull;
          }(),
          [](const PulledChunk&) { return absl::OkStatus(); });
    });
    EXPECT_TRUE(Eventually([&] { return counters.pushes_handled() > handled; }));
  }
  const PushPullAnswer& Join() {
    thread_.join();
    return answer_;
  }

 private:
  PushPullAnswer answer_;
  std::thread thread_;
};

}  // namespace bulk_testing
}  // namespace kubetrain

#endif  // KUBETRAIN_TESTS_TRANSPORT_BULK_FIXTURE_H_
