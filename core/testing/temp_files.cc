#include "core/testing/temp_files.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kubetrain {

std::string NewTestDir(std::string_view prefix) {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  // A parameterized test's name is "Test/Param": one directory level, not two.
  const std::string name =
      info != nullptr ? absl::StrReplaceAll(info->name(), {{"/", "_"}}) : "none";
  std::string dir = absl::StrCat(::testing::TempDir(), "/", std::string(prefix), "_", name, "_",
                                 ::getpid(), "_", counter.fetch_add(1));
  std::string cmd = absl::StrCat("rm -rf '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

void FlipByte(const std::string& path, size_t offset, unsigned char mask) {
  std::string data = ReadFile(path);
  ASSERT_LT(offset, data.size()) << path;
  data[offset] = static_cast<char>(static_cast<unsigned char>(data[offset]) ^ mask);
  WriteFile(path, data);
}

void TruncateFile(const std::string& path, size_t size) {
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (absl::StrContains(text, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

}  // namespace kubetrain
