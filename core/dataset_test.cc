#include "core/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

::testing::AssertionResult Contains(const std::string& text, const std::string& phrase) {
  if (text.find(phrase) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not contain \"" << phrase << "\"";
}

void AppendBigEndian32(uint32_t v, std::string* out) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

std::string ImagesIdx(uint32_t count, uint32_t rows, uint32_t cols,
                      const std::vector<uint8_t>& pixels, uint32_t magic = 0x00000803) {
  std::string out;
  AppendBigEndian32(magic, &out);
  AppendBigEndian32(count, &out);
  AppendBigEndian32(rows, &out);
  AppendBigEndian32(cols, &out);
  out.append(pixels.begin(), pixels.end());
  return out;
}

std::string LabelsIdx(uint32_t count, const std::vector<uint8_t>& labels,
                      uint32_t magic = 0x00000801) {
  std::string out;
  AppendBigEndian32(magic, &out);
  AppendBigEndian32(count, &out);
  out.append(labels.begin(), labels.end());
  return out;
}

// A fresh directory per test, under bazel's TEST_TMPDIR.
std::string TestDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = ::testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir += '/';
  dir += std::string(info->test_suite_name()) + "." + info->name();
  EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
  ASSERT_TRUE(out.good()) << path;
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// 3 images of 2x3 and their labels.
const std::vector<uint8_t> kPixels = {0,  255, 51, 102, 153, 204,  //
                                      1,  2,   3,  4,   5,   6,    //
                                      10, 20,  30, 40,  50,  60};
const std::vector<uint8_t> kLabels = {7, 0, 9};

void ExpectSmallDataset(const Dataset& data) {
  EXPECT_EQ(data.size, 3);
  EXPECT_EQ(data.rows, 2);
  EXPECT_EQ(data.cols, 3);
  EXPECT_EQ(data.feature_dim(), 6);
  ASSERT_EQ(data.images.size(), kPixels.size());
  for (size_t i = 0; i < kPixels.size(); ++i) {
    EXPECT_FLOAT_EQ(data.images[i], kPixels[i] / 255.0f) << i;
  }
  EXPECT_EQ(data.labels, std::vector<int32_t>({7, 0, 9}));
}

void ExpectError(const absl::StatusOr<Dataset>& result, const std::vector<std::string>& phrases) {
  ASSERT_FALSE(result.ok());
  const std::string message(result.status().message());
  for (const std::string& phrase : phrases) {
    EXPECT_TRUE(Contains(message, phrase));
  }
}

TEST(LoadIdxTest, ParsesRawFiles) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  WriteRaw(dir + "/labels", LabelsIdx(3, kLabels));
  absl::StatusOr<Dataset> data = LoadIdx(dir + "/images", dir + "/labels");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(LoadIdxTest, ParsesGzipFiles) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/images.gz", ImagesIdx(3, 2, 3, kPixels));
  WriteGzip(dir + "/labels.gz", LabelsIdx(3, kLabels));
  absl::StatusOr<Dataset> data = LoadIdx(dir + "/images.gz", dir + "/labels.gz");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(LoadIdxTest, MixedRawAndGzip) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  WriteGzip(dir + "/labels.gz", LabelsIdx(3, kLabels));
  absl::StatusOr<Dataset> data = LoadIdx(dir + "/images", dir + "/labels.gz");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(LoadIdxTest, MissingFile) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/labels", LabelsIdx(3, kLabels));
  absl::StatusOr<Dataset> data = LoadIdx(dir + "/nope", dir + "/labels");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  ExpectError(data, {dir + "/nope", "cannot open"});

  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  data = LoadIdx(dir + "/images", dir + "/nope.gz");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  ExpectError(data, {dir + "/nope.gz", "cannot open"});
}

