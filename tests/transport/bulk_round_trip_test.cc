// The bulk data plane end to end on a real loopback socket: a Shard served by
// the gRPC PsService and, beside it, a BulkServer (ps/bulk_server.h), reached
// by the worker's channel (worker/bulk_shard_channel.h, NewPsChannel) -- the
// gRPC twin of this file is grpc_round_trip_test.cc.
//
// What it proves: GetInfo advertises the data plane and Pull, Push and
// PushPull then really go over it (the bulk server's byte counters move, the
// gRPC service's stay 0); training steps over it are bit-identical to the
// same steps over gRPC; a retried push is applied once; hostile input on a
// raw connection is refused, changes nothing and never stops the server;
// tokens are checked on the hello and every call is authorized for the task
// it names; a held pull whose client leaves is let go of, and a stopping
// server fails held pulls UNAVAILABLE; a PS whose data plane cannot be
// reached is still served through gRPC; and an overlapped (gated) push is
// sent part by part as its gates open, a failing gate abandoning it.
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
#include "worker/bulk_shard_channel.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

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
v1::PushRequest::Header Header1(int worker) {
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
  static bool SameBits(const Values& a, const Values& b) {
    if (a.size() != b.size()) return false;
    for (const auto& [name, v] : a) {
      auto it = b.find(name);
      if (it == b.end() || it->second.size() != v.size() ||
          std::memcmp(v.data(), it->second.data(), v.size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
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

TEST_F(BulkRoundTripTest, GetInfoAdvertisesTheDataPlaneAndAChunkedPullOverItIsTheShardsValues) {
  auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GT(ps().bulk()->port(), 0);
  EXPECT_EQ(info->bulk_port(), ps().bulk()->port());
  int64_t version = -1;
  int chunks = 0;
  const Values values = PullAll(channel_.get(), 0, &version, &chunks);
  EXPECT_EQ(version, 0);
  ASSERT_EQ(values.size(), shard()->parts().size());
  EXPECT_TRUE(Flat(values) == ShardBytes()) << "pulled values differ from the shard's";
  // Chunked: at most kChunk bytes each, so the kernel alone takes 15.
  EXPECT_GE(chunks, static_cast<int>(GradientBytes() / kChunk));
  // Every byte went over the data plane, none over gRPC.
  EXPECT_EQ(BulkPullBytes(), static_cast<double>(GradientBytes()));
  EXPECT_EQ(GrpcPullBytes(), 0);
  // A second pull reuses the connection.
  PullAll();
  EXPECT_EQ(BulkPullBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(ps().bulk()->open_connections(), 1);
}

TEST_F(BulkRoundTripTest, SyncStepsOverTheDataPlaneAreBitIdenticalToTheSameStepsOverGrpc) {
  // The same three steps of two workers, on this PS over bulk and on a twin
  // PS (same model, seed and options) over plain gRPC: worker 0 a PushPull
  // held at the barrier, worker 1 a Push that opens it, then a Pull.
  TestPs twin(model_.get(), &placement_, &clock_);
  PsOptions twin_options;
  twin_options.bulk = false;
  twin.Start(twin_options);
  auto grpc_channel = NewGrpcShardChannel(twin.address(), kChunk);
  ASSERT_TRUE(grpc_channel->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  ASSERT_TRUE(SameBits(PullAll(channel_.get()), PullAll(grpc_channel.get())));

  auto run_step = [&](ShardChannel* channel, const Counters& counters, int64_t step) {
    const Grads g0 = GradsOf(0, step), g1 = GradsOf(1, step);
    Values fused;
    PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
    const uint64_t handled = counters.pushes_handled();
    std::thread w0([&] {
      answer = channel->PushPull(Header(0, step, 100 + step), ChunksOf(g0), {}, BarrierPull(step),
                                 SinkInto(&fused));
    });
    // Worker 0's push is handled (its pull held) before worker 1 pushes.
    EXPECT_TRUE(Eventually([&] { return counters.pushes_handled() > handled; }));
    auto pushed = channel->Push(Header(1, step, 200 + step), ChunksOf(g1));
    w0.join();
    EXPECT_TRUE(pushed.ok()) << pushed.status();
    if (pushed.ok()) EXPECT_EQ(pushed->version(), step + 1);
    EXPECT_TRUE(answer.push.ok()) << answer.push.status();
    if (answer.push.ok()) EXPECT_EQ(answer.push->version(), step);  // held, not served at once
    EXPECT_TRUE(answer.pull.ok()) << answer.pull.status();
    if (answer.pull.ok()) EXPECT_EQ(answer.pull->version(), step + 1);
    // Worker 1's pull of the same step sees what worker 0's fused pull saw.
    v1::PullRequest pull1 = BarrierPull(step);
    pull1.set_worker_index(1);
    Values plain;
    auto h = channel->Pull(pull1, SinkInto(&plain));
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(SameBits(plain, fused));
    return fused;
  };
  for (int64_t step = 0; step < 3; ++step) {
    const Values over_bulk = run_step(channel_.get(), ps().bulk_counters(), step);
    const Values over_grpc = run_step(grpc_channel.get(), twin.grpc_counters(), step);
    ASSERT_TRUE(SameBits(over_bulk, over_grpc)) << "step " << step;
    ASSERT_TRUE(Flat(over_bulk) == ShardBytes()) << "step " << step;
  }
  EXPECT_EQ(shard()->version(), 3);
  EXPECT_EQ(shard()->stats().gradients_applied, 6);  // two per step
  // This PS saw only the data plane; the twin only gRPC.
  EXPECT_EQ(BulkPushBytes(), 6.0 * GradientBytes());
  EXPECT_EQ(GrpcPushBytes(), 0);
  EXPECT_EQ(GrpcPullBytes(), 0);
  EXPECT_EQ(twin.grpc_counters().push_bytes.Value(), 6.0 * GradientBytes());
  // Two calls at once (the held PushPull and the Push) took two connections.
  EXPECT_EQ(ps().bulk()->open_connections(), 2);
}

TEST_F(BulkRoundTripTest, ARetriedAsyncPushIsAppliedOnce) {
  PsOptions o;
  o.mode = TrainingMode::kAsync;
  Start(o);
  const Grads g = GradsOf(0, 0);
  auto first = channel_->Push(Header(0, 0, /*push_id=*/42), ChunksOf(g));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version(), 1);
  const Values once = PullAll();
  // The answer was lost; the worker sends the same push again.
  auto retry = channel_->Push(Header(0, 0, /*push_id=*/42), ChunksOf(g));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->version(), 1);
  EXPECT_FALSE(retry->dropped());
  int64_t version = -1;
  EXPECT_TRUE(SameBits(PullAll(&version), once));
  EXPECT_EQ(version, 1);
  auto next = channel_->Push(Header(0, 1, /*push_id=*/43), ChunksOf(g));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), 2);
  const ShardStatsSnapshot stats = shard()->stats();
  EXPECT_EQ(stats.duplicate_pushes, 1);
  EXPECT_EQ(stats.gradients_applied, 2);
  EXPECT_EQ(BulkPushBytes(), 3.0 * GradientBytes());  // all three over the data plane
  EXPECT_EQ(GrpcPushBytes(), 0);
}

TEST_F(BulkRoundTripTest, GarbageBytesAreRefusedAndTheServerGoesOn) {
  const std::string before = ShardBytes();
  {
    // Not a bulk client at all (an HTTP request on the wrong port): the
    // status says why, then the connection closes.
    auto socket = ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimits());
    ASSERT_TRUE(socket.ok()) << socket.status();
    const std::string http = "GET / HTTP/1.1\r\nHost: ps-0\r\n\r\n";
    ASSERT_EQ(::write((*socket)->fd(), http.data(), http.size()),
              static_cast<ssize_t>(http.size()));
    const absl::Status s = ReadStatus(socket->get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("bad magic"), std::string::npos) << s;
    EXPECT_TRUE(ClosedByServer(socket->get()));
  }
  {
    // Garbage after a good hello, in place of a call.
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    const std::string junk(64, '\x5a');
    ASSERT_EQ(::write(socket->fd(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    EXPECT_TRUE(absl::IsInvalidArgument(ReadStatus(socket.get())));
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  {
    // A call that starts with what only the server sends.
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    ASSERT_TRUE(socket->WriteFrame(BulkStatusFrame(absl::OkStatus())).ok());
    const absl::Status s = ReadStatus(socket.get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("must start with a pull or a push"), std::string::npos) << s;
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  {
    // A connection whose first frame is not a hello.
    auto socket = ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimits());
    ASSERT_TRUE(socket.ok());
    v1::BulkFrame pull;
    pull.mutable_pull();
    ASSERT_TRUE((*socket)->WriteFrame(pull).ok());
    const absl::Status s = ReadStatus(socket->get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("first frame must be its hello"), std::string::npos) << s;
  }
  ExpectUnchanged(before);
  ExpectAFreshChannelPulls();
}

TEST_F(BulkRoundTripTest, APushEndedBeforeItsGradientIsIncompleteAndChangesNothing) {
  const std::string before = ShardBytes();
  auto socket = RawConnect();
  ASSERT_NE(socket, nullptr);
  // The header, then the end at once: no gradient at all.
  ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0)).ok());
  ASSERT_TRUE(WriteEnd(socket.get()).ok());
  absl::Status s = ReadStatus(socket.get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("incomplete gradient"), std::string::npos) << s;
  // Some chunks, then the end.
  ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0)).ok());
  WriteChunks(socket.get(), Filled(1.0f), 3);
  ASSERT_TRUE(WriteEnd(socket.get(), /*pull=*/true).ok());
  int answers = 0;
  s = ReadStatus(socket.get(), &answers);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("incomplete gradient"), std::string::npos) << s;
  EXPECT_EQ(answers, 0);  // a refused PushPull never pulls
  // The stream is still in step: the same connection serves a pull.
  v1::BulkFrame pull;
  pull.mutable_pull();
  ASSERT_TRUE(socket->WriteFrame(pull).ok());
  answers = 0;
  EXPECT_TRUE(ReadStatus(socket.get(), &answers).ok());
  EXPECT_GT(answers, 1);  // the header and the chunks
  ExpectUnchanged(before);
  EXPECT_EQ(shard()->stats().pushes_rejected, 2);
  // Nothing of worker 0's waits in the step: worker 1 alone does not make it.
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f))).ok());
  EXPECT_EQ(shard()->version(), 0);
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  EXPECT_EQ(shard()->version(), 1);
}

