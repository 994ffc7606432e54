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
  std::vector<float> images;  // size x (rows*cols): pixel/255 in [0, 1], or features
  // Tabular data of a sparse model: size x id_slots ids the model looks up
  // in its tables (Record::lookup_ids), 64-bit integers as they are.
  int id_slots = 0;
  std::vector<int64_t> lookup_ids;
  // Their weights (size x id_slots) when the data has a weighted column (a
  // libsvm dataset's weightedColumn: the features' values); else empty.
  std::vector<float> lookup_weights;
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
class DataStream;  // a file read sequentially, gzip or raw (dataset.cc)

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
  LineReader(std::string path, std::unique_ptr<DataStream> stream);

  const std::string path_;
  std::unique_ptr<DataStream> stream_;
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

// One example as a RecordReader yields it: dense features (IDX, CSV), or
// sparse 0-based feature ids with their values (libsvm), which a dense
// model sees scattered into a feature_dim vector.
struct Record {
  std::vector<float> dense;
  std::vector<int32_t> ids;
  std::vector<float> values;
  // CSV of a sparse model: one id per column the model looks up (ColumnSpec::
  // as_ids, in column order): its vocabulary index, hash bucket or dynamic
  // id; -1 when missing or out of the vocabulary. Never squeezed through a
  // float: dynamic ids use 63 bits.
  std::vector<int64_t> lookup_ids;
  // libsvm with a weightedColumn: the features as lookup ids (0-based
  // indices, -1 past the record's) and these weights (their values, 0 past);
  // ids and values are then empty (no dense features).
  std::vector<float> lookup_weights;
  int32_t label = 0;  // class (classification)
  float target = 0;   // regression target
  // Writes the features to x[0, dim).
  void CopyTo(float* x, int64_t dim) const;
};

// One pass over a training set, in file order. Not thread-safe.
class RecordReader {
 public:
  virtual ~RecordReader() = default;
  // The next record; false at the end of the pass. Under onBadRecord: skip
  // bad records are passed over; otherwise one is an error naming file:line.
  virtual absl::StatusOr<bool> Next(Record* r) = 0;
  // Bad records passed over so far in this pass.
  virtual int64_t skipped() const { return 0; }
};

// A training set that can be read from its start any number of times, each
// pass streaming its files (memory does not grow with their size).
// Thread-compatible: Open() is const and readers are independent.
class RecordSource {
 public:
  virtual ~RecordSource() = default;
  virtual int64_t feature_dim() const = 0;
  // Record::lookup_ids per record.
  virtual int64_t id_slots() const { return 0; }
  virtual bool has_targets() const = 0;
  virtual absl::StatusOr<std::unique_ptr<RecordReader>> Open() const = 0;
};

// The records of an in-memory Dataset (tests, benchmarks). `data` must
// outlive the source.
class DatasetSource : public RecordSource {
 public:
  explicit DatasetSource(const Dataset& data) : data_(data) {}
  int64_t feature_dim() const override { return data_.feature_dim(); }
  int64_t id_slots() const override { return data_.id_slots; }
  bool has_targets() const override { return !data_.targets.empty(); }
  absl::StatusOr<std::unique_ptr<RecordReader>> Open() const override;

 private:
  const Dataset& data_;
};

// The IDX training or test set in `dir` (LoadFashionMnist's files), read
// record by record. The headers are checked here (errors as LoadIdx's);
// truncation and bad labels show when a pass reaches them.
absl::StatusOr<std::unique_ptr<RecordSource>> OpenIdxSource(const std::string& dir, bool train);

// The first `limit` records of one pass (all with limit < 0) as a Dataset
// (skipped_records: those the reader passed over).
absl::StatusOr<Dataset> ReadRecords(const RecordSource& source, int64_t limit = -1);

// A training set as the tasks use it: the source every pass streams from,
// and what a scan of it found (CSV: the normalisation figures).
struct TrainingSet {
  std::shared_ptr<const RecordSource> source;
  int64_t size = 0;             // records that load
  int64_t skipped_records = 0;  // bad ones (onBadRecord: skip)
  std::vector<float> norm_mean, norm_std;
};

// An in-memory training set (tests, benchmarks).
TrainingSet InMemoryTrainingSet(Dataset data);

// The batches one worker trains on, streamed from `source`:
//
//  - Sharding: a pass reads the files in order; its n-th record (0-based,
//    counting the records that load) goes to shard
//    (n + r(n / num_shards)) mod num_shards, r a seeded hash of the block
//    number: every block of num_shards consecutive records gives each worker
//    one, so the shards are disjoint, cover the data, differ in size by at
//    most 1 and are the same every pass.
//  - Shuffling: a buffer of `buffer_records` records. The first records of
//    the shard fill it; then each further record replaces a uniformly chosen
//    one, which is emitted; at the end of the pass the rest leave in random
//    order. Every record of the shard is emitted exactly once per pass, and a
//    shard that fits in the buffer is permuted uniformly. The choices come
//    from a generator seeded with (seed, pass, shard): reruns repeat exactly.
//  - Memory: the buffer (buffer_records records: feature_dim floats each for
//    dense formats, 8 bytes per listed feature for libsvm) plus the reader's
//    (LineReader::kChunk bytes, zlib's window and the longest line).
//
// A batch runs into the next pass when the shard is exhausted. Not
// thread-safe; `source` must outlive the batcher.
class ShardedBatcher {
 public:
  ShardedBatcher(const RecordSource& source, int shard, int num_shards, uint64_t seed,
                 int64_t buffer_records);
  // In memory, the buffer holding the whole shard (tests, benchmarks).
  ShardedBatcher(const Dataset& data, int shard, int num_shards, uint64_t seed);

  // Copies the next `batch` examples into x (batch x feature_dim), y and,
  // if the data has them, the regression targets t and the lookup ids
  // (batch x id_slots). Errors: the data (file:line), an invalid shard, or
  // a shard with no records.
  // With `lookup_weights`, also their weights (1 where the data has none).
  absl::Status Next(int batch, std::vector<float>* x, std::vector<int32_t>* y,
                    std::vector<float>* t = nullptr, std::vector<int64_t>* lookup_ids = nullptr,
                    std::vector<float>* lookup_weights = nullptr);

  // Completed passes.
  int64_t epoch() const { return epoch_; }
  // Which shard record n of a pass belongs to.
  static int ShardOf(int64_t n, int num_shards, uint64_t seed);
  // Records of `shard` in a pass over `total` records.
  static int64_t ShardSize(int64_t total, int shard, int num_shards, uint64_t seed);

 private:
  // The next record of the shard into out_.
  absl::Status NextRecord();
  void StartPass();

  std::unique_ptr<DatasetSource> owned_;  // the in-memory constructor's
  const RecordSource& source_;
  const int shard_;
  const int num_shards_;
  const uint64_t seed_;
  const size_t capacity_;

  std::unique_ptr<RecordReader> reader_;  // null between passes
  std::mt19937_64 rng_;
  std::vector<Record> buffer_;
  Record scratch_, out_;
  int64_t record_index_ = 0;  // of the pass
  int64_t emitted_ = 0;       // in the pass
  bool draining_ = false;     // the files are read, the buffer empties
  int64_t epoch_ = 0;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_DATASET_H_
