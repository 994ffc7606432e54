#include "core/libsvm.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

TabularSpec Spec(int64_t features, LibsvmLabels labels = LibsvmLabels::kBinary, int base = 1) {
  TabularSpec s;
  s.libsvm = true;
  s.num_features = features;
  s.index_base = base;
  s.libsvm_labels = labels;
  if (labels == LibsvmLabels::kClasses) s.libsvm_classes = 3;
  return s;
}

std::string Write(const std::string& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  WriteFile(path, text);
  return path;
}

std::string WriteGzip(const std::string& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  return path;
}

std::string ParseError(const TabularSpec& spec, const std::string& line) {
  Record r;
  auto got = ParseLibsvmLine(spec, line, &r);
  EXPECT_FALSE(got.ok()) << line;
  return got.ok() ? "" : std::string(got.status().message());
}

TEST(LibsvmTest, ParsesLabelsIdsAndValues) {
  Record r;
  auto got = ParseLibsvmLine(Spec(5), "+1 3:0.5\t1:2  5:-1e-3 # a comment 9:9", &r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got);
  EXPECT_EQ(r.label, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0, 4}));  // 0-based, file order
  EXPECT_EQ(r.values, (std::vector<float>{0.5f, 2.0f, -1e-3f}));
  for (const char* neg : {"-1 1:1", "0 1:1", "0.0", "-1.0 2:3"}) {
    ASSERT_TRUE(ParseLibsvmLine(Spec(5), neg, &r).ok()) << neg;
    EXPECT_EQ(r.label, 0) << neg;
  }
  ASSERT_TRUE(ParseLibsvmLine(Spec(5), "1", &r).ok());  // no features: all zero
  EXPECT_EQ(r.label, 1);
  EXPECT_TRUE(r.ids.empty());
}

TEST(LibsvmTest, IndexBaseClassesRegressionAndQid) {
  Record r;
  ASSERT_TRUE(ParseLibsvmLine(Spec(3, LibsvmLabels::kBinary, 0), "1 0:1 2:3", &r).ok());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  ASSERT_TRUE(ParseLibsvmLine(Spec(3, LibsvmLabels::kClasses), "2 qid:7 1:1", &r).ok());
  EXPECT_EQ(r.label, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0}));
  ASSERT_TRUE(ParseLibsvmLine(Spec(3, LibsvmLabels::kRegression), "-3.25 2:1", &r).ok());
  EXPECT_FLOAT_EQ(r.target, -3.25f);
}

TEST(LibsvmTest, BlankAndCommentLinesAreNotRecords) {
  Record r;
  for (const char* line : {"", "   ", "\t", "# only a comment", "  # indented 1:2"}) {
    auto got = ParseLibsvmLine(Spec(3), line, &r);
    ASSERT_TRUE(got.ok()) << line;
    EXPECT_FALSE(*got) << line;
  }
}

TEST(LibsvmTest, BadRecordsNameTheToken) {
  EXPECT_EQ(ParseError(Spec(5), "2 1:1"), "label \"2\": expected 0/1 or -1/+1 (labels: binary)");
  EXPECT_EQ(ParseError(Spec(5), "yes 1:1"),
            "label \"yes\": expected 0/1 or -1/+1 (labels: binary)");
  EXPECT_EQ(ParseError(Spec(5, LibsvmLabels::kClasses), "3 1:1"),
            "label \"3\": expected a class id in [0, 3) (labels: classes)");
  EXPECT_EQ(ParseError(Spec(5, LibsvmLabels::kClasses), "1.5 1:1"),
            "label \"1.5\": expected a class id in [0, 3) (labels: classes)");
  EXPECT_EQ(ParseError(Spec(5, LibsvmLabels::kRegression), "nan 1:1"),
            "label \"nan\": expected a number (labels: regression)");
  EXPECT_EQ(ParseError(Spec(5), "1 3"), "token \"3\": expected index:value");
  EXPECT_EQ(ParseError(Spec(5), "1 x:1"), "token \"x:1\": expected an integer index before ':'");
  EXPECT_EQ(ParseError(Spec(5), "1 6:1"),
            "token \"6:1\": index 6 outside [1, 5] (indexBase 1, numFeatures 5)");
  EXPECT_EQ(ParseError(Spec(5), "1 0:1"),
            "token \"0:1\": index 0 outside [1, 5] (indexBase 1, numFeatures 5)");
  EXPECT_EQ(ParseError(Spec(5, LibsvmLabels::kBinary, 0), "1 5:1"),
            "token \"5:1\": index 5 outside [0, 4] (indexBase 0, numFeatures 5)");
  // Missing values: an index without a number is bad, not zero.
  EXPECT_EQ(ParseError(Spec(5), "1 2:"), "token \"2:\": expected a number after ':'");
  EXPECT_EQ(ParseError(Spec(5), "1 2:?"), "token \"2:?\": expected a number after ':'");
  EXPECT_EQ(ParseError(Spec(5), "1 2:inf"), "token \"2:inf\": expected a number after ':'");
  EXPECT_EQ(ParseError(Spec(5), "1 2:1 4:1 2:3"), "index 2 appears more than once");
}