TEST_F(BulkRoundTripTest, AMalformedChunkIsRefusedClosesTheConnectionAndChangesNothing) {
  const std::string before = ShardBytes();
  const std::string& part0 = shard()->parts()[0].name;
  const std::string floats(400, '\0');
  struct Case {
    const char* what;
    std::function<void(BulkSocket*)> send;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a chunk for an unknown part",
       [&](BulkSocket* s) { ASSERT_TRUE(WriteChunk(s, "no/such/part", 0, floats).ok()); },
       "unknown variable part \"no/such/part\""},
      {"a chunk of 6 bytes",
       [&](BulkSocket* s) { ASSERT_TRUE(WriteChunk(s, part0, 0, "abcdef").ok()); },
       "not a whole number of float32"},
      {"a chunk that leaves a gap",
       [&](BulkSocket* s) { ASSERT_TRUE(WriteChunk(s, part0, 8, floats).ok()); }, "do not follow"},
      {"a chunk with more data than the limit",
       [&](BulkSocket* s) {
         const std::string big(2 * kChunk, '\0');
         ASSERT_TRUE(WriteChunk(s, part0, 0, big).ok());
       },
       "over the limits"},
      {"a chunk with its floats inside the meta",
       [&](BulkSocket* s) {
         v1::BulkFrame frame;
         frame.mutable_push()->mutable_chunk()->set_part(part0);
         frame.mutable_push()->mutable_chunk()->set_data(floats);
         ASSERT_TRUE(s->WriteFrame(frame).ok());
       },
       "malformed bulk frame"},
      {"a pull in the middle of a push",
       [&](BulkSocket* s) {
         v1::BulkFrame frame;
         frame.mutable_pull();
         ASSERT_TRUE(s->WriteFrame(frame).ok());
       },
       "malformed bulk frame"},
      {"a second header",
       [&](BulkSocket* s) { ASSERT_TRUE(WritePushHeader(s, Header(0, 0)).ok()); },
       "malformed bulk frame"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0)).ok());
    WriteChunks(socket.get(), Filled(1.0f), 1);  // a good chunk first
    c.send(socket.get());
    const absl::Status s = ReadStatus(socket.get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
    // The stream is out of step: the server closes it.
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  ExpectUnchanged(before);
  EXPECT_EQ(shard()->stats().pushes_rejected, static_cast<int64_t>(cases.size()));
  ExpectAFreshChannelPulls();
  // Worker 0 has nothing waiting in the step.
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f))).ok());
  EXPECT_EQ(shard()->version(), 0);
}

