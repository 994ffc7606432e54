#include "core/tabular.h"

#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

ColumnSpec Numeric(const std::string& name, bool normalize = false, std::string missing = "") {
  ColumnSpec c;
  c.name = name;
  c.type = ColumnType::kNumeric;
  c.normalize = normalize;
  c.missing = std::move(missing);
  return c;
}

ColumnSpec Categorical(const std::string& name, std::vector<std::string> vocab, int buckets = 0) {
  ColumnSpec c;
  c.name = name;
  c.type = ColumnType::kCategorical;
  c.vocabulary = std::move(vocab);
  c.hash_buckets = buckets;
  return c;
}

ColumnSpec Label(std::vector<std::pair<std::string, int>> classes, int num_classes = 0) {
  ColumnSpec c;
  c.name = "income";
  c.type = ColumnType::kLabel;
  c.classes = std::move(classes);
  c.num_classes = num_classes;
  return c;
}

// age, workclass (vocabulary), fnlwgt (ignored), income ("<=50K"/">50K" with
// the test file's trailing '.').
TabularSpec Adult() {
  TabularSpec s;
  s.columns = {Numeric("age", true), Categorical("workclass", {"Private", "State-gov"}),
               ColumnSpec{"fnlwgt", ColumnType::kIgnore},
               Label({{"<=50K", 0}, {">50K", 1}, {"<=50K.", 0}, {">50K.", 1}})};
  s.comment_prefix = "|";
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

TEST(TabularTest, EncodesNormalisesAndMapsLabels) {
  const std::string dir = NewTestDir("tabular");
  const std::string path = Write(dir, "adult.data",
                                 "|1x3 Cross validator\n"
                                 "20, Private, 77516, <=50K\n"
                                 "\n"
                                 "40, State-gov, 83311, >50K\r\n"
                                 "60, Never-worked, 1, >50K.\n");
  TabularSpec spec = Adult();
  EXPECT_EQ(FeatureDim(spec), 3);
  EXPECT_EQ(LabelClasses(spec), 2);
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size, 3);
  EXPECT_EQ(d->feature_dim(), 3);
  // age: mean 40, population stddev sqrt(800/3).
  const float sd = static_cast<float>(std::sqrt(800.0 / 3));
  EXPECT_FLOAT_EQ(d->norm_mean[0], 40.0f);
  EXPECT_FLOAT_EQ(d->norm_std[0], sd);
  const std::vector<float> want = {(20 - 40) / sd,
                                   1,
                                   0,  //
                                   0,
                                   0,
                                   1,  //
                                   (60 - 40) / sd,
                                   0,
                                   0};  // out of vocabulary: all zero
  ASSERT_EQ(d->images.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(d->images[i], want[i]) << i;
  EXPECT_EQ(d->labels, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_TRUE(d->targets.empty());

  // The test set uses the training figures.
  const std::string test = Write(dir, "adult.test", "50, Private, 1, <=50K.\n");
  auto t = LoadCsv(spec, {test}, &*d);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FLOAT_EQ(t->images[0], (50 - 40) / sd);
}

TEST(TabularTest, MissingValuesPerColumn) {
  const std::string dir = NewTestDir("tabular");
  const std::string path = Write(dir, "m.csv", "1,?,a,0\n3,5,?,1\n,7,b,1\n");
  TabularSpec spec;
  spec.columns = {Numeric("x"), Numeric("y", false, "zero"), Categorical("c", {"a", "b"}),
                  Label({}, 2)};
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  // x missing (empty) -> training mean of {1, 3} = 2; y missing -> 0;
  // c missing -> all zeros.
  EXPECT_EQ(d->images, (std::vector<float>{1, 0, 1, 0,  //
                                           3, 5, 0, 0,  //
                                           2, 7, 0, 1}));
  spec.columns[0].missing = "error";
  EXPECT_EQ(LoadCsv(spec, {path}, nullptr).status().message(),
            path + ":3: column 'x': missing value");
}

TEST(TabularTest, QuotesDelimitersAndGzip) {
  const std::string dir = NewTestDir("tabular");
  const std::string text =
      "name,score,label\n"
      "\"Smith, J\",1.5,2\r\n"
      "\"say \"\"hi\"\"\", 2 ,0\r\n";
  TabularSpec spec;
  spec.header = true;
  spec.columns = {Categorical("name", {"Smith, J", "say \"hi\""}), Numeric("score"), Label({}, 3)};
  for (const std::string& path : {Write(dir, "q.csv", text), WriteGzip(dir, "q.csv.gz", text)}) {
    auto d = LoadCsv(spec, {path}, nullptr);
    ASSERT_TRUE(d.ok()) << path << ": " << d.status();
    EXPECT_EQ(d->images, (std::vector<float>{1, 0, 1.5, 0, 1, 2})) << path;
    EXPECT_EQ(d->labels, (std::vector<int32_t>{2, 0})) << path;
  }
  // Both files through a glob: 4 records.
  auto both = LoadCsv(spec, {dir + "/q.csv*"}, nullptr);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->size, 4);
  EXPECT_EQ(LoadCsv(spec, {dir + "/nothing*.csv"}, nullptr).status().message(),
            dir + "/nothing*.csv: no such file");
}

TEST(TabularTest, BadRecordsNameFileLineAndColumn) {
  const std::string dir = NewTestDir("tabular");
  TabularSpec spec = Adult();
  auto error = [&](const std::string& body) {
    const std::string path = Write(dir, "adult.test", body);
    return std::string(LoadCsv(spec, {path}, nullptr).status().message());
  };
  const std::string p = dir + "/adult.test";
  EXPECT_EQ(error("20, Private, 1, <=50K\nx, Private, 1, <=50K\n"),
            p + ":2: column 'age': expected a number, got \"x\"");
  EXPECT_EQ(error("20, Private, 1\n"), p + ":1: expected 4 fields (one per column), got 3");
  EXPECT_EQ(error("20, Private, 1, maybe\n"),
            p + ":1: column 'income': label \"maybe\" is not one of the classes");
  EXPECT_EQ(error("20, Private, 1, ?\n"), p + ":1: column 'income': missing label");
  EXPECT_EQ(error("20, \"Private, 1, <=50K\n"), p + ":1: field 2: unterminated quote");
  EXPECT_EQ(error("inf, Private, 1, <=50K\n"),
            p + ":1: column 'age': expected a number, got \"inf\"");
  EXPECT_EQ(error("|only a comment\n"), p + ": no records");
  // Skipping: bad records are dropped and counted.
  spec.skip_bad_records = true;
  const std::string path =
      Write(dir, "adult.test", "x, Private, 1, <=50K\n30, Private, 1, >50K\n20, Private\n");
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 1);
  EXPECT_EQ(d->skipped_records, 2);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1}));
}

