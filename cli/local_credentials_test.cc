#include "cli/local_credentials.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "core/job_credentials.h"
#include "core/testing/temp_files.h"

namespace kubetrain {
namespace {

TrainingJob Job() {
  auto job = ParseTrainingJob(
      "apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: {name: mnist}\nspec:\n"
      "  replicaSpecs:\n    Chief: {replicas: 1}\n    PS: {replicas: 2}\n"
      "    Worker: {replicas: 2}\n"
      "  training: {mode: sync, model: {type: softmax}, steps: 100}\n");
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 0777;
}

TEST(LocalCredentialsTest, EveryTaskGetsAPrivateDirectoryOfItsOwnRemovedAtTheEnd) {
  const std::string parent = NewTestDir("run");
  ASSERT_EQ(::mkdir(parent.c_str(), 0755), 0);
  std::string root;
  {
    // The first parent cannot hold it: the next one does.
    auto local = LocalCredentials::Create(Job(), /*tls=*/true, {parent + "/missing", parent});
    ASSERT_TRUE(local.ok()) << local.status();
    root = (*local)->root();
    EXPECT_EQ(root.rfind(parent + "/kubetrain-mnist-auth-", 0), 0u) << root;
    EXPECT_EQ(ModeOf(root), 0700u);
    const auto& dirs = (*local)->task_dirs();
    ASSERT_EQ(dirs.size(), 5u);
    EXPECT_EQ(dirs.at("worker-1"), root + "/worker-1");

    auto ps = ReadTaskCredentials(dirs.at("ps-1"));
    ASSERT_TRUE(ps.ok()) << ps.status();
    EXPECT_EQ(ps->token, "");
    EXPECT_TRUE(ps->tls());
    // Every other task holds its own token, derived from the PS's key.
    for (const auto& [name, type, index] :
         {std::tuple{"chief-0", "chief", 0}, std::tuple{"worker-0", "worker", 0},
          std::tuple{"worker-1", "worker", 1}}) {
      EXPECT_EQ(ModeOf(dirs.at(name)), 0700u) << name;
      auto task = ReadTaskCredentials(dirs.at(name));
      ASSERT_TRUE(task.ok()) << task.status();
      EXPECT_EQ(task->job_key, "") << name;
      EXPECT_EQ(task->token, TaskToken(ps->job_key, type, index)) << name;
      EXPECT_EQ(task->ca_cert_pem, ps->ca_cert_pem) << name;
    }
    // The exporter's directory holds the key (it derives its own token).
    auto exporter = ReadCallerCredentials((*local)->export_dir(), "exporter", 0);
    ASSERT_TRUE(exporter.ok()) << exporter.status();
    EXPECT_EQ(exporter->token, TaskToken(ps->job_key, "exporter", 0));
    EXPECT_TRUE(exporter->tls());
  }
  EXPECT_EQ(ModeOf(root), 0u) << root << " still exists";
  EXPECT_EQ(ListDir(parent), std::vector<std::string>{});
}

TEST(LocalCredentialsTest, WithoutTlsOnlyKeysAndTokens) {
  const std::string parent = NewTestDir("run");
  ASSERT_EQ(::mkdir(parent.c_str(), 0755), 0);
  auto local = LocalCredentials::Create(Job(), /*tls=*/false, {parent});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(ListDir((*local)->task_dirs().at("ps-0")), std::vector<std::string>{"job.key"});
  EXPECT_EQ(ListDir((*local)->task_dirs().at("worker-0")), std::vector<std::string>{"token"});
}

TEST(LocalCredentialsTest, ParentsThatCannotHoldItAreNamed) {
  const std::string a = NewTestDir("run") + "/missing";
  const std::string b = NewTestDir("run") + "/missing";
  auto local = LocalCredentials::Create(Job(), false, {a, b});
  ASSERT_FALSE(local.ok());
  EXPECT_EQ(local.status().message(), "cannot create a directory for the job's credentials (" + a +
                                          ": No such file or directory; " + b +
                                          ": No such file or directory)");
}

}  // namespace
}  // namespace kubetrain