TEST_F(BulkRoundTripTest, AConnectionClosedInTheMiddleOfAPushAppliesNothing) {
  const std::string before = ShardBytes();
  const Grads g = Filled(1.0f);
  // Half a gradient; then the whole gradient but no `end` (the bulk twin of
  // a gRPC push cancelled after its last chunk).
  for (int chunks : {5, -1}) {
    SCOPED_TRACE(chunks);
    auto socket = RawConnect();
    ASSERT_NE(socket, nullptr);
    const double read = BulkPushBytes();
    ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0, /*push_id=*/7)).ok());
    const uint64_t sent = WriteChunks(socket.get(), g, chunks);
    ASSERT_TRUE(Eventually([&] { return BulkPushBytes() == read + sent; }));
    socket.reset();
    // The server saw the connection end and let go of the push.
    ASSERT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 0; }));
    ExpectUnchanged(before);
  }
  // Worker 1 alone does not make the step: worker 0's gradient is not in it ...
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(g)).ok());
  EXPECT_EQ(shard()->version(), 0);
  // ... and worker 0's retry (same push id) is the one that counts, once.
  auto retry = channel_->Push(Header(0, 0, /*push_id=*/7), ChunksOf(g));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->version(), 1);
  EXPECT_FALSE(retry->dropped());
  EXPECT_EQ(shard()->stats().gradients_applied, 2);  // worker 1's and the retry
  EXPECT_EQ(shard()->stats().duplicate_pushes, 0);
  ExpectAFreshChannelPulls();
}

