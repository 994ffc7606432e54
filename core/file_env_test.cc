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

TEST(FileEnvTest, StreamedWriteTakesPiecesAndAFailedOneLeavesNothing) {
  const std::string dir = NewTestDir("env");
  FileEnv* env = FileEnv::Default();
  // Small pieces and one larger than the write buffer (1 MiB).
  const std::string big(3 << 20, 'x');
  std::string expected;
  auto produce = [&](const FileEnv::ByteSink& sink) -> absl::Status {
    for (std::string_view piece : {std::string_view("ab"), std::string_view(big),
                                   std::string_view("c"), std::string_view("")}) {
      if (absl::Status st = sink(piece); !st.ok()) return st;
    }
    return absl::OkStatus();
  };
  expected = "ab" + big + "c";
  ASSERT_TRUE(env->WriteFileAtomically(dir + "/f", produce).ok());
  EXPECT_EQ(ReadFile(dir + "/f"), expected);

  // A producer that fails: the old file stays, no temp file is left.
  absl::Status st = env->WriteFileAtomically(dir + "/f", [](const FileEnv::ByteSink& sink) {
    (void)sink("partial");
    return absl::DataLossError("the producer broke");
  });
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_EQ(ReadFile(dir + "/f"), expected);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"f"});

  // A wrapper that overrides only the string write sees the streamed bytes.
  class Recording : public EnvWrapper {
   public:
    Recording() : EnvWrapper(FileEnv::Default()) {}
    absl::Status WriteFileAtomically(const std::string& path, const std::string& data) override {
      seen = data;
      return target()->WriteFileAtomically(path, data);
    }
    std::string seen;
  } recording;
  FileEnv* as_env = &recording;
  ASSERT_TRUE(as_env->WriteFileAtomically(dir + "/g", produce).ok());
  EXPECT_EQ(recording.seen, expected);
  EXPECT_EQ(ReadFile(dir + "/g"), expected);
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