TEST(LoadIdxTest, BadMagic) {
  const std::string dir = TestDir();
  // Images and labels swapped: the classic mistake.
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  WriteRaw(dir + "/labels", LabelsIdx(3, kLabels));
  ExpectError(LoadIdx(dir + "/labels", dir + "/images"),
              {dir + "/labels", "bad magic 0x00000801 (expected 0x00000803 for IDX3 images)"});
  ExpectError(LoadIdx(dir + "/images", dir + "/images"),
              {dir + "/images", "bad magic 0x00000803 (expected 0x00000801 for IDX1 labels)"});
  // A text file behind a .gz name is read transparently, then fails the
  // magic check.
  WriteRaw(dir + "/text.gz", "hello, world\n");
  ExpectError(LoadIdx(dir + "/text.gz", dir + "/labels"),
              {dir + "/text.gz", "bad magic 0x68656c6c"});
}

TEST(LoadIdxTest, TruncatedRawFile) {
  const std::string dir = TestDir();
  std::vector<uint8_t> short_pixels(kPixels.begin(), kPixels.begin() + 10);
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, short_pixels));
  WriteRaw(dir + "/labels", LabelsIdx(3, kLabels));
  ExpectError(LoadIdx(dir + "/images", dir + "/labels"),
              {dir + "/images", "truncated: header promises 18 bytes of pixels, file has 10"});

  WriteRaw(dir + "/short_header", ImagesIdx(3, 2, 3, {}).substr(0, 9));
  ExpectError(LoadIdx(dir + "/short_header", dir + "/labels"),
              {dir + "/short_header", "truncated"});

  WriteRaw(dir + "/good_images", ImagesIdx(3, 2, 3, kPixels));
  WriteRaw(dir + "/short_labels", LabelsIdx(3, {1, 2}));
  ExpectError(LoadIdx(dir + "/good_images", dir + "/short_labels"),
              {dir + "/short_labels", "truncated"});
}

// Incompressible payload, so the compressed stream is long enough to damage.
std::string RandomImagesIdx(uint32_t count) {
  std::vector<uint8_t> pixels(count * 28 * 28);
  uint32_t state = 12345;
  for (uint8_t& p : pixels) {
    state = state * 1664525u + 1013904223u;
    p = static_cast<uint8_t>(state >> 24);
  }
  return ImagesIdx(count, 28, 28, pixels);
}

TEST(LoadIdxTest, TruncatedGzip) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/full.gz", RandomImagesIdx(20));
  WriteRaw(dir + "/labels", LabelsIdx(20, std::vector<uint8_t>(20, 1)));
  ASSERT_TRUE(LoadIdx(dir + "/full.gz", dir + "/labels").ok());

  const std::string gz = ReadAll(dir + "/full.gz");
  WriteRaw(dir + "/half.gz", gz.substr(0, gz.size() / 2));
  ExpectError(LoadIdx(dir + "/half.gz", dir + "/labels"),
              {dir + "/half.gz", "corrupt gzip data: "});
  // Only the 8-byte trailer (CRC, length) missing.
  WriteRaw(dir + "/no_trailer.gz", gz.substr(0, gz.size() - 8));
  ExpectError(LoadIdx(dir + "/no_trailer.gz", dir + "/labels"),
              {dir + "/no_trailer.gz", "corrupt gzip data: "});
}

TEST(LoadIdxTest, CorruptGzip) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/full.gz", RandomImagesIdx(20));
  WriteRaw(dir + "/labels", LabelsIdx(20, std::vector<uint8_t>(20, 1)));
  std::string gz = ReadAll(dir + "/full.gz");
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i) gz[i] ^= 0x5a;
  WriteRaw(dir + "/flipped.gz", gz);
  ExpectError(LoadIdx(dir + "/flipped.gz", dir + "/labels"),
              {dir + "/flipped.gz", "corrupt gzip data: "});
}

TEST(LoadIdxTest, CountMismatch) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  WriteRaw(dir + "/labels", LabelsIdx(2, {1, 2}));
  ExpectError(LoadIdx(dir + "/images", dir + "/labels"),
              {"image count 3", "!= label count 2", dir + "/images", dir + "/labels"});
}

