#include "core/file_env.h"

#include <errno.h>
#include <sys/stat.h>

#include <cstring>
#include <string>

#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

// Fails every atomic write with `err`, as a full, read-only or broken disk would.
class FailingWrites : public EnvWrapper {
 public:
  FailingWrites(int err) : EnvWrapper(FileEnv::Default()), err_(err) {}
  absl::Status WriteFileAtomically(const std::string& path, const std::string&) override {
    return OsError(err_, "cannot write " + path);
  }

 private:
  const int err_;
};

TEST(FileEnvTest, WritesAtomicallyListsAndDeletes) {
  const std::string dir = NewTestDir("env") + "/a/b";
  FileEnv* env = FileEnv::Default();
  ASSERT_TRUE(env->WriteFileAtomically(dir + "/f", "hello").ok());
  EXPECT_EQ(ReadFile(dir + "/f"), "hello");
  auto names = env->ListDir(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"f"});  // no temp file left
  EXPECT_TRUE(env->DeleteFile(dir + "/f").ok());
  EXPECT_TRUE(absl::IsNotFound(env->DeleteFile(dir + "/f")));
  EXPECT_TRUE(absl::IsNotFound(env->ListDir(dir + "/none").status()));
}

TEST(FileEnvTest, ProbeLeavesNothingBehind) {
  const std::string dir = NewTestDir("env");
  ASSERT_TRUE(ProbeWritableDir(FileEnv::Default(), dir).ok());
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(FileEnvTest, ErrorsCarryTheErrno) {
  const std::string dir = NewTestDir("env");
  for (int err : {ENOSPC, EROFS, EIO}) {
    FailingWrites env(err);
    absl::Status st = ProbeWritableDir(&env, dir);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(ErrnoOf(st), err);
    EXPECT_CONTAINS(std::string(st.message()), std::strerror(err));
    EXPECT_CONTAINS(std::string(st.message()), dir + "/.kubetrain-probe-");
  }
  EXPECT_EQ(ErrnoOf(absl::InternalError("x")), 0);
}

TEST(FileEnvTest, AFileInTheWayIsNotADirectory) {
  const std::string dir = NewTestDir("env");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/file", "x");
  absl::Status st = FileEnv::Default()->CreateDirs(dir + "/file");
  EXPECT_EQ(ErrnoOf(st), ENOTDIR);
  st = ProbeWritableDir(FileEnv::Default(), dir + "/file/sub");
  EXPECT_EQ(ErrnoOf(st), ENOTDIR) << st;
}

}  // namespace
}  // namespace kubetrain
