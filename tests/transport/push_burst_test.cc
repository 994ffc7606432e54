// Issue 26, item 5: a burst of 200 concurrent pushes to one real
// kubetrain-ps -- on one connection, on a connection each, through the
// workers' own channel, and with the job's credentials (tokens, mutual
// TLS). Every push either succeeds or is refused with a status whose message
// names the limit (or the reason) that refused it: a refusal logged as ""
// cannot be told from any other. (An empty RESOURCE_EXHAUSTED was reported
// from such a burst; here every refusal is one of the PS's two stream
// limits, or a bad token, with text. gRPC 1.51's own RESOURCE_EXHAUSTEDs --
// message size, RST_STREAM ENHANCE_YOUR_CALM, metadata size -- carry text
// too; both ends now also fill in any status that arrives without it.)
#include <gtest/gtest.h>

#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/job_credentials.h"
#include "core/testing/temp_files.h"
#include "tests/transport/ps_process.h"
#include "tests/transport/raw_ps_client.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

constexpr int kWorkers = 4;
constexpr int kPushes = 200;

class PushBurstTest : public ::testing::Test {
 protected:
  void SetUp() override { StartPs({"--insecure"}); }

  // The PS, with `extra_args`; `caller` is the workers' identity (none when
  // the PS runs open).
  void StartPs(const std::vector<std::string>& extra_args, const CallerCredentials& caller = {}) {
    ps_ = std::make_unique<PsProcess>(
        "ps/kubetrain-ps",
        absl::StrCat("apiVersion: kubetrain.io/v1\n"
                     "kind: TrainingJob\n"
                     "metadata:\n  name: push-burst\n"
                     "spec:\n  replicaSpecs:\n    PS:\n      replicas: 1\n"
                     "    Worker:\n      replicas: ",
                     kWorkers,
                     "\n"
                     "  training:\n    mode: async\n"
                     "    model:\n      type: mlp\n      hiddenUnits: [2048]\n"
                     "    optimizer:\n      type: sgd\n      learningRate: 0.01\n"
                     "    batchSize: 32\n    steps: 100000\n"),
        kWorkers, extra_args);
    ASSERT_TRUE(ps_->started()) << "cannot start ps/kubetrain-ps";
    auto channel = NewGrpcShardChannel(ps_->address(), 1 << 20, caller);
    auto info = channel->GetInfo(v1::InfoRequest(), absl::Seconds(60));
    ASSERT_TRUE(info.ok()) << info.status();
    parts_.clear();
    for (const auto& p : info->parts()) {
      parts_.push_back({p.name(), std::vector<float>(p.rows() * p.cols(), 0.001f)});
    }
  }

  // Pushes from worker `i % kWorkers` on `channel`, all started together.
  // (with `metadata(i)`, if given).
  std::vector<grpc::Status> Burst(
      const std::function<std::shared_ptr<grpc::Channel>(int)>& channel,
      const std::function<RawPsClient::Metadata(int)>& metadata = nullptr) {
    std::vector<std::unique_ptr<RawPsClient>> clients;
    std::vector<std::vector<std::string>> pushes;  // by worker
    for (int w = 0; w < kWorkers; ++w) {
      v1::PushRequest::Header h;
      h.set_worker_index(w);
      h.set_version(0);
      h.set_worker_clock(1);
      pushes.push_back(EncodePush(h, parts_, 1 << 18));  // 1 MB chunks, as the workers send
    }
    for (int i = 0; i < kPushes; ++i) {
      clients.push_back(std::make_unique<RawPsClient>(
          channel(i), metadata ? metadata(i) : RawPsClient::Metadata{}));
    }
    absl::Notification go;
    std::vector<grpc::Status> statuses(kPushes);
    std::vector<std::thread> threads;
    for (int i = 0; i < kPushes; ++i) {
      threads.emplace_back([&, i] {
        go.WaitForNotification();
        statuses[i] = clients[i]->Push(pushes[i % kWorkers], RawPsClient::End::kHalfClose, nullptr,
                                       nullptr, absl::Seconds(60));
      });
    }
    go.Notify();
    for (auto& t : threads) t.join();
    return statuses;
  }