TEST(LoadIdxTest, LabelOutOfRange) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  WriteGzip(dir + "/labels.gz", LabelsIdx(3, {1, 12, 3}));
  ExpectError(LoadIdx(dir + "/images", dir + "/labels.gz"),
              {dir + "/labels.gz", "label 12 out of range [0,10) at index 1"});
}

// Example i has the single feature value i, so batches reveal indices.
Dataset Synthetic(int64_t n) {
  Dataset data;
  data.size = n;
  data.rows = 1;
  data.cols = 1;
  for (int64_t i = 0; i < n; ++i) {
    data.images.push_back(static_cast<float>(i));
    data.labels.push_back(static_cast<int32_t>(i % 10));
  }
  return data;
}

// The next `n` example indices from the batcher, fetched in batches of
// `batch` (n must be a multiple).
std::vector<int64_t> Take(ShardedBatcher* batcher, const Dataset& data, int64_t n, int batch = 1) {
  std::vector<int64_t> out;
  std::vector<float> x;
  std::vector<int32_t> y;
  while (static_cast<int64_t>(out.size()) < n) {
    absl::Status s = batcher->Next(batch, &x, &y);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    EXPECT_EQ(x.size(), static_cast<size_t>(batch));
    EXPECT_EQ(y.size(), static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) {
      const int64_t index = static_cast<int64_t>(x[i]);
      EXPECT_EQ(y[i], data.labels[index]);
      out.push_back(index);
    }
  }
  return out;
}

TEST(ShardedBatcherTest, ShardsAreDisjointAndCoverAll) {
  const Dataset data = Synthetic(103);
  const DatasetSource source(data);
  for (int64_t buffer : {1, 4, 1000}) {
    for (int num_shards : {1, 2, 3}) {
      std::set<int64_t> seen;
      int64_t total = 0;
      for (int shard = 0; shard < num_shards; ++shard) {
        ShardedBatcher batcher(source, shard, num_shards, /*seed=*/9, buffer);
        const int64_t size = ShardedBatcher::ShardSize(103, shard, num_shards, 9);
        EXPECT_NEAR(size, 103.0 / num_shards, 1.0);
        const std::vector<int64_t> epoch = Take(&batcher, data, size);
        EXPECT_EQ(batcher.epoch(), 0);
        for (int64_t i : epoch) {
          EXPECT_EQ(ShardedBatcher::ShardOf(i, num_shards, 9), shard);
          EXPECT_TRUE(seen.insert(i).second)
              << "example " << i << " in two shards (num_shards=" << num_shards << ")";
        }
        total += epoch.size();
      }
      EXPECT_EQ(total, 103) << num_shards;
      EXPECT_EQ(seen.size(), 103u) << num_shards;
    }
  }
}

TEST(ShardedBatcherTest, ShardsAreBalancedPerBlockAndSeeded) {
  // Every block of num_shards consecutive records gives each shard one.
  for (int64_t block = 0; block < 50; ++block) {
    std::set<int> shards;
    for (int k = 0; k < 4; ++k) shards.insert(ShardedBatcher::ShardOf(block * 4 + k, 4, 7));
    EXPECT_EQ(shards.size(), 4u) << block;
  }
  int differ = 0;
  for (int64_t n = 0; n < 64; ++n) {
    differ += ShardedBatcher::ShardOf(n, 4, 7) != ShardedBatcher::ShardOf(n, 4, 8);
  }
  EXPECT_GT(differ, 16);  // the seed changes the assignment
}

