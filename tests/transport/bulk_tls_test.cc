// The bulk data plane with TLS (proto/bulk_tls.h): a BulkServer over a Shard
// with the job's server TLS, and the worker's channel (NewBulkShardChannel)
// with a task's TLS files. Pulls and pushes go over mutual TLS; a client
// without a certificate, or with another job's, is refused before any call;
// a PsTask with TLS files and a bulk port serves the data plane in TLS.
#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "core/job_credentials.h"
#include "core/testing/task_config_for.h"
#include "proto/bulk_tls.h"
#include "proto/bulk_wire.h"
#include "ps/bulk_server.h"
#include "ps/in_process_shard_channel.h"
#include "ps/ps_task.h"
#include "worker/bulk_shard_channel.h"

namespace kubetrain {
namespace {

constexpr char kJob[] = R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: bulk-tls}
spec:
  replicaSpecs:
    PS: {replicas: 1}
    Worker: {replicas: 1}
  training:
    mode: async
    model: {type: mlp, hiddenUnits: [64]}
    optimizer: {type: sgd, learningRate: 0.1}
    steps: 100
)";

// GetInfo of the control channel, advertising `port` as the bulk port (the
// gRPC service does this from PsServiceOptions.bulk_port).
class AdvertisesBulkPort final : public ShardChannelWrapper {
 public:
  AdvertisesBulkPort(std::unique_ptr<ShardChannel> target, int port)
      : ShardChannelWrapper(std::move(target)), port_(port) {}
  absl::StatusOr<v1::ShardInfo> GetInfo(const v1::InfoRequest& request,
                                        absl::Duration timeout) override {
    auto info = ShardChannelWrapper::GetInfo(request, timeout);
    if (info.ok()) info->set_bulk_port(port_);
    return info;
  }

 private:
  const int port_;
};

CallerCredentials CallerFor(const JobCredentials& job) {
  const TaskCredentials t = CredentialsForTask(job, "worker", 0);
  CallerCredentials c;
  c.task = TaskMetadataValue("worker", 0);
  c.token = t.token;
  c.ca_cert_pem = t.ca_cert_pem;
  c.cert_pem = t.cert_pem;
  c.key_pem = t.key_pem;
  return c;
}

class BulkTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = TaskConfigFor(kJob, "ps", 0);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = std::make_unique<TaskConfig>(*std::move(config));
    auto job = GenerateJobCredentials("bulk-tls", /*with_tls=*/true);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
    auto ps = InProcessPs::Create(*config_, 0, &clock_);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = *std::move(ps);
    auto tls = BulkTlsContext::Create({job_.ca_cert_pem, job_.cert_pem, job_.key_pem, ""},
                                      /*server=*/true);
    ASSERT_TRUE(tls.ok()) << tls.status();
    BulkServerOptions options;
    options.bind_host = "127.0.0.1";
    options.max_chunk_bytes = 16 << 10;
    options.job_key = job_.job_key;
    options.tls = *tls;
    options.hello_timeout = absl::Seconds(1);  // a client that never completes a handshake
    PsServiceMetrics metrics;
    metrics.pull_bytes = &pull_bytes_;
    metrics.push_bytes = &push_bytes_;
    auto server = BulkServer::Start(ps_->shard().get(), &clock_, options, metrics);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<ShardChannel> Channel(const CallerCredentials& caller) {
    return NewBulkShardChannel(
        std::make_unique<AdvertisesBulkPort>(ps_->NewChannel(16 << 10), server_->port()),
        "127.0.0.1:1", 16 << 10, caller);
  }

  std::vector<std::string> PullParts(ShardChannel* channel, int64_t* version) {
    std::vector<std::string> parts(ps_->shard()->parts().size());
    v1::PullRequest pull;
    auto header = channel->Pull(pull, [&](const PulledChunk& c) {
      for (size_t i = 0; i < parts.size(); ++i) {
        if (ps_->shard()->parts()[i].name == c.part()) parts[i] += c.data();
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(header.ok()) << header.status();
    if (header.ok()) *version = header->version();
    return parts;
  }

  RealClock clock_;
  std::unique_ptr<TaskConfig> config_;
  JobCredentials job_;
  std::unique_ptr<InProcessPs> ps_;
  prometheus::Counter pull_bytes_, push_bytes_;
  std::unique_ptr<BulkServer> server_;
};

TEST_F(BulkTlsTest, PullsAndPushesGoOverMutualTls) {
  auto channel = Channel(CallerFor(job_));
  ASSERT_TRUE(channel->GetInfo(v1::InfoRequest(), absl::Seconds(5)).ok());
  int64_t version = -1;
  std::vector<std::string> parts = PullParts(channel.get(), &version);
  EXPECT_EQ(version, 0);
  // The bytes came over the data plane (the in-process control channel has
  // no counters), one connection kept for the next call.
  uint64_t total = 0;
  for (const auto& p : ps_->shard()->parts()) total += p.num_bytes();
  EXPECT_EQ(pull_bytes_.Value(), static_cast<double>(total));
  EXPECT_EQ(server_->open_connections(), 1);
  auto direct = ps_->NewChannel(16 << 10);  // the same pull, in process
  int64_t direct_version = -1;
  EXPECT_EQ(parts, PullParts(direct.get(), &direct_version));

  // A push, split in many chunks, applied.
  std::vector<std::vector<float>> grads;
  std::vector<ChunkRef> chunks;
  for (const auto& p : ps_->shard()->parts()) grads.emplace_back(p.num_elements(), 0.5f);
  for (size_t i = 0; i < grads.size(); ++i) {
    chunks.push_back({&ps_->shard()->parts()[i].name, 0, grads[i].data(), grads[i].size()});
  }
  v1::PushRequest::Header header;
  header.set_worker_index(0);
  header.set_version(0);
  header.set_worker_clock(1);
  header.set_incarnation(ps_->shard()->incarnation());
  header.set_push_id(7);
  auto pushed = channel->Push(header, chunks);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->version(), 1);
  EXPECT_EQ(push_bytes_.Value(), static_cast<double>(total));
  EXPECT_EQ(server_->open_connections(), 1);  // the same connection again
}

TEST_F(BulkTlsTest, AClientWithoutACertificateIsRefusedBeforeAnyCall) {
  auto socket = ConnectBulk("127.0.0.1", server_->port(), absl::Seconds(5), BulkLimits());
  ASSERT_TRUE(socket.ok()) << socket.status();
  v1::BulkFrame hello;
  hello.mutable_hello()->set_task(TaskMetadataValue("worker", 0));
  hello.mutable_hello()->set_authorization("Bearer " + TaskToken(job_.job_key, "worker", 0));
  // Plain bytes where the server expects a TLS ClientHello: the handshake
  // fails and the connection closes with no answer.
  (void)(*socket)->WriteFrame(hello, {}, absl::Now() + absl::Seconds(5));
  v1::BulkFrame answer;
  uint64_t data_bytes = 0;
  absl::Status s = (*socket)->ReadFrame(&answer, &data_bytes, absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(pull_bytes_.Value(), 0);
}

TEST_F(BulkTlsTest, AnotherJobsCertificateIsRefusedAndTheChannelFallsBack) {
  auto other = GenerateJobCredentials("other-job", /*with_tls=*/true);
  ASSERT_TRUE(other.ok()) << other.status();
  // Its own CA does not know this server's certificate: the client refuses.
  auto client = BulkTlsContext::Create(
      {other->ca_cert_pem, other->cert_pem, other->key_pem, kTaskTlsName}, /*server=*/false);
  ASSERT_TRUE(client.ok()) << client.status();
  auto socket = ConnectBulk("127.0.0.1", server_->port(), absl::Seconds(5), BulkLimits());
  ASSERT_TRUE(socket.ok()) << socket.status();
  auto session = (*client)->Handshake((*socket)->fd(), absl::Now() + absl::Seconds(10));
  ASSERT_FALSE(session.ok());
  EXPECT_TRUE(absl::IsUnauthenticated(session.status())) << session.status();

  // This job's CA but the other job's certificate: the server refuses it.
  auto mixed = BulkTlsContext::Create(
      {job_.ca_cert_pem, other->cert_pem, other->key_pem, kTaskTlsName}, /*server=*/false);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  socket = ConnectBulk("127.0.0.1", server_->port(), absl::Seconds(5), BulkLimits());
  ASSERT_TRUE(socket.ok()) << socket.status();
  session = (*mixed)->Handshake((*socket)->fd(), absl::Now() + absl::Seconds(10));
  if (session.ok()) {
    // TLS 1.3: the client's handshake ends before the server has checked its
    // certificate; the refusal arrives as the first read.
    (*socket)->UseTls(*std::move(session));
    v1::BulkFrame frame;
    frame.mutable_hello()->set_task(TaskMetadataValue("worker", 0));
    (void)(*socket)->WriteFrame(frame, {}, absl::Now() + absl::Seconds(5));
    uint64_t data_bytes = 0;
    EXPECT_FALSE((*socket)->ReadFrame(&frame, &data_bytes, absl::Now() + absl::Seconds(10)).ok());
  }

  // A worker channel with the other job's files cannot use the data plane,
  // says so once and goes through its control channel.
  CallerCredentials caller = CallerFor(*other);
  auto channel = Channel(caller);
  ASSERT_TRUE(channel->GetInfo(v1::InfoRequest(), absl::Seconds(5)).ok());
  int64_t version = -1;
  PullParts(channel.get(), &version);
  EXPECT_EQ(version, 0);
  EXPECT_EQ(pull_bytes_.Value(), 0);
}

TEST(BulkTlsPsTaskTest, APsTaskWithTlsFilesServesTheDataPlaneInTls) {
  auto config = TaskConfigFor(kJob, "ps", 0);
  ASSERT_TRUE(config.ok()) << config.status();
  auto job = GenerateJobCredentials("bulk-tls", /*with_tls=*/true);
  ASSERT_TRUE(job.ok()) << job.status();
  PsTaskOptions options;
  options.metrics_address = "";
  options.bind_host = "127.0.0.1";
  options.port = 0;
  options.bulk_port = 0;
  options.credentials = CredentialsForTask(*job, "ps", 0);
  RealClock clock;
  auto task =
      PsTask::Create(*std::move(config), options, &clock, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_TRUE((*task)->Start().ok());
  ASSERT_GT((*task)->bulk_port(), 0);
  auto client = BulkTlsContext::Create(
      {job->ca_cert_pem, job->cert_pem, job->key_pem, kTaskTlsName}, /*server=*/false);
  ASSERT_TRUE(client.ok()) << client.status();
  auto socket = ConnectBulk("127.0.0.1", (*task)->bulk_port(), absl::Seconds(5), BulkLimits());
  ASSERT_TRUE(socket.ok()) << socket.status();
  auto session = (*client)->Handshake((*socket)->fd(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(session.ok()) << session.status();
  (*socket)->UseTls(*std::move(session));
  v1::BulkFrame frame;
  frame.mutable_hello()->set_task(TaskMetadataValue("worker", 0));
  frame.mutable_hello()->set_authorization("Bearer " + TaskToken(job->job_key, "worker", 0));
  ASSERT_TRUE((*socket)->WriteFrame(frame, {}, absl::Now() + absl::Seconds(5)).ok());
  uint64_t data_bytes = 0;
  ASSERT_TRUE((*socket)->ReadFrame(&frame, &data_bytes, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(frame.has_status());
  EXPECT_TRUE(FromBulkStatus(frame.status()).ok()) << frame.status().message();
  // A wrong token on a good TLS connection: UNAUTHENTICATED.
  socket = ConnectBulk("127.0.0.1", (*task)->bulk_port(), absl::Seconds(5), BulkLimits());
  ASSERT_TRUE(socket.ok());
  session = (*client)->Handshake((*socket)->fd(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(session.ok()) << session.status();
  (*socket)->UseTls(*std::move(session));
  frame.Clear();
  frame.mutable_hello()->set_task(TaskMetadataValue("worker", 0));
  frame.mutable_hello()->set_authorization("Bearer " + TaskToken(job->job_key, "worker", 1));
  ASSERT_TRUE((*socket)->WriteFrame(frame, {}, absl::Now() + absl::Seconds(5)).ok());
  ASSERT_TRUE((*socket)->ReadFrame(&frame, &data_bytes, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(frame.has_status());
  EXPECT_EQ(FromBulkStatus(frame.status()).code(), absl::StatusCode::kUnauthenticated);
  (*task)->Stop();
}

}  // namespace
}  // namespace kubetrain