TEST_F(BulkRoundTripTest, TokensAreCheckedOnTheHelloAndEveryCallIsTheCallersOwn) {
  auto job = GenerateJobCredentials("bulk", false);
  ASSERT_TRUE(job.ok()) << job.status();
  auto other = GenerateJobCredentials("bulk", false);  // same name, another job
  ASSERT_TRUE(other.ok()) << other.status();
  PsOptions o;
  o.job_key = job->job_key;
  Start(o);
  const std::string before = ShardBytes();
  const std::string bearer0 = "Bearer " + TaskToken(job->job_key, "worker", 0);
  // Wrong or missing tokens: UNAUTHENTICATED on the hello, then closed.
  const std::vector<std::pair<std::string, std::string>> strangers = {
      {"worker/0", ""},                                                  // no token
      {"", bearer0},                                                     // no task
      {"worker/0", "Bearer " + TaskToken(other->job_key, "worker", 0)},  // another job's
      {"worker/1", bearer0},                                             // worker 0's as worker 1
      {"worker/0", TaskToken(job->job_key, "worker", 0)},                // not "Bearer ..."
  };
  for (const auto& [task, authorization] : strangers) {
    SCOPED_TRACE(task + " " + authorization);
    absl::Status hello;
    auto socket = RawConnect(&hello, task, authorization);
    ASSERT_NE(socket, nullptr);
    EXPECT_TRUE(absl::IsUnauthenticated(hello)) << hello;
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  {
    // Worker 0's token, pushing as worker 1: PERMISSION_DENIED, closed.
    absl::Status hello;
    auto socket = RawConnect(&hello, "worker/0", bearer0);
    ASSERT_TRUE(hello.ok()) << hello;
    ASSERT_TRUE(WritePushHeader(socket.get(), Header(1, 0)).ok());
    WriteChunks(socket.get(), Filled(1.0f), -1, /*expect_ok=*/false);
    WriteEnd(socket.get()).IgnoreError();  // the server may have closed by now
    const absl::Status s = ReadStatus(socket.get());
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
    EXPECT_TRUE(ClosedByServer(socket.get()));
  }
  // The same through the channel, for a push and a pull.
  auto push = channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f)));
  EXPECT_TRUE(absl::IsPermissionDenied(push.status())) << push.status();
  v1::PullRequest as_worker1;
  as_worker1.set_worker_index(1);
  Values ignored;
  auto pull = channel_->Pull(as_worker1, SinkInto(&ignored));
  EXPECT_TRUE(absl::IsPermissionDenied(pull.status())) << pull.status();
  EXPECT_TRUE(ignored.empty());
  ExpectUnchanged(before);
  // The refusals came from the data plane, none from gRPC.
  EXPECT_EQ(ps().bulk_counters().unauthenticated.Value(), static_cast<double>(strangers.size()));
  EXPECT_EQ(ps().bulk_counters().permission_denied.Value(), 3);
  EXPECT_EQ(ps().grpc_counters().unauthenticated.Value(), 0);
  EXPECT_EQ(ps().grpc_counters().permission_denied.Value(), 0);
  // The right tokens work, over the data plane.
  auto worker1 = NewChannel(1);
  v1::InfoRequest info1;
  info1.set_worker_index(1);
  ASSERT_TRUE(worker1->GetInfo(info1, absl::Seconds(10)).ok());
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  auto step = worker1->Push(Header(1, 0), ChunksOf(Filled(1.0f)));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->version(), 1);
  EXPECT_TRUE(Flat(PullAll(worker1.get(), 1)) == ShardBytes())
      << "pulled values differ from the shard\'s";
  EXPECT_EQ(BulkPushBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(GrpcPushBytes(), 0);
  EXPECT_EQ(GrpcPullBytes(), 0);
}