TEST(ShardedBatcherTest, EpochReshuffleKeepsTheSet) {
  const Dataset data = Synthetic(100);
  const DatasetSource source(data);
  for (int64_t buffer : {8, 1000}) {
    ShardedBatcher batcher(source, 1, 2, /*seed=*/3, buffer);
    ASSERT_EQ(ShardedBatcher::ShardSize(100, 1, 2, 3), 50);
    std::vector<int64_t> first = Take(&batcher, data, 50, 10);
    EXPECT_EQ(batcher.epoch(), 0);
    std::vector<int64_t> second = Take(&batcher, data, 50, 10);
    EXPECT_EQ(batcher.epoch(), 1);
    EXPECT_NE(first, second);
    std::sort(first.begin(), first.end());
    std::sort(second.begin(), second.end());
    EXPECT_EQ(first, second);
  }
}

TEST(ShardedBatcherTest, TheBufferBoundsHowFarARecordMoves) {
  // With a buffer of k, the p-th record emitted is one of the shard's first
  // p + k (0-based: its position in the shard is < p + k); k = 1 keeps
  // file order.
  const Dataset data = Synthetic(200);
  const DatasetSource source(data);
  for (int64_t k : {1, 5, 20}) {
    ShardedBatcher batcher(source, 0, 1, /*seed=*/4, k);
    const std::vector<int64_t> got = Take(&batcher, data, 200);
    for (size_t p = 0; p < got.size(); ++p) {
      EXPECT_LT(got[p], static_cast<int64_t>(p) + k) << "buffer " << k << ", position " << p;
    }
    if (k == 1) {
      for (size_t p = 0; p < got.size(); ++p) EXPECT_EQ(got[p], static_cast<int64_t>(p));
    } else {
      std::vector<int64_t> sorted = got;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_NE(got, sorted);
      for (size_t p = 0; p < sorted.size(); ++p) EXPECT_EQ(sorted[p], static_cast<int64_t>(p));
    }
  }
}

TEST(ShardedBatcherTest, BatchWrapsIntoNextEpoch) {
  const Dataset data = Synthetic(30);
  ShardedBatcher batcher(data, 0, 3, /*seed=*/1);
  ASSERT_EQ(ShardedBatcher::ShardSize(30, 0, 3, 1), 10);
  // 4 batches of 7 = 28 examples: epochs 0, 1 and part of 2.
  const std::vector<int64_t> got = Take(&batcher, data, 28, 7);
  EXPECT_EQ(batcher.epoch(), 2);
  for (int e = 0; e < 2; ++e) {
    std::set<int64_t> epoch(got.begin() + 10 * e, got.begin() + 10 * (e + 1));
    EXPECT_EQ(epoch.size(), 10u) << "epoch " << e << " repeated an example";
  }
}

TEST(ShardedBatcherTest, DeterministicForSeed) {
  const Dataset data = Synthetic(64);
  const DatasetSource source(data);
  for (int64_t buffer : {6, 64}) {
    ShardedBatcher a(source, 0, 2, 77, buffer), b(source, 0, 2, 77, buffer),
        c(source, 0, 2, 78, buffer);
    const std::vector<int64_t> seq_a = Take(&a, data, 96, 8);
    EXPECT_EQ(seq_a, Take(&b, data, 96, 8));
    EXPECT_NE(seq_a, Take(&c, data, 96, 8));
  }
}

TEST(ShardedBatcherTest, EmptyShardAndBadShardAreErrors) {
  const Dataset data = Synthetic(2);
  std::vector<float> x;
  std::vector<int32_t> y;
  int empty = 0;
  for (int shard = 0; shard < 3; ++shard) {
    ShardedBatcher batcher(data, shard, 3, 1);
    absl::Status s = batcher.Next(1, &x, &y);
    if (!s.ok()) {
      ++empty;
      EXPECT_TRUE(Contains(std::string(s.message()), "has no records (the training set has 2"))
          << s;
    }
  }
  EXPECT_EQ(empty, 1);
  ShardedBatcher bad(data, 3, 3, 1);
  EXPECT_FALSE(bad.Next(1, &x, &y).ok());
}