TEST(LibsvmTest, LoadsFilesGlobsGzipAndCrlfIntoDenseRows) {
  const std::string dir = NewTestDir("libsvm");
  const std::string text =
      "# header comment\r\n1 1:0.5 3:2\r\n\r\n-1 2:1\r\n0 3:4";  // no final newline
  Write(dir, "a.svm", text);
  WriteGzip(dir, "b.svm.gz", text);
  for (const std::string& pattern : {dir + "/a.svm", dir + "/b.svm.gz"}) {
    auto d = LoadTabular(Spec(3), {pattern}, nullptr);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->size, 3);
    EXPECT_EQ(d->feature_dim(), 3);
    EXPECT_EQ(d->images, (std::vector<float>{0.5f, 0, 2, 0, 1, 0, 0, 0, 4}));
    EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 0}));
    EXPECT_TRUE(d->targets.empty());
  }
  auto both = LoadTabular(Spec(3), {dir + "/*.svm*"}, nullptr);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->size, 6);
  auto reg = LoadTabular(Spec(3, LibsvmLabels::kRegression),
                         {Write(dir, "r.svm", "2.5 1:1\n-1 2:1\n")}, nullptr);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->targets, (std::vector<float>{2.5f, -1.0f}));
}

TEST(LibsvmTest, BadRecordFailsWithFileLineOrIsSkippedAndCounted) {
  const std::string dir = NewTestDir("libsvm");
  const std::string path = Write(dir, "bad.svm", "1 1:1\r\n# c\n1 2:x\n0 3:1\n5 1:1\n");
  auto failed = LoadTabular(Spec(3), {path}, nullptr);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), path + ":3: token \"2:x\": expected a number after ':'");
  TabularSpec skip = Spec(3);
  skip.skip_bad_records = true;
  auto d = LoadTabular(skip, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 2);
  EXPECT_EQ(d->skipped_records, 2);
  auto none = LoadTabular(skip, {Write(dir, "none.svm", "x\n")}, nullptr);
  ASSERT_FALSE(none.ok());
  EXPECT_CONTAINS(std::string(none.status().message()), "no records (1 bad ones skipped)");
}

TEST(LibsvmTest, MissingAndCorruptFilesAreNamed) {
  const std::string dir = NewTestDir("libsvm");
  auto missing = LoadTabular(Spec(3), {dir + "/nope.svm"}, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_CONTAINS(std::string(missing.status().message()), dir + "/nope.svm");
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "1 1:0.25 2:0.5 3:0.75\n";
  const std::string gz = WriteGzip(dir, "cut.svm.gz", text);
  TruncateFile(gz, std::filesystem::file_size(gz) / 2);
  auto cut = LoadTabular(Spec(3), {gz}, nullptr);
  ASSERT_FALSE(cut.ok());
  EXPECT_CONTAINS(std::string(cut.status().message()), gz + ": corrupt gzip data");
}

TEST(LibsvmTest, AWeightedColumnMakesTheFeaturesLookupIdsWithTheirValuesAsWeights) {
  const std::string dir = NewTestDir("libsvm");
  const std::string path = Write(dir, "w.svm", "1 3:0.5 1:2\n-1\n0 2:1 3:4 1:-1\n");
  TabularSpec spec = Spec(3);
  spec.weighted_column = "features";
  spec.weighted_max_values = 3;
  EXPECT_EQ(FeatureDim(spec), 0);
  EXPECT_EQ(IdSlots(spec), 3);
  auto d = LoadTabular(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->feature_dim(), 0);
  EXPECT_TRUE(d->images.empty());
  // 0-based indices in file order, -1 (weight 0) past a record's features.
  EXPECT_EQ(d->lookup_ids, (std::vector<int64_t>{2, 0, -1, -1, -1, -1, 1, 2, 0}));
  EXPECT_EQ(d->lookup_weights, (std::vector<float>{0.5f, 2, 0, 0, 0, 0, 1, 4, -1}));
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 0}));
  // The batcher hands the weights out beside the ids.
  ShardedBatcher batcher(*d, 0, 1, 1);
  std::vector<float> x, w;
  std::vector<int32_t> y;
  std::vector<int64_t> ids;
  ASSERT_TRUE(batcher.Next(3, &x, &y, nullptr, &ids, &w).ok());
  ASSERT_EQ(ids.size(), 9u);
  ASSERT_EQ(w.size(), 9u);
  // Shuffled, but each record's ids keep their weights.
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == 2) {
      EXPECT_TRUE(w[i] == 0.5f || w[i] == 4.0f) << i;
    } else if (ids[i] < 0) {
      EXPECT_EQ(w[i], 0.0f) << i;
    }
  }
  float total = 0;
  for (float v : w) total += v;
  EXPECT_FLOAT_EQ(total, 0.5f + 2 + 1 + 4 - 1);
  // More features than maxValues: a bad record naming the count.
  spec.weighted_max_values = 2;
  auto failed = LoadTabular(spec, {path}, nullptr);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(),
            path + ":3: 3 features, more than weightedColumn.maxValues (2)");
}

}  // namespace
}  // namespace kubetrain