TEST_F(BulkRoundTripTest, AHeldPullWhoseClientLeavesIsLetGoOf) {
  PullAll();  // channel_'s connection
  auto socket = RawConnect();
  ASSERT_NE(socket, nullptr);
  ASSERT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 2; }));
  // Worker 0 waits at the barrier of step 1, which nobody opens: only a
  // cancel (or the 30 s wait on a fake clock nobody ticks) ends its hold.
  v1::BulkFrame frame;
  *frame.mutable_pull() = BarrierPull(0);
  ASSERT_TRUE(socket->WriteFrame(frame).ok());
  socket.reset();
  // The connection's thread ends only once the shard let go of the pull.
  ASSERT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 1; }));
  // Training goes on: both workers make step 1, and a barrier pull is served.
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(Filled(1.0f))).ok());
  Values after;
  auto h = channel_->Pull(BarrierPull(0), SinkInto(&after));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->version(), 1);
  EXPECT_TRUE(Flat(after) == ShardBytes()) << "pulled values differ from the shard\'s";
}

TEST_F(BulkRoundTripTest, AnIdlePushIsClosedAndChangesNothing) {
  // A push that stops sending in its middle (a worker stuck, a link gone
  // quiet) is dropped after push_idle_timeout, and the client learns it at
  // once: its connection ends, instead of waiting out its own deadline.
  PsOptions o;
  o.push_idle_timeout = absl::Milliseconds(300);
  Start(o);
  const std::string before = ShardBytes();
  auto socket = RawConnect();
  ASSERT_NE(socket, nullptr);
  ASSERT_TRUE(WritePushHeader(socket.get(), Header(0, 0, /*push_id=*/5)).ok());
  // (A machine too slow to send them within the timeout only makes it sooner.)
  WriteChunks(socket.get(), Filled(1.0f), 2, /*expect_ok=*/false);
  v1::BulkFrame frame;
  uint64_t n = 0;
  const absl::Status s = socket->ReadFrame(&frame, &n, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s << " (the server should have closed the connection)";
  EXPECT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 0; }));
  ExpectUnchanged(before);
}

// Worker 0's PushPull of step 0, its push handled and its pull held.
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

TEST_F(BulkRoundTripTest, AStoppingPsFailsAHeldPullUnavailableAndGRPCServesWhatFollows) {
  // As PsTask::Serve stops: the shard stops holding (held pulls answered
  // UNAVAILABLE with why), then the bulk server stops.
  const Grads g = Filled(0.5f);
  HeldPushPull held(channel_.get(), ps().bulk_counters(), ChunksOf(g));
  shard()->StopHolding(absl::UnavailableError("ps:0 is stopping"));
  const PushPullAnswer& answer = held.Join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kUnavailable) << answer.pull.status();
  EXPECT_NE(answer.pull.status().message().find("ps:0 is stopping"), std::string::npos)
      << answer.pull.status();
  ps().bulk()->Stop();
  EXPECT_EQ(ps().bulk()->open_connections(), 0);
  // The data plane is gone; the channel's next pull goes through gRPC.
  const double grpc_before = GrpcPullBytes();
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
  EXPECT_EQ(GrpcPullBytes() - grpc_before, static_cast<double>(GradientBytes()));
}

