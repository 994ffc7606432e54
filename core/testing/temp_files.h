// Helpers shared by tests that write files: fresh temp directories, whole-file
// reads and writes, damaging a file on purpose, and a gtest-only substring
// assertion (gmock is not among the system deps). Test code only.
#ifndef KUBETRAIN_CORE_TESTING_TEMP_FILES_H_
#define KUBETRAIN_CORE_TESTING_TEMP_FILES_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace kubetrain {

// A path under ::testing::TempDir() that is unique per call
// ("<prefix>_<test name>_<pid>_<n>") and does not exist (anything left there
// by an earlier run is removed). The directory itself is not created.
std::string NewTestDir(std::string_view prefix);

// The whole file, or "" if it cannot be read.
std::string ReadFile(const std::string& path);
// Replaces the file's content with `data` (creating it); the directory must exist.
void WriteFile(const std::string& path, const std::string& data);
// XORs byte `offset` of the file with `mask`. REQUIRES: offset < file size.
void FlipByte(const std::string& path, size_t offset, unsigned char mask);
// Cuts the file down to its first `size` bytes.
void TruncateFile(const std::string& path, size_t size);
// Names in `dir` except "." and "..", sorted; empty if it cannot be listed.
std::vector<std::string> ListDir(const std::string& dir);

// Success iff `text` contains `part`; the failure message shows both.
::testing::AssertionResult Contains(const std::string& text, const std::string& part);
#define EXPECT_CONTAINS(text, part) EXPECT_TRUE(::kubetrain::Contains((text), (part)))

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_TESTING_TEMP_FILES_H_
