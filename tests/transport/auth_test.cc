// Issue 9, finding 7 ("any client that can reach a PS port can push
// gradients, read the model, or stop the PS"), against a real kubetrain-ps
// process on a loopback socket, with its job's credentials
// (core/job_credentials.h) in --auth_dir:
//
//   tokens     a call without the token, with another job's token, or with
//              a worker's token acting as another task is refused
//              (UNAUTHENTICATED / PERMISSION_DENIED) and changes nothing; a
//              worker cannot end the job; the PS serves on;
//   TLS        a plaintext client, a client with another job's certificate
//              and a client without a certificate are refused before any
//              call reaches the service; the job's own client is served.
//
// Each refusal is followed by the same call with the right credentials
// succeeding, so a PS that refused everything would fail the tests too.
//
// Issue 26, item 5: a PS with no credentials at all refuses to start (exit
// code 2, the reason naming --auth_dir and --insecure) unless --insecure (or
// KUBETRAIN_INSECURE=1) says to run it open; then it serves anyone.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "core/job_credentials.h"
#include "core/testing/temp_files.h"
#include "tests/transport/ps_process.h"
#include "tests/transport/raw_ps_client.h"
#include "worker/grpc_shard_channel.h"

namespace kubetrain {
namespace {

constexpr char kJob[] =
    "apiVersion: kubetrain.io/v1\n"
    "kind: TrainingJob\n"
    "metadata:\n  name: auth\n"
    "spec:\n  replicaSpecs:\n    PS:\n      replicas: 1\n"
    "    Worker:\n      replicas: 2\n"
    "  training:\n    mode: async\n"
    "    model:\n      type: softmax\n"
    "    optimizer:\n      type: sgd\n      learningRate: 0.01\n"
    "    batchSize: 32\n    steps: 1000\n";

// The metadata task `type`/`index` of `job` sends.
RawPsClient::Metadata As(const JobCredentials& job, const std::string& type, int index) {
  return {{kTaskMetadataKey, TaskMetadataValue(type, index)},
          {kAuthorizationMetadataKey, kBearerPrefix + TaskToken(job.job_key, type, index)}};
}

std::string InfoRequest(int worker) {
  v1::InfoRequest req;
  req.set_worker_index(worker);
  return req.SerializeAsString();
}

std::string ShutdownRequest(int worker) {
  v1::ShutdownRequest req;
  req.set_worker_index(worker);
  return req.SerializeAsString();
}

// A kubetrain-ps serving kJob with `creds` (the PS's files) in its --auth_dir.
class AuthenticatedPsTest : public ::testing::Test {
 protected:
  void StartPs(bool tls) {
    auto job = GenerateJobCredentials("auth", tls);
    auto other = GenerateJobCredentials("auth", tls);  // same name, another job
    ASSERT_TRUE(job.ok() && other.ok());
    job_ = *job;
    other_ = *other;
    const std::string dir = NewTestDir("ps-auth");
    ASSERT_TRUE(WriteTaskCredentials(dir, CredentialsForTask(job_, "ps", 0)).ok());
    ps_ = std::make_unique<PsProcess>("ps/kubetrain-ps", kJob, 2,
                                      std::vector<std::string>{"--auth_dir=" + dir});
    ASSERT_TRUE(ps_->started()) << "cannot start ps/kubetrain-ps";
    // The job's own worker channel, as kubetrain-worker builds it.
    const std::string worker_dir = NewTestDir("worker-auth");
    ASSERT_TRUE(WriteTaskCredentials(worker_dir, CredentialsForTask(job_, "worker", 0)).ok());
    auto caller = ReadCallerCredentials(worker_dir, "worker", 0);
    ASSERT_TRUE(caller.ok()) << caller.status();
    channel_ = NewGrpcShardChannel(ps_->address(), 1 << 20, *caller);
    auto info = channel_->GetInfo(v1::InfoRequest(), absl::Seconds(60));
    ASSERT_TRUE(info.ok()) << info.status();
    for (const auto& p : info->parts()) {
      parts_.push_back({p.name(), std::vector<float>(p.rows() * p.cols(), 0.001f)});
    }
  }

  // A channel to the PS: plaintext, or TLS trusting `ca_pem` and presenting
  // `cert_pem`/`key_pem` (none if empty).
  std::shared_ptr<grpc::Channel> Channel(const std::string& ca_pem = "",
                                         const std::string& cert_pem = "",
                                         const std::string& key_pem = "") const {
    grpc::ChannelArguments args;
    if (ca_pem.empty()) {
      return grpc::CreateCustomChannel(ps_->address(), grpc::InsecureChannelCredentials(), args);
    }
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ca_pem;
    tls.pem_cert_chain = cert_pem;
    tls.pem_private_key = key_pem;
    args.SetSslTargetNameOverride(kTaskTlsName);
    return grpc::CreateCustomChannel(ps_->address(), grpc::SslCredentials(tls), args);
  }
  // The job's own TLS channel (plaintext when the job has no TLS).
  std::shared_ptr<grpc::Channel> JobChannel() const {
    return Channel(job_.ca_cert_pem, job_.cert_pem, job_.key_pem);
  }