TEST_F(BulkRoundTripTest, ABulkServerThatStopsFailsAHeldPullUnavailable) {
  // Without StopHolding first: the server's own stop lets go of the pull.
  const Grads g = Filled(0.5f);
  HeldPushPull held(channel_.get(), ps().bulk_counters(), ChunksOf(g));
  ps().bulk()->Stop();  // returns once every connection's thread has ended
  EXPECT_EQ(ps().bulk()->open_connections(), 0);
  const PushPullAnswer& answer = held.Join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kUnavailable) << answer.pull.status();
  // The held pull left the shard: worker 1 makes the step, and the channel
  // (now through gRPC) pulls it.
  ASSERT_TRUE(channel_->Push(Header(1, 0), ChunksOf(g)).ok());
  EXPECT_EQ(shard()->version(), 1);
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
  EXPECT_GT(GrpcPullBytes(), 0);
}

TEST_F(BulkRoundTripTest, APsWhoseDataPlaneCannotBeReachedIsServedThroughGrpc) {
  // A port nobody listens on (a NetworkPolicy that admits only gRPC looks
  // the same to the worker).
  int closed_port = 0;
  auto fd = ListenBulk("127.0.0.1", 0, &closed_port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  PsOptions o;
  o.advertised_port = closed_port;
  Start(o);
  auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(5));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bulk_port(), closed_port);
  ASSERT_TRUE(channel_->Push(Header(0, 0), ChunksOf(Filled(1.0f))).ok());
  PushPullAnswer answer =
      channel_->PushPull(Header(1, 0), ChunksOf(Filled(1.0f)), {}, BarrierPull(0),
                         [](const PulledChunk&) { return absl::OkStatus(); });
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
  EXPECT_EQ(GrpcPushBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(GrpcPullBytes(), 2.0 * GradientBytes());
  EXPECT_EQ(BulkPushBytes() + BulkPullBytes(), 0);
}