TEST(TabularTest, HashBucketsAndRegressionTargets) {
  const std::string dir = NewTestDir("tabular");
  const std::string path = Write(dir, "r.csv", "red,1.25\nblue,-2\nred,0.5\n");
  TabularSpec spec;
  spec.columns = {Categorical("color", {}, 8), Label({})};
  EXPECT_EQ(LabelClasses(spec), 0);
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->feature_dim(), 8);
  EXPECT_EQ(d->targets, (std::vector<float>{1.25f, -2.0f, 0.5f}));
  // The same value lands in the same bucket; one bucket per row.
  for (int r = 0; r < 3; ++r) {
    float sum = 0;
    for (int k = 0; k < 8; ++k) sum += d->images[r * 8 + k];
    EXPECT_EQ(sum, 1.0f);
  }
  for (int k = 0; k < 8; ++k) EXPECT_EQ(d->images[k], d->images[16 + k]);
}

TEST(TabularTest, CheckTabularFileReadsOnlyTheFirstRecords) {
  const std::string dir = NewTestDir("tabular-check");
  TabularSpec spec = Adult();
  const std::string path = Write(dir, "a.csv",
                                 "| a comment\n"
                                 "39, State-gov, 77516, <=50K\n"
                                 "50, Private, 83311, >50K\n"
                                 "x, Private, 1, >50K\n");
  // Two records load before the bad one on line 4.
  EXPECT_EQ(*CheckTabularFile(spec, path, 2), 2);
  EXPECT_EQ(CheckTabularFile(spec, path, 3).status().message(),
            path + ":4: column 'age': expected a number, got \"x\"");
  spec.skip_bad_records = true;
  EXPECT_EQ(*CheckTabularFile(spec, path, 100), 2);  // passed over; the file ends
  EXPECT_EQ(CheckTabularFile(spec, dir + "/none.csv", 100).status().code(),
            absl::StatusCode::kNotFound);
  // libsvm: an index beyond numFeatures, with gzip.
  TabularSpec svm;
  svm.libsvm = true;
  svm.num_features = 3;
  const std::string gz = WriteGzip(dir, "s.svm.gz", "+1 1:0.5 3:1\n-1 4:1\n");
  EXPECT_EQ(*CheckTabularFile(svm, gz, 1), 1);
  auto bad = CheckTabularFile(svm, gz, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), gz + ":2: ")) << bad.status();
}