  std::vector<std::string> Push(int worker) const {
    v1::PushRequest::Header h;
    h.set_worker_index(worker);
    h.set_version(0);
    h.set_worker_clock(1);
    return EncodePush(h, parts_, 1 << 16);
  }

  // The shard's stats, asked as worker 0.
  v1::ShardStats Stats() const {
    RawPsClient client(JobChannel(), As(job_, "worker", 0));
    std::string out;
    grpc::Status s = client.Unary("GetStats", InfoRequest(0), &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    v1::ShardStats stats;
    stats.ParseFromString(out);
    return stats;
  }

  double AuthFailures(const std::string& reason) const {
    return Metric(ScrapeMetrics(ps_->metrics_port()),
                  absl::StrCat("kubetrain_rpc_auth_failures_total{reason=\"", reason, "\"}"));
  }

  JobCredentials job_;
  JobCredentials other_;
  std::unique_ptr<PsProcess> ps_;
  std::unique_ptr<ShardChannel> channel_;
  std::vector<PartGradient> parts_;
};

TEST_F(AuthenticatedPsTest, NoTokenIsUnauthenticatedAndChangesNothing) {
  StartPs(false);
  RawPsClient anonymous(Channel());
  std::string out;
  grpc::Status push = anonymous.Push(Push(0), RawPsClient::End::kHalfClose, &out);
  EXPECT_EQ(push.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_CONTAINS(push.error_message(),
                  "Push: no credentials (x-kubetrain-task and authorization metadata missing): "
                  "this PS admits only the tasks of its job; give the task this job's auth "
                  "directory");
  EXPECT_EQ(anonymous.Unary("GetInfo", InfoRequest(0), &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(anonymous.Pull(v1::PullRequest().SerializeAsString(), nullptr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(anonymous.Unary("Shutdown", ShutdownRequest(0), &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(AuthFailures("unauthenticated"), 4);

  v1::ShardStats stats = Stats();
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.gradients_applied(), 0);
  EXPECT_EQ(stats.pushes_rejected(), 0);
  std::string how;
  EXPECT_TRUE(ps_->Running(&how)) << how;
  // The same push with worker 0's token is applied.
  RawPsClient worker0(JobChannel(), As(job_, "worker", 0));
  push = worker0.Push(Push(0), RawPsClient::End::kHalfClose, &out);
  ASSERT_TRUE(push.ok()) << push.error_message();
  EXPECT_EQ(Stats().version(), 1);
}

TEST_F(AuthenticatedPsTest, AnotherJobsTokenIsUnauthenticated) {
  StartPs(false);
  RawPsClient stranger(Channel(), As(other_, "worker", 0));
  std::string out;
  grpc::Status push = stranger.Push(Push(0), RawPsClient::End::kHalfClose, &out);
  EXPECT_EQ(push.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_CONTAINS(push.error_message(),
                  "Push: the token presented as worker/0 is not that task's token in this job");
  grpc::Status pull = stranger.Pull(v1::PullRequest().SerializeAsString(), nullptr);
  EXPECT_EQ(pull.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Stats().version(), 0);
  EXPECT_EQ(Stats().gradients_applied(), 0);
  EXPECT_EQ(AuthFailures("unauthenticated"), 2);
}

TEST_F(AuthenticatedPsTest, AWorkerActsOnlyAsItself) {
  StartPs(false);
  std::string out;
  // Worker 0's token, pushing as worker 1.
  RawPsClient worker0(Channel(), As(job_, "worker", 0));
  grpc::Status push = worker0.Push(Push(1), RawPsClient::End::kHalfClose, &out);
  EXPECT_EQ(push.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_CONTAINS(push.error_message(),
                  "Push: the caller is worker/0 but the request names worker/1 (a task acts only "
                  "as itself)");
  // Worker 0's token under worker 1's name.
  RawPsClient::Metadata claims1 = As(job_, "worker", 0);
  claims1[0].second = "worker/1";
  RawPsClient impostor(Channel(), claims1);
  push = impostor.Push(Push(1), RawPsClient::End::kHalfClose, &out);
  EXPECT_EQ(push.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(AuthFailures("permission_denied"), 1);
  EXPECT_EQ(AuthFailures("unauthenticated"), 1);
  EXPECT_EQ(Stats().gradients_applied(), 0);
  // Worker 1 itself may.
  RawPsClient worker1(Channel(), As(job_, "worker", 1));
  push = worker1.Push(Push(1), RawPsClient::End::kHalfClose, &out);
  ASSERT_TRUE(push.ok()) << push.error_message();
  EXPECT_EQ(Stats().gradients_applied(), 1);
}

TEST_F(AuthenticatedPsTest, APushPullFollowsThePushRules) {
  StartPs(false);
  std::vector<ChunkRef> chunks;
  for (const PartGradient& p : parts_) {
    chunks.push_back({&p.part, 0, p.values.data(), p.values.size()});
  }
  v1::PushRequest::Header h;
  h.set_version(0);
  h.set_worker_clock(1);
  uint64_t pulled_bytes = 0;
  auto sink = [&](const PulledChunk& c) {
    pulled_bytes += c.data_bytes();
    return absl::OkStatus();
  };
  // The job's worker 0 channel, pushing as worker 1: refused, never pulled.
  h.set_worker_index(1);
  PushPullAnswer answer = channel_->PushPull(h, chunks, {}, v1::PullRequest(), sink);
  EXPECT_EQ(answer.push.status().code(), absl::StatusCode::kPermissionDenied)
      << answer.push.status();
  EXPECT_EQ(answer.pull.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(pulled_bytes, 0);
  EXPECT_EQ(Stats().gradients_applied(), 0);
  // As itself: applied, then the values come back.
  h.set_worker_index(0);
  answer = channel_->PushPull(h, chunks, {}, v1::PullRequest(), sink);
  ASSERT_TRUE(answer.push.ok()) << answer.push.status();
  ASSERT_TRUE(answer.pull.ok()) << answer.pull.status();
  EXPECT_EQ(answer.pull->version(), 1);
  EXPECT_EQ(pulled_bytes, answer.pull->total_bytes());
  EXPECT_GT(pulled_bytes, 0);
  EXPECT_EQ(Stats().gradients_applied(), 1);
}

TEST_F(AuthenticatedPsTest, OnlyTheChiefEndsTheJob) {
  StartPs(false);
  std::string out;
  RawPsClient worker1(Channel(), As(job_, "worker", 1));
  // As itself, and naming worker 0 (the chief of a job without a Chief replica).
  for (int named : {1, 0}) {
    grpc::Status s = worker1.Unary("Shutdown", ShutdownRequest(named), &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << named;
    EXPECT_EQ(s.error_message(),
              "Shutdown: worker/1 may not call it (only the job's chief, worker/0, ends the job)");
  }
  // The PS still serves, training included.
  std::string how;
  EXPECT_TRUE(ps_->Running(&how)) << how;
  ASSERT_TRUE(channel_->GetInfo(v1::InfoRequest(), absl::Seconds(10)).ok());
  grpc::Status push = worker1.Push(Push(1), RawPsClient::End::kHalfClose, &out);
  ASSERT_TRUE(push.ok()) << push.error_message();
  EXPECT_EQ(Stats().version(), 1);
  // The chief may.
  RawPsClient worker0(Channel(), As(job_, "worker", 0));
  grpc::Status s = worker0.Unary("Shutdown", ShutdownRequest(0), &out);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(AuthenticatedPsTest, TlsRefusesPlaintextStrangersAndClientsWithoutACertificate) {
  StartPs(true);
  std::string out;
  const RawPsClient::Metadata worker0 = As(job_, "worker", 0);
  struct Refused {
    const char* what;
    std::shared_ptr<grpc::Channel> channel;
  };
  const Refused refused[] = {
      {"plaintext", Channel()},
      {"another job's certificate", Channel(job_.ca_cert_pem, other_.cert_pem, other_.key_pem)},
      {"no client certificate", Channel(job_.ca_cert_pem)},
      // And the client refuses a PS its CA did not sign (an impostor PS).
      {"another job's CA", Channel(other_.ca_cert_pem, other_.cert_pem, other_.key_pem)},
  };
  for (const Refused& r : refused) {
    RawPsClient client(r.channel, worker0);
    grpc::Status info = client.Unary("GetInfo", InfoRequest(0), &out);
    EXPECT_EQ(info.error_code(), grpc::StatusCode::UNAVAILABLE)
        << r.what << ": " << info.error_message();
    grpc::Status push = client.Push(Push(0), RawPsClient::End::kHalfClose, &out);
    EXPECT_EQ(push.error_code(), grpc::StatusCode::UNAVAILABLE)
        << r.what << ": " << push.error_message();
  }
  // None of them reached the service.
  EXPECT_EQ(AuthFailures("unauthenticated"), 0);
  EXPECT_EQ(Stats().gradients_applied(), 0);
  // TLS does not replace the token: the job's certificate with another job's token.
  RawPsClient wrong_token(JobChannel(), As(other_, "worker", 0));
  EXPECT_EQ(wrong_token.Unary("GetInfo", InfoRequest(0), &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(AuthFailures("unauthenticated"), 1);
  // The job's own client is served.
  RawPsClient job_client(JobChannel(), worker0);
  grpc::Status push = job_client.Push(Push(0), RawPsClient::End::kHalfClose, &out);
  ASSERT_TRUE(push.ok()) << push.error_message();
  EXPECT_EQ(Stats().gradients_applied(), 1);
}

TEST(PsAuthDirTest, APsWithoutTheJobKeyRefusesToStart) {
  auto job = GenerateJobCredentials("auth", false);
  ASSERT_TRUE(job.ok());
  const std::string dir = NewTestDir("worker-only");
  ASSERT_TRUE(WriteTaskCredentials(dir, CredentialsForTask(*job, "worker", 0)).ok());
  PsProcess ps("ps/kubetrain-ps", kJob, 2, {"--auth_dir=" + dir});
  ASSERT_TRUE(ps.started());
  std::string how = "exit code 0";
  // It exits by itself (no timing: waits for the exit however long it takes).
  while (ps.Running(&how)) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(how, "exit code 2");
}

// How the PS ended (waited for however long it takes).
std::string ExitOf(PsProcess& ps) {
  std::string how = "exit code 0";
  while (ps.Running(&how)) absl::SleepFor(absl::Milliseconds(20));
  return how;
}

TEST(PsWithoutCredentialsTest, RefusesToStartUnlessInsecure) {
  const std::string dir = NewTestDir("open-ps");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string log = dir + "/termination-log";
  PsProcess ps("ps/kubetrain-ps", kJob, 2, {"--termination_log=" + log});
  ASSERT_TRUE(ps.started());
  EXPECT_EQ(ExitOf(ps), "exit code 2");
  const std::string reason = ReadFile(log);
  EXPECT_NE(reason.find("ps:0 has no credentials: without a job key it would serve any client"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("give it the job's auth directory (--auth_dir or $KUBETRAIN_AUTH_DIR, "
                        "holding job.key"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("or pass --insecure (or KUBETRAIN_INSECURE=1) to run it open"),
            std::string::npos)
      << reason;
}

TEST(PsWithoutCredentialsTest, AnUnclearKubetrainInsecureIsAnError) {
  const std::string dir = NewTestDir("open-ps-env");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string log = dir + "/termination-log";
  ASSERT_EQ(setenv("KUBETRAIN_INSECURE", "yes", 1), 0);
  PsProcess ps("ps/kubetrain-ps", kJob, 2, {"--termination_log=" + log});
  unsetenv("KUBETRAIN_INSECURE");
  ASSERT_TRUE(ps.started());
  EXPECT_EQ(ExitOf(ps), "exit code 2");
  // Refused for the variable (before the flags), not read as "no" or "yes".
  EXPECT_EQ(ReadFile(log).find("has no credentials"), std::string::npos);
}

// Open as asked: anyone's calls are served, Shutdown included.
void ExpectServesAnyone(PsProcess& ps) {
  ASSERT_TRUE(ps.started());
  auto channel = grpc::CreateChannel(ps.address(), grpc::InsecureChannelCredentials());
  RawPsClient stranger(channel);
  grpc::Status info;
  for (int i = 0; i < 600; ++i) {  // the PS takes a moment to listen
    info = stranger.Unary("GetInfo", InfoRequest(1), nullptr, absl::Seconds(5));
    if (info.ok() || !ps.Running()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(info.ok()) << info.error_message();
  EXPECT_TRUE(stranger.Unary("Shutdown", ShutdownRequest(0), nullptr, absl::Seconds(10)).ok());
  EXPECT_TRUE(ps.Running());
}

TEST(PsWithoutCredentialsTest, InsecureRunsItOpen) {
  PsProcess ps("ps/kubetrain-ps", kJob, 2, {"--insecure"});
  ExpectServesAnyone(ps);
}

TEST(PsWithoutCredentialsTest, KubetrainInsecureRunsItOpen) {
  ASSERT_EQ(setenv("KUBETRAIN_INSECURE", "1", 1), 0);
  PsProcess ps("ps/kubetrain-ps", kJob, 2);
  unsetenv("KUBETRAIN_INSECURE");
  ExpectServesAnyone(ps);
}

}  // namespace
}  // namespace kubetrain