TEST_F(BulkRoundTripTest, AnUnreachableDataPlaneIsReportedOnceHoweverOftenGetInfoIsPolled) {
  // The chief polls GetInfo every progress interval: a port that stays
  // unreachable is one warning, not one per poll (nor per retry).
  int closed_port = 0;
  auto fd = ListenBulk("127.0.0.1", 0, &closed_port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  PsOptions o;
  o.advertised_port = closed_port;
  Start(o);
  testing::internal::CaptureStderr();
  for (int poll = 0; poll < 3; ++poll) {
    ASSERT_TRUE(channel_->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
    PullAll();
  }
  const std::string log = testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = log.find("cannot be used"); at != std::string::npos;
       at = log.find("cannot be used", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
  EXPECT_EQ(GrpcPullBytes(), 3.0 * GradientBytes());
}

TEST_F(BulkRoundTripTest, ConnectionsOverTheLimitAreRefusedAndTheChannelUsesGrpc) {
  PsOptions o;
  o.max_connections = 1;
  Start(o);
  PullAll();  // channel_ holds the one connection
  EXPECT_EQ(ps().bulk()->open_connections(), 1);
  // One more is answered at once, before its hello, and closed.
  auto socket = ConnectBulk("127.0.0.1", ps().bulk()->port(), absl::Seconds(10), BulkLimits());
  ASSERT_TRUE(socket.ok()) << socket.status();
  const absl::Status s = ReadStatus(socket->get());
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("1 connections already open"), std::string::npos) << s;
  EXPECT_TRUE(ClosedByServer(socket->get()));
  // A second channel cannot have one: it goes through gRPC.
  auto second = NewChannel(0);
  ASSERT_TRUE(second->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  EXPECT_TRUE(Flat(PullAll(second.get())) == ShardBytes())
      << "pulled values differ from the shard\'s";
  EXPECT_EQ(GrpcPullBytes(), static_cast<double>(GradientBytes()));
  EXPECT_EQ(ps().bulk()->open_connections(), 1);
}

// An overlapped push (worker/ps_client.h, StartPushPull): its parts in
// reverse order, each chunk gated until its part's gradient is ready. The
// channel sends each part as its gate opens, the server applies the push
// whole once the last is in, and a gate that fails abandons the push.
TEST_F(BulkRoundTripTest, AGatedPushPullIsSentPartByPartAsEachIsReadyAndAFailedGateAbandonsIt) {
  PsOptions o;
  o.mode = TrainingMode::kAsync;
  Start(o);
  const auto& parts = shard()->parts();
  ASSERT_GE(parts.size(), 2u);
  const Grads grads = Filled(0.25f);
  const Values before = PullAll();
  absl::Mutex mu;
  size_t open = parts.size();  // part i's gate opens when `open` <= i
  std::vector<RefReady> gates;
  for (size_t i = 0; i < parts.size(); ++i) {
    gates.push_back([&mu, &open, i]() -> absl::Status {
      absl::MutexLock l(&mu);
      auto ready = [&open, i]() { return open <= i; };
      mu.Await(absl::Condition(&ready));
      return absl::OkStatus();
    });
  }
  std::vector<ChunkRef> chunks;
  for (size_t i = parts.size(); i-- > 0;) {
    for (size_t off = 0; off < grads[i].size(); off += 10000) {
      chunks.push_back({&parts[i].name, off, grads[i].data() + off,
                        std::min<size_t>(10000, grads[i].size() - off), &gates[i]});
    }
  }
  PushPullAnswer answer{absl::UnknownError(""), absl::UnknownError("")};
  Values after;
  std::thread step([&] {
    answer = channel_->PushPull(Header(0, 0, /*push_id=*/11), chunks, {}, v1::PullRequest(),
                                SinkInto(&after));
  });
  double read = 0;
  for (size_t i = parts.size(); i-- > 0;) {
    {
      absl::MutexLock l(&mu);
      open = i;
    }
    read += 4.0 * grads[i].size();
    // This part arrived, and no part whose gate is still closed.
    EXPECT_TRUE(Eventually([&] { return BulkPushBytes() >= read; }));
    EXPECT_EQ(BulkPushBytes(), read);
    if (i > 0) EXPECT_EQ(shard()->stats().gradients_applied, 0);  // not whole yet
  }
  step.join();
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_EQ(shard()->stats().gradients_applied, 1);
  EXPECT_FALSE(SameBits(after, before));
  EXPECT_TRUE(Flat(after) == ShardBytes()) << "pulled values differ from the shard\'s";

  // A gate that fails: the push is abandoned, nothing applied, nothing pulled.
  const RefReady fails = [] { return absl::FailedPreconditionError("never ready"); };
  std::vector<ChunkRef> doomed = ChunksOf(grads);
  doomed.back().ready = &fails;
  bool pulled = false;
  const std::string kept = ShardBytes();
  PushPullAnswer refused = channel_->PushPull(Header(0, 1, /*push_id=*/12), doomed, {},
                                              v1::PullRequest(), [&](const PulledChunk&) {
                                                pulled = true;
                                                return absl::OkStatus();
                                              });
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.push.status())) << refused.push.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.pull.status()));
  EXPECT_FALSE(pulled);
  // The server let go of the half-sent push when the channel closed its connection.
  EXPECT_TRUE(Eventually([&] { return ps().bulk()->open_connections() == 0; }));
  EXPECT_EQ(shard()->stats().gradients_applied, 1);
  EXPECT_EQ(shard()->version(), 1);
  EXPECT_TRUE(ShardBytes() == kept);
  // The channel goes on over the data plane (a new connection).
  auto next = channel_->Push(Header(0, 1, /*push_id=*/13), ChunksOf(grads));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), 2);
}

TEST_F(BulkRoundTripTest, APushPullThatIsRefusedNeverPullsAndTheNextCallWorks) {
  Grads g = Filled(0.5f);
  g[0].pop_back();  // one element short
  bool pulled = false;
  PushPullAnswer answer =
      channel_->PushPull(Header(0, 0), ChunksOf(g), {}, v1::PullRequest(), [&](const PulledChunk&) {
        pulled = true;
        return absl::OkStatus();
      });
  EXPECT_EQ(answer.push.status().code(), absl::StatusCode::kInvalidArgument)
      << answer.push.status();
  EXPECT_NE(answer.push.status().message().find("(bulk)"), std::string::npos)
      << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(pulled);
  EXPECT_EQ(shard()->stats().gradients_applied, 0);
  EXPECT_EQ(GrpcPushBytes(), 0);
  // The next call works.
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
}