  // Every refusal names its limit; prints a summary by code and message.
  void ExpectEveryRefusalSaysWhy(const std::vector<grpc::Status>& statuses) {
    std::map<std::string, int> seen;
    int ok = 0;
    for (const auto& s : statuses) {
      if (s.ok()) {
        ++ok;
        continue;
      }
      ++seen[absl::StrCat(s.error_code(), " \"", s.error_message(), "\"")];
      EXPECT_FALSE(s.error_message().empty()) << "code " << s.error_code() << " with no message";
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        EXPECT_NE(s.error_message().find("is not that task's token"), std::string::npos)
            << s.error_message();
      }
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        EXPECT_TRUE(s.error_message().find("push streams already open on this PS") !=
                        std::string::npos ||
                    s.error_message().find("push streams open on this PS") != std::string::npos)
            << s.error_message();
      }
    }
    std::printf("%d of %zu pushes applied\n", ok, statuses.size());
    for (const auto& [what, n] : seen) std::printf("  %d x %s\n", n, what.c_str());
    EXPECT_GT(ok, 0);
  }

  // Pushes from worker `i % kWorkers`, each worker's through its own
  // kubetrain channel (the worker's path, whose statuses say "ps at ADDR: ").
  std::vector<absl::Status> WorkerBurst() {
    std::vector<std::unique_ptr<ShardChannel>> channels;
    for (int w = 0; w < kWorkers; ++w)
      channels.push_back(NewGrpcShardChannel(ps_->address(), 1 << 20));
    std::vector<ChunkRef> chunks;
    for (const auto& p : parts_) {
      for (size_t off = 0; off < p.values.size(); off += 1 << 18) {
        chunks.push_back({&p.part, off, p.values.data() + off,
                          std::min<size_t>(1 << 18, p.values.size() - off)});
      }
    }
    absl::Notification go;
    std::vector<absl::Status> statuses(kPushes);
    std::vector<std::thread> threads;
    for (int i = 0; i < kPushes; ++i) {
      threads.emplace_back([&, i] {
        v1::PushRequest::Header h;
        h.set_worker_index(i % kWorkers);
        h.set_worker_clock(1);
        go.WaitForNotification();
        statuses[i] = channels[i % kWorkers]->Push(h, chunks).status();
      });
    }
    go.Notify();
    for (auto& t : threads) t.join();
    return statuses;
  }

  std::unique_ptr<PsProcess> ps_;
  std::vector<PartGradient> parts_;
};

TEST_F(PushBurstTest, OneConnectionEveryRefusalNamesItsLimit) {
  auto channel = grpc::CreateChannel(ps_->address(), grpc::InsecureChannelCredentials());
  ExpectEveryRefusalSaysWhy(Burst([&](int) { return channel; }));
  EXPECT_TRUE(ps_->Running());
}

TEST_F(PushBurstTest, AConnectionPerPushEveryRefusalNamesItsLimit) {
  ExpectEveryRefusalSaysWhy(Burst([&](int) {
    // Its own connection, as from separate worker processes (channels with
    // the same arguments would share one from gRPC's global pool).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(ps_->address(), grpc::InsecureChannelCredentials(), args);
  }));
  EXPECT_TRUE(ps_->Running());
}

TEST_F(PushBurstTest, ThroughTheWorkersChannelEveryRefusalNamesItsLimit) {
  std::vector<grpc::Status> statuses;
  const std::string prefix = absl::StrCat("ps at ", ps_->address(), ": ");
  for (const absl::Status& s : WorkerBurst()) {
    if (s.ok()) {
      statuses.push_back(grpc::Status::OK);
      continue;
    }
    // The channel names the PS; what follows is the PS's (or gRPC's) own word.
    ASSERT_EQ(s.message().substr(0, prefix.size()), prefix) << s;
    statuses.emplace_back(static_cast<grpc::StatusCode>(s.code()),
                          std::string(s.message().substr(prefix.size())));
  }
  ExpectEveryRefusalSaysWhy(statuses);
  EXPECT_TRUE(ps_->Running());
}

// With the job's credentials (tokens and mutual TLS, ps/rpc_auth.h): every
// tenth push carries another job's token and is refused as such; the rest
// meet the same limits as on an open PS.
TEST_F(PushBurstTest, WithAuthEveryRefusalNamesItsLimitOrItsReason) {
  auto job = GenerateJobCredentials("push-burst", /*tls=*/true);
  auto other = GenerateJobCredentials("push-burst", /*tls=*/true);
  ASSERT_TRUE(job.ok() && other.ok());
  const std::string dir = NewTestDir("ps-auth");
  ASSERT_TRUE(WriteTaskCredentials(dir, CredentialsForTask(*job, "ps", 0)).ok());
  const std::string worker_dir = NewTestDir("worker-auth");
  ASSERT_TRUE(WriteTaskCredentials(worker_dir, CredentialsForTask(*job, "worker", 0)).ok());
  auto caller = ReadCallerCredentials(worker_dir, "worker", 0);
  ASSERT_TRUE(caller.ok()) << caller.status();
  StartPs({"--auth_dir=" + dir}, *caller);
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = job->ca_cert_pem;
  tls.pem_cert_chain = job->cert_pem;
  tls.pem_private_key = job->key_pem;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(kTaskTlsName);
  auto channel = grpc::CreateCustomChannel(ps_->address(), grpc::SslCredentials(tls), args);
  const auto statuses =
      Burst([&](int) { return channel; },
            [&](int i) {
              const int w = i % kWorkers;
              const std::string& key = i % 10 == 9 ? other->job_key : job->job_key;
              return RawPsClient::Metadata{
                  {kTaskMetadataKey, TaskMetadataValue("worker", w)},
                  {kAuthorizationMetadataKey, kBearerPrefix + TaskToken(key, "worker", w)}};
            });
  ExpectEveryRefusalSaysWhy(statuses);
  int unauthenticated = 0;
  for (const auto& s : statuses)
    unauthenticated += s.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  EXPECT_EQ(unauthenticated, kPushes / 10);
  EXPECT_TRUE(ps_->Running());
}

}  // namespace
}  // namespace kubetrain
