// Fashion-MNIST (or MNIST) in IDX format, gzip-compressed or raw, and the
// per-worker sharded batch stream.
#ifndef KUBETRAIN_CORE_DATASET_H_
#define KUBETRAIN_CORE_DATASET_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kubetrain {

// IDX images, or tabular records (core/tabular.h: rows 1, cols features).
struct Dataset {
  int64_t size = 0;
  int rows = 28;
  int cols = 28;
  std::vector<float> images;    // size x (rows*cols): pixel/255 in [0, 1], or features
  std::vector<int32_t> labels;  // size, class indices (classification)
  std::vector<float> targets;   // size, regression targets (else empty)
  int64_t skipped_records = 0;  // bad records dropped (onBadRecord: skip)
  // Tabular: per column the training mean and stddev (core/tabular.h).
  std::vector<float> norm_mean, norm_std;
  int feature_dim() const { return rows * cols; }
};

// The whole file; ".gz" is decompressed with zlib. Errors name the file
// (missing, unreadable, corrupt gzip).
absl::StatusOr<std::string> ReadDataFile(const std::string& path);

// Reads a text file (".gz" decompressed with zlib) line by line through a
// fixed buffer, so memory does not grow with the file: kChunk bytes plus the
// longest line (a line over kMaxLine bytes is an error naming file:line).
// Lines end at '\n'; a trailing '\r' is removed (CRLF files). Errors name the
// file (missing, unreadable, corrupt gzip). Not thread-safe.
class LineReader {
 public:
  static constexpr size_t kChunk = 1 << 20;
  static constexpr size_t kMaxLine = 64 << 20;

  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);
  ~LineReader();

  // The next line in *line (valid until the next call); false at the end.
  absl::StatusOr<bool> Next(absl::string_view* line);
  // 1-based number of the line Next returned last.
  int64_t line_number() const { return line_number_; }
  const std::string& path() const { return path_; }

 private:
  explicit LineReader(std::string path) : path_(std::move(path)) {}
  // Appends up to kChunk bytes to buf_; 0 at the end of the file.
  absl::StatusOr<size_t> Fill();

  const std::string path_;
  void* gz_ = nullptr;        // gzFile, for ".gz"
  std::FILE* raw_ = nullptr;  // otherwise
  std::string buf_;
  size_t start_ = 0;  // first unread byte of buf_
  bool eof_ = false;
  int64_t line_number_ = 0;
};

// Reads an IDX3 image file and an IDX1 label file (".gz" is decompressed with
// zlib; anything else is read raw). Errors name the file and what is wrong:
// missing/unreadable, bad magic, truncated (fewer bytes than the header
// promises), corrupt gzip, image/label count mismatch, label out of range.
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path);

// `dir`/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz, as installed by
// Debian's dataset-fashion-mnist in /usr/share/datasets/fashion-mnist.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train);

// How many examples the dataset in `dir` holds (training or test set), read
// from the label file's IDX header alone (8 bytes, not the whole file), so
// `kubetrain validate`, the launcher and every task agree with the data the
// workers will load. Errors name the file, as LoadIdx's do.
absl::StatusOr<int64_t> CountExamples(const std::string& dir, bool train);

// Worker `shard` of `num_shards` sees a disjoint ~1/num_shards of the examples
// (a fixed seed-determined permutation of all examples, strided by shard) and
// reshuffles its shard at the start of every epoch (seed, epoch, shard).
// Not thread-safe; one per training loop. `data` must outlive the batcher.
class ShardedBatcher {
 public:
  ShardedBatcher(const Dataset& data, int shard, int num_shards, uint64_t seed);

  // Copies the next `batch` examples into x (batch x feature_dim) and y,
  // wrapping into a new epoch (reshuffled) when the shard is exhausted.
  void Next(int batch, std::vector<float>* x, std::vector<int32_t>* y);
  // The same, also copying the regression targets (if the data has them).
  void Next(int batch, std::vector<float>* x, std::vector<int32_t>* y, std::vector<float>* t);

  int64_t epoch() const { return epoch_; }
  int64_t shard_size() const { return static_cast<int64_t>(indices_.size()); }

 private:
  void Reshuffle();
  const Dataset& data_;
  uint64_t seed_;
  int shard_;
  std::vector<int64_t> indices_;
  size_t cursor_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_DATASET_H_