TEST_F(BulkRoundTripTest, ASinkThatFailsEndsThePullAndTheNextPullIsWhole) {
  int calls = 0;
  auto h = channel_->Pull(v1::PullRequest(), [&](const PulledChunk&) {
    return ++calls == 2 ? absl::AbortedError("enough") : absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsAborted(h.status())) << h.status();
  EXPECT_EQ(calls, 2);
  // The rest of that answer is not mistaken for the next pull's.
  EXPECT_TRUE(Flat(PullAll()) == ShardBytes()) << "pulled values differ from the shard\'s";
}

// Embedding-table gradient rows ride a push over the data plane (ids in the
// meta, rows as data, split over frames of at most the chunk size) and land
// exactly as the same push over gRPC does.
TEST(BulkSparseTest, SparseRowsPushedOverTheDataPlaneMatchTheSamePushOverGrpc) {
  ModelSpec spec;
  spec.type = "layers";
  spec.input_shape = {1};
  LayerSpec dense;
  dense.units = 1;
  spec.layers = {dense};
  spec.head = HeadType::kSigmoid;
  spec.num_classes = 2;
  spec.sparse_inputs = {{"c", 20000, 1}};
  spec.embeddings = {{"c", 4, Combiner::kSum}};
  const Model model = *Model::Create(spec);
  const Placement placement = PlaceVariables(model.variables(), 1, 1 << 30);
  FakeClock clock;
  PsOptions o;
  o.mode = TrainingMode::kAsync;
  TestPs bulk_ps(&model, &placement, &clock);
  bulk_ps.Start(o);
  o.bulk = false;
  TestPs grpc_ps(&model, &placement, &clock);
  grpc_ps.Start(o);
  auto bulk = NewPsChannel(bulk_ps.address(), kChunk);
  auto grpc = NewGrpcShardChannel(grpc_ps.address(), kChunk);
  ASSERT_TRUE(bulk->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  ASSERT_TRUE(grpc->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  Shard* shard = bulk_ps.shard();
  ASSERT_EQ(shard->tables().size(), 1u);
  const std::string table = shard->tables()[0].name;
  const uint64_t dim = 4;

  // Dense gradient (every part: a push is whole) and 9000 rows: 144000
  // bytes, three frames of at most 64 KiB; one id twice (summed).
  std::vector<std::vector<float>> dense_grads;
  std::vector<ChunkRef> chunks;
  for (const auto& p : shard->parts()) dense_grads.emplace_back(p.num_elements(), 0.125f);
  for (size_t i = 0; i < dense_grads.size(); ++i) {
    chunks.push_back({&shard->parts()[i].name, 0, dense_grads[i].data(), dense_grads[i].size()});
  }
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 9000; ++id) ids.push_back((id * 7919) % 20000);
  ids[8999] = ids[0];
  std::vector<float> rows(ids.size() * dim);
  for (size_t k = 0; k < rows.size(); ++k) rows[k] = 0.001f * std::cos(0.1f * k);
  // The bulk channel splits one ref into frames itself; gRPC needs it
  // split into messages by the caller (as PsClient does).
  const std::vector<SparseRef> whole = {{&table, ids.data(), ids.size(), rows.data(), dim}};
  std::vector<SparseRef> pieces;
  for (uint64_t first = 0; first < ids.size(); first += 3000) {
    pieces.push_back({&table, ids.data() + first, 3000, rows.data() + first * dim, dim});
  }

  auto over_bulk = bulk->Push(Header1(0), chunks, whole);
  ASSERT_TRUE(over_bulk.ok()) << over_bulk.status();
  auto over_grpc = grpc->Push(Header1(0), chunks, pieces);
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status();
  EXPECT_EQ(over_bulk->version(), 1);
  EXPECT_EQ(over_grpc->version(), 1);
  EXPECT_EQ(bulk_ps.bulk_counters().push_bytes.Value(),
            static_cast<double>(shard->gradient_bytes() + rows.size() * 4));
  EXPECT_EQ(bulk_ps.grpc_counters().push_bytes.Value(), 0);

  // Every row of the table, read back from both: bit for bit the same.
  auto all_rows = [&](ShardChannel* channel) {
    std::string out;
    for (uint64_t first = 0; first < 20000; first += 2000) {  // a message's worth at a time
      v1::SparsePullRequest req;
      auto* t = req.add_tables();
      t->set_table(table);
      for (uint64_t id = first; id < first + 2000; ++id) t->add_ids(id);
      auto r = channel->SparsePull(req);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) out += r->tables(0).data();
    }
    return out;
  };
  const std::string a = all_rows(bulk.get()), b = all_rows(grpc.get());
  EXPECT_EQ(a.size(), 20000u * dim * 4);
  EXPECT_TRUE(a == b) << "the table's rows differ";
}

}  // namespace
}  // namespace kubetrain