// A source whose second pass fails after `good` records (a file that went
// bad between passes).
class FailingSource : public RecordSource {
 public:
  explicit FailingSource(const Dataset& data) : data_(data) {}
  int64_t feature_dim() const override { return 1; }
  bool has_targets() const override { return false; }
  absl::StatusOr<std::unique_ptr<RecordReader>> Open() const override {
    class Reader : public RecordReader {
     public:
      Reader(std::unique_ptr<RecordReader> inner, bool fail)
          : inner_(std::move(inner)), fail_(fail) {}
      absl::StatusOr<bool> Next(Record* r) override {
        if (fail_ && ++n_ > 3) return absl::InvalidArgumentError("f.csv:4: column 'a': bad");
        return inner_->Next(r);
      }

     private:
      std::unique_ptr<RecordReader> inner_;
      bool fail_;
      int n_ = 0;
    };
    auto inner = DatasetSource(data_).Open();
    return std::unique_ptr<RecordReader>(new Reader(std::move(*inner), opens_++ > 0));
  }

 private:
  const Dataset& data_;
  mutable int opens_ = 0;
};

TEST(ShardedBatcherTest, ADataErrorDuringAPassIsReturned) {
  const Dataset data = Synthetic(10);
  FailingSource source(data);
  ShardedBatcher batcher(source, 0, 1, 1, 4);
  std::vector<float> x;
  std::vector<int32_t> y;
  ASSERT_TRUE(batcher.Next(10, &x, &y).ok());
  absl::Status s = batcher.Next(10, &x, &y);
  EXPECT_EQ(s.message(), "f.csv:4: column 'a': bad");
}

TEST(ShardedBatcherTest, IdxSourceStreamsWhatLoadIdxLoads) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/train-images-idx3-ubyte.gz", ImagesIdx(3, 2, 3, kPixels));
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz", LabelsIdx(3, kLabels));
  auto source = OpenIdxSource(dir, /*train=*/true);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->feature_dim(), 6);
  auto streamed = ReadRecords(**source);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  auto loaded = LoadFashionMnist(dir, true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(streamed->size, 3);
  EXPECT_EQ(streamed->images, loaded->images);
  EXPECT_EQ(streamed->labels, loaded->labels);
  auto two = ReadRecords(**source, 2);  // a second pass, cut short
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size, 2);

  // Truncated files and bad labels show when a pass reaches them.
  std::vector<uint8_t> short_pixels(kPixels.begin(), kPixels.begin() + 10);
  WriteGzip(dir + "/train-images-idx3-ubyte.gz", ImagesIdx(3, 2, 3, short_pixels));
  auto cut = ReadRecords(**OpenIdxSource(dir, true));
  ASSERT_FALSE(cut.ok());
  EXPECT_TRUE(Contains(std::string(cut.status().message()), "truncated: header promises 3 images"));
  WriteGzip(dir + "/train-images-idx3-ubyte.gz", ImagesIdx(3, 2, 3, kPixels));
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz", LabelsIdx(3, {1, 12, 3}));
  auto label = ReadRecords(**OpenIdxSource(dir, true));
  ASSERT_FALSE(label.ok());
  EXPECT_TRUE(
      Contains(std::string(label.status().message()), "label 12 out of range [0,10) at index 1"));
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz", LabelsIdx(2, {1, 2}));
  auto count = OpenIdxSource(dir, true);
  ASSERT_FALSE(count.ok());
  EXPECT_TRUE(Contains(std::string(count.status().message()), "!= label count 2"));
}