// Looked-up columns are 64-bit lookup ids beside the dense features: a
// vocabulary index, a hash bucket, or a dynamic column's DynamicColumnId,
// which no float could carry; -1 for a missing value. They also stream
// through a ShardedBatcher as they are.
TEST(TabularTest, LookedUpColumnsAre64BitLookupIds) {
  const std::string dir = NewTestDir("tabular");
  const std::string path = Write(dir, "ads.csv",
                                 "1.5, Private, ad-7f3a, 0\n"
                                 "2.5, State-gov, ?, 1\n"
                                 "3.5, Never-worked, ad-0001, 1\n");
  TabularSpec spec;
  ColumnSpec work = Categorical("workclass", {"Private", "State-gov"});
  work.as_ids = true;
  ColumnSpec ad;
  ad.name = "ad";
  ad.type = ColumnType::kCategorical;
  ad.dynamic = ad.as_ids = true;
  spec.columns = {Numeric("x"), work, ad, Label({}, 2)};
  EXPECT_EQ(FeatureDim(spec), 1);
  EXPECT_EQ(IdSlots(spec), 2);
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->images, (std::vector<float>{1.5f, 2.5f, 3.5f}));
  ASSERT_EQ(d->id_slots, 2);
  const int64_t a = DynamicColumnId("ad-7f3a"), b = DynamicColumnId("ad-0001");
  EXPECT_EQ(d->lookup_ids, (std::vector<int64_t>{0, a, 1, -1, -1, b}));
  EXPECT_GT(a, int64_t{1} << 24);  // beyond what a float holds exactly
  EXPECT_NE(a, b);
  // The id is SplitMix64(FNV-1a 64(value)) >> 1.
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : std::string("ad-7f3a")) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  h += 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  h ^= h >> 31;
  EXPECT_EQ(a, static_cast<int64_t>(h >> 1));

  auto set = OpenTabularTrainingSet([&] {
    TabularSpec t = spec;
    t.train_files = {path};
    return t;
  }());
  ASSERT_TRUE(set.ok()) << set.status();
  ShardedBatcher batcher(*set->source, 0, 1, 1, 1);  // a buffer of 1: file order
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<int64_t> ids;
  ASSERT_TRUE(batcher.Next(3, &x, &y, nullptr, &ids).ok());
  EXPECT_EQ(ids, d->lookup_ids);
  EXPECT_EQ(x, d->images);
}

TEST(TabularTest, MultiValuedColumnsGiveUpToMaxValuesIdsOrAMultiHotBlock) {
  const std::string dir = NewTestDir("tabular");
  // genres as ids (an embedding's), tags one-hot (multi-hot); "?" and empty
  // parts are no value, an unknown value is no id, a missing field none.
  const std::string path = Write(dir, "movies.csv",
                                 "drama|comedy, a|c, 1\n"
                                 "comedy, ?, 0\n"
                                 "?, b|x|a, 1\n"
                                 "horror||drama, , 0\n");
  TabularSpec spec;
  ColumnSpec genres = Categorical("genres", {"drama", "comedy", "horror"});
  genres.separator = '|';
  genres.max_values = 3;
  genres.as_ids = true;
  ColumnSpec tags = Categorical("tags", {"a", "b", "c"});
  tags.separator = '|';
  tags.max_values = 3;
  spec.columns = {genres, tags, Label({}, 2)};
  EXPECT_EQ(FeatureDim(spec), 3);
  EXPECT_EQ(IdSlots(spec), 3);
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->lookup_ids, (std::vector<int64_t>{0, 1, -1, 1, -1, -1, -1, -1, -1, 2, 0, -1}));
  EXPECT_EQ(d->images, (std::vector<float>{1, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 1, 0}));
}

TEST(TabularTest, AFieldWithMoreThanMaxValuesIsABadRecordNamingTheColumn) {
  const std::string dir = NewTestDir("tabular");
  const std::string path = Write(dir, "movies.csv", "drama|comedy, 1\ndrama|comedy|horror, 0\n");
  TabularSpec spec;
  ColumnSpec genres;
  genres.name = "genres";
  genres.type = ColumnType::kCategorical;
  genres.hash_buckets = 100;
  genres.separator = '|';
  genres.max_values = 2;
  genres.as_ids = true;
  spec.columns = {genres, Label({}, 2)};
  auto d = LoadCsv(spec, {path}, nullptr);
  ASSERT_FALSE(d.ok());
  EXPECT_CONTAINS(std::string(d.status().message()),
                  "movies.csv:2: column 'genres': more than maxValues (2) values in "
                  "\"drama|comedy|horror\"");
  spec.skip_bad_records = true;
  d = LoadCsv(spec, {path}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->skipped_records, 1);
  EXPECT_EQ(d->lookup_ids.size(), 2u);
}

}  // namespace
}  // namespace kubetrain