TEST(LineReaderTest, LinesAcrossChunksCrlfAndNoFinalNewline) {
  const std::string dir = TestDir();
  const std::string long_line(LineReader::kChunk + 123, 'x');  // spans two chunks
  const std::string text = "a\r\n\nb,c\n" + long_line + "\r\nlast";
  WriteRaw(dir + "/t.txt", text);
  WriteGzip(dir + "/t.txt.gz", text);
  for (const std::string& path : {dir + "/t.txt", dir + "/t.txt.gz"}) {
    auto r = LineReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<std::string> lines;
    absl::string_view line;
    while (true) {
      auto more = (*r)->Next(&line);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      lines.emplace_back(line);
    }
    EXPECT_EQ(lines, (std::vector<std::string>{"a", "", "b,c", long_line, "last"})) << path;
    EXPECT_EQ((*r)->line_number(), 5);
  }
  auto missing = LineReader::Open(dir + "/nope.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(std::string(missing.status().message()), dir + "/nope.txt: cannot open"));
}

TEST(ShardedBatcherTest, CopiesFeatureRows) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", ImagesIdx(3, 2, 3, kPixels));
  WriteRaw(dir + "/labels", LabelsIdx(3, kLabels));
  absl::StatusOr<Dataset> data = LoadIdx(dir + "/images", dir + "/labels");
  ASSERT_TRUE(data.ok()) << data.status();
  ShardedBatcher batcher(*data, 0, 1, 5);
  std::vector<float> x;
  std::vector<int32_t> y;
  ASSERT_TRUE(batcher.Next(3, &x, &y).ok());
  ASSERT_EQ(x.size(), 18u);
  ASSERT_EQ(y.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    // Find the example by its label (unique here) and compare its row.
    const int64_t example =
        std::find(data->labels.begin(), data->labels.end(), y[i]) - data->labels.begin();
    for (int k = 0; k < 6; ++k) {
      EXPECT_EQ(x[i * 6 + k], data->images[example * 6 + k]);
    }
  }
}

void CheckFashionMnist(bool train, int64_t size) {
  absl::StatusOr<Dataset> data = LoadFashionMnist(kFashionMnistDir, train);
  ASSERT_TRUE(data.ok()) << data.status() << "\nFashion-MNIST is required in " << kFashionMnistDir
                         << ": install the dataset-fashion-mnist package.";
  EXPECT_EQ(data->size, size);
  EXPECT_EQ(data->rows, 28);
  EXPECT_EQ(data->cols, 28);
  ASSERT_EQ(static_cast<int64_t>(data->images.size()), size * 784);
  ASSERT_EQ(static_cast<int64_t>(data->labels.size()), size);
  const auto [lo, hi] = std::minmax_element(data->images.begin(), data->images.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
  std::vector<int64_t> counts(10, 0);
  for (int32_t label : data->labels) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++counts[label];
  }
  EXPECT_EQ(counts, std::vector<int64_t>(10, size / 10));
}

TEST(FashionMnistTest, LoadsTestSet) { CheckFashionMnist(false, 10000); }

TEST(FashionMnistTest, LoadsTrainSet) { CheckFashionMnist(true, 60000); }

TEST(CountExamplesTest, ReadsTheLabelHeaderOfTheRealData) {
  EXPECT_EQ(*CountExamples(kFashionMnistDir, /*train=*/true), 60000);
  EXPECT_EQ(*CountExamples(kFashionMnistDir, /*train=*/false), 10000);
}

TEST(CountExamplesTest, AgreesWithLoadAndNamesTheFileOnError) {
  const std::string dir = TestDir();
  // The count comes from the header, not from the whole file.
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz", LabelsIdx(3, kLabels));
  WriteGzip(dir + "/train-images-idx3-ubyte.gz", ImagesIdx(3, 2, 3, kPixels));
  EXPECT_EQ(*CountExamples(dir, true), 3);
  EXPECT_EQ(LoadFashionMnist(dir, true)->size, 3);

  auto missing = CountExamples(dir, /*train=*/false);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(std::string(missing.status().message()), "t10k-labels-idx1-ubyte.gz"));

  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", ImagesIdx(3, 2, 3, kPixels));  // wrong magic
  auto bad = CountExamples(dir, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "bad magic"));
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", std::string("\0\0\x08\x01\0", 5));  // short
  bad = CountExamples(dir, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "truncated"));
}

}  // namespace
}  // namespace kubetrain
