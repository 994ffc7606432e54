#include "core/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/hash.h"

namespace kubetrain {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // IDX3, unsigned bytes
constexpr uint32_t kLabelsMagic = 0x00000801;  // IDX1, unsigned bytes
constexpr int kNumClasses = 10;
// Rejects absurd headers before they turn into giant allocations.
constexpr uint32_t kMaxSide = 1 << 15;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

absl::Status CannotOpen(const std::string& path) {
  const std::string why = std::strerror(errno);
  if (errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", why));
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", why));
}

// Reads the whole file, or its first `limit` bytes.
absl::StatusOr<std::string> ReadGzip(const std::string& path, size_t limit) {
  errno = 0;
  gzFile raw = gzopen(path.c_str(), "rb");
  if (raw == nullptr) return CannotOpen(path);
  std::unique_ptr<gzFile_s, GzCloser> file(raw);
  gzbuffer(raw, 1 << 17);
  std::string data;
  constexpr size_t kChunk = 1 << 20;
  while (data.size() < limit) {
    const size_t old_size = data.size();
    const unsigned chunk = static_cast<unsigned>(std::min(kChunk, limit - old_size));
    data.resize(old_size + chunk);
    const int n = gzread(raw, &data[old_size], chunk);
    if (n < 0) {
      data.resize(old_size);
      break;
    }
    data.resize(old_size + n);
    if (n == 0) break;
  }
  // gzread reports a premature end of a gzip stream only through gzerror
  // (Z_BUF_ERROR), and bad data/CRC as Z_DATA_ERROR; check after the loop.
  int errnum = Z_OK;
  const char* message = gzerror(raw, &errnum);
  if (errnum == Z_ERRNO) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read error: ", std::strerror(errno)));
  }
  if (errnum != Z_OK) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt gzip data: ", message));
  }
  const int close_result = gzclose(file.release());
  if (close_result != Z_OK) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": corrupt gzip data: gzclose returned ", close_result));
  }
  return data;
}

absl::StatusOr<std::string> ReadRaw(const std::string& path, size_t limit) {
  errno = 0;
  std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return CannotOpen(path);
  std::string data;
  char buf[1 << 16];
  size_t n;
  while (data.size() < limit &&
         (n = std::fread(buf, 1, std::min(sizeof(buf), limit - data.size()), file.get())) > 0) {
    data.append(buf, n);
  }
  if (std::ferror(file.get())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read error: ", std::strerror(errno)));
  }
  return data;
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     size_t limit = std::numeric_limits<size_t>::max()) {
  if (absl::EndsWith(path, ".gz")) return ReadGzip(path, limit);
  return ReadRaw(path, limit);
}

std::string FashionMnistPath(const std::string& dir, bool train, const char* kind) {
  return absl::StrCat(dir, "/", train ? "train" : "t10k", "-", kind, "-ubyte.gz");
}

uint32_t BigEndian32(const std::string& data, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data()) + offset;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Checks the magic and that the file holds a full header.
absl::Status CheckHeader(const std::string& path, const std::string& data, uint32_t magic,
                         const char* kind, size_t header_bytes) {
  if (data.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: file has ", data.size(),
                                                   " bytes, too short for an IDX magic number"));
  }
  const uint32_t got = BigEndian32(data, 0);
  if (got != magic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad magic 0x%08x (expected 0x%08x for %s)", path, got, magic, kind));
  }
  if (data.size() < header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: header needs ", header_bytes,
                                                   " bytes, file has ", data.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path) {
  absl::StatusOr<std::string> images = ReadFile(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels = ReadFile(labels_path);
  if (!labels.ok()) return labels.status();

  constexpr size_t kImagesHeader = 16, kLabelsHeader = 8;
  absl::Status status =
      CheckHeader(images_path, *images, kImagesMagic, "IDX3 images", kImagesHeader);
  if (!status.ok()) return status;
  status = CheckHeader(labels_path, *labels, kLabelsMagic, "IDX1 labels", kLabelsHeader);
  if (!status.ok()) return status;

  const uint32_t count = BigEndian32(*images, 4);
  const uint32_t rows = BigEndian32(*images, 8);
  const uint32_t cols = BigEndian32(*images, 12);
  if (rows == 0 || cols == 0 || rows > kMaxSide || cols > kMaxSide) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": bad image size ", rows, "x",
                                                   cols, " (each side must be in [1, ", kMaxSide,
                                                   "])"));
  }
  // count < 2^32 and rows*cols <= 2^30, so this fits in 64 bits.
  const uint64_t pixel_bytes = uint64_t{count} * rows * cols;
  const uint64_t have_pixels = images->size() - kImagesHeader;
  if (have_pixels < pixel_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": truncated: header promises ",
                                                   pixel_bytes, " bytes of pixels, file has ",
                                                   have_pixels));
  }

  const uint32_t label_count = BigEndian32(*labels, 4);
  const uint64_t have_labels = labels->size() - kLabelsHeader;
  if (have_labels < label_count) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": truncated: header promises ",
                                                   label_count, " bytes of labels, file has ",
                                                   have_labels));
  }
  if (label_count != count) {
    return absl::InvalidArgumentError(absl::StrCat("image count ", count, " (", images_path,
                                                   ") != label count ", label_count, " (",
                                                   labels_path, ")"));
  }

  Dataset data;
  data.size = count;
  data.rows = static_cast<int>(rows);
  data.cols = static_cast<int>(cols);
  data.labels.resize(count);
  const auto* label_bytes = reinterpret_cast<const unsigned char*>(labels->data()) + kLabelsHeader;
  for (uint32_t i = 0; i < count; ++i) {
    if (label_bytes[i] >= kNumClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{label_bytes[i]},
                                                     " out of range [0,", kNumClasses,
                                                     ") at index ", i));
    }
    data.labels[i] = label_bytes[i];
  }
  data.images.resize(pixel_bytes);
  const auto* pixels = reinterpret_cast<const unsigned char*>(images->data()) + kImagesHeader;
  for (uint64_t i = 0; i < pixel_bytes; ++i) {
    data.images[i] = pixels[i] * (1.0f / 255.0f);
  }
  return data;
}

absl::StatusOr<std::string> ReadDataFile(const std::string& path) { return ReadFile(path); }

// A file read sequentially in chunks: ".gz" through zlib, else stdio.
class DataStream {
 public:
  static absl::StatusOr<std::unique_ptr<DataStream>> Open(const std::string& path) {
    std::unique_ptr<DataStream> d(new DataStream(path));
    errno = 0;
    if (absl::EndsWith(path, ".gz")) {
      d->gz_ = gzopen(path.c_str(), "rb");
      if (d->gz_ == nullptr) return CannotOpen(path);
      gzbuffer(d->gz_, 1 << 17);
    } else {
      d->raw_ = std::fopen(path.c_str(), "rb");
      if (d->raw_ == nullptr) return CannotOpen(path);
    }
    return d;
  }
  ~DataStream() {
    if (gz_ != nullptr) gzclose(gz_);
    if (raw_ != nullptr) std::fclose(raw_);
  }
  // Reads up to n bytes (fewer only at the end of the file).
  absl::StatusOr<size_t> Read(char* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      size_t k = 0;
      if (gz_ != nullptr) {
        const int r =
            gzread(gz_, buf + got, static_cast<unsigned>(std::min<size_t>(n - got, 1 << 30)));
        k = r > 0 ? static_cast<size_t>(r) : 0;
        // As ReadGzip: truncation and bad data show only through gzerror.
        int errnum = Z_OK;
        const char* message = gzerror(gz_, &errnum);
        if (errnum == Z_ERRNO) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": read error: ", std::strerror(errno)));
        }
        if (errnum != Z_OK) {
          return absl::InvalidArgumentError(absl::StrCat(path_, ": corrupt gzip data: ", message));
        }
      } else {
        k = std::fread(buf + got, 1, n - got, raw_);
        if (std::ferror(raw_)) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": read error: ", std::strerror(errno)));
        }
      }
      if (k == 0) break;
      got += k;
    }
    return got;
  }

 private:
  explicit DataStream(std::string path) : path_(std::move(path)) {}
  const std::string path_;
  gzFile gz_ = nullptr;
  std::FILE* raw_ = nullptr;
};

LineReader::LineReader(std::string path, std::unique_ptr<DataStream> stream)
    : path_(std::move(path)), stream_(std::move(stream)) {}
LineReader::~LineReader() = default;

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  auto stream = DataStream::Open(path);
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<LineReader>(new LineReader(path, std::move(*stream)));
}

absl::StatusOr<bool> LineReader::Next(absl::string_view* line) {
  size_t scan = start_;
  while (true) {
    const size_t nl = buf_.find('\n', scan);
    if (nl != std::string::npos) {
      absl::string_view l(buf_.data() + start_, nl - start_);
      start_ = nl + 1;
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      ++line_number_;
      *line = l;
      return true;
    }
    if (eof_) {
      if (start_ == buf_.size()) return false;
      absl::string_view l(buf_.data() + start_, buf_.size() - start_);
      start_ = buf_.size();
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      ++line_number_;
      *line = l;
      return true;
    }
    // Keep the partial line, drop what was returned, read more.
    buf_.erase(0, start_);
    start_ = 0;
    scan = buf_.size();
    if (buf_.size() > kMaxLine) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":", line_number_ + 1, ": line longer than ", kMaxLine, " bytes"));
    }
    const size_t old_size = buf_.size();
    buf_.resize(old_size + kChunk);
    auto n = stream_->Read(&buf_[old_size], kChunk);
    if (!n.ok()) return n.status();
    buf_.resize(old_size + *n);
    if (*n == 0) eof_ = true;
  }
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train) {
  return LoadIdx(FashionMnistPath(dir, train, "images-idx3"),
                 FashionMnistPath(dir, train, "labels-idx1"));
}

absl::StatusOr<int64_t> CountExamples(const std::string& dir, bool train) {
  constexpr size_t kLabelsHeader = 8;  // magic, count
  const std::string path = FashionMnistPath(dir, train, "labels-idx1");
  absl::StatusOr<std::string> header = ReadFile(path, kLabelsHeader);
  if (!header.ok()) return header.status();
  absl::Status status = CheckHeader(path, *header, kLabelsMagic, "IDX1 labels", kLabelsHeader);
  if (!status.ok()) return status;
  return int64_t{BigEndian32(*header, 4)};
}

void Record::CopyTo(float* x, int64_t dim) const {
  if (!dense.empty()) {
    std::memcpy(x, dense.data(), std::min<int64_t>(dim, dense.size()) * sizeof(float));
    return;
  }
  std::fill(x, x + dim, 0.0f);
  for (size_t k = 0; k < ids.size(); ++k) x[ids[k]] = values[k];
}

namespace {

class DatasetReader : public RecordReader {
 public:
  explicit DatasetReader(const Dataset& data) : data_(data) {}
  absl::StatusOr<bool> Next(Record* r) override {
    if (next_ >= data_.size) return false;
    const int64_t dim = data_.feature_dim();
    const float* row = data_.images.data() + next_ * dim;
    r->dense.assign(row, row + dim);
    r->ids.clear();
    r->values.clear();
    const int64_t* ids = data_.lookup_ids.data() + next_ * data_.id_slots;
    r->lookup_ids.assign(ids, ids + data_.id_slots);
    r->lookup_weights.clear();
    if (!data_.lookup_weights.empty()) {
      const float* w = data_.lookup_weights.data() + next_ * data_.id_slots;
      r->lookup_weights.assign(w, w + data_.id_slots);
    }
    r->label = data_.labels.empty() ? 0 : data_.labels[next_];
    r->target = data_.targets.empty() ? 0.0f : data_.targets[next_];
    ++next_;
    return true;
  }

 private:
  const Dataset& data_;
  int64_t next_ = 0;
};

// Streams an IDX3 image file and its IDX1 label file side by side.
class IdxReader : public RecordReader {
 public:
  IdxReader(std::string images_path, std::string labels_path, uint32_t count, int pixels)
      : images_path_(std::move(images_path)),
        labels_path_(std::move(labels_path)),
        count_(count),
        pixels_(pixels) {}

  absl::Status Start() {
    auto images = DataStream::Open(images_path_);
    if (!images.ok()) return images.status();
    auto labels = DataStream::Open(labels_path_);
    if (!labels.ok()) return labels.status();
    images_ = std::move(*images);
    labels_ = std::move(*labels);
    char header[16];
    for (auto [stream, bytes] : {std::pair{images_.get(), 16}, std::pair{labels_.get(), 8}}) {
      auto n = stream->Read(header, bytes);
      if (!n.ok()) return n.status();
    }
    bytes_.resize(pixels_);
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Next(Record* r) override {
    if (next_ >= count_) return false;
    auto n = images_->Read(bytes_.data(), bytes_.size());
    if (!n.ok()) return n.status();
    if (*n < bytes_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(images_path_, ": truncated: header promises ",
                                                     count_, " images, the file ends in image ",
                                                     next_));
    }
    char label;
    auto m = labels_->Read(&label, 1);
    if (!m.ok()) return m.status();
    if (*m < 1) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path_, ": truncated: header promises ",
                                                     count_, " labels, the file ends at ", next_));
    }
    const auto value = static_cast<unsigned char>(label);
    if (value >= kNumClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path_, ": label ", int{value},
                                                     " out of range [0,", kNumClasses,
                                                     ") at index ", next_));
    }
    r->dense.resize(pixels_);
    for (int i = 0; i < pixels_; ++i) {
      r->dense[i] = static_cast<unsigned char>(bytes_[i]) * (1.0f / 255.0f);
    }
    r->ids.clear();
    r->values.clear();
    r->label = value;
    r->target = 0;
    ++next_;
    return true;
  }

 private:
  const std::string images_path_, labels_path_;
  const uint32_t count_;
  const int pixels_;
  std::unique_ptr<DataStream> images_, labels_;
  std::vector<char> bytes_;
  uint32_t next_ = 0;
};

class IdxSource : public RecordSource {
 public:
  IdxSource(std::string images, std::string labels, uint32_t count, int rows, int cols)
      : images_(std::move(images)),
        labels_(std::move(labels)),
        count_(count),
        rows_(rows),
        cols_(cols) {}
  int64_t feature_dim() const override { return int64_t{rows_} * cols_; }
  bool has_targets() const override { return false; }
  absl::StatusOr<std::unique_ptr<RecordReader>> Open() const override {
    auto r = std::make_unique<IdxReader>(images_, labels_, count_, rows_ * cols_);
    if (absl::Status s = r->Start(); !s.ok()) return s;
    return std::unique_ptr<RecordReader>(std::move(r));
  }

 private:
  const std::string images_, labels_;
  const uint32_t count_;
  const int rows_, cols_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> DatasetSource::Open() const {
  return std::unique_ptr<RecordReader>(new DatasetReader(data_));
}

absl::StatusOr<std::unique_ptr<RecordSource>> OpenIdxSource(const std::string& dir, bool train) {
  const std::string images_path = FashionMnistPath(dir, train, "images-idx3");
  const std::string labels_path = FashionMnistPath(dir, train, "labels-idx1");
  constexpr size_t kImagesHeader = 16, kLabelsHeader = 8;
  auto images = ReadFile(images_path, kImagesHeader);
  if (!images.ok()) return images.status();
  auto labels = ReadFile(labels_path, kLabelsHeader);
  if (!labels.ok()) return labels.status();
  absl::Status status =
      CheckHeader(images_path, *images, kImagesMagic, "IDX3 images", kImagesHeader);
  if (!status.ok()) return status;
  status = CheckHeader(labels_path, *labels, kLabelsMagic, "IDX1 labels", kLabelsHeader);
  if (!status.ok()) return status;
  const uint32_t count = BigEndian32(*images, 4);
  const uint32_t rows = BigEndian32(*images, 8);
  const uint32_t cols = BigEndian32(*images, 12);
  if (rows == 0 || cols == 0 || rows > kMaxSide || cols > kMaxSide) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": bad image size ", rows, "x",
                                                   cols, " (each side must be in [1, ", kMaxSide,
                                                   "])"));
  }
  const uint32_t label_count = BigEndian32(*labels, 4);
  if (label_count != count) {
    return absl::InvalidArgumentError(absl::StrCat("image count ", count, " (", images_path,
                                                   ") != label count ", label_count, " (",
                                                   labels_path, ")"));
  }
  return std::unique_ptr<RecordSource>(new IdxSource(
      images_path, labels_path, count, static_cast<int>(rows), static_cast<int>(cols)));
}

absl::StatusOr<Dataset> ReadRecords(const RecordSource& source, int64_t limit) {
  auto reader = source.Open();
  if (!reader.ok()) return reader.status();
  Dataset d;
  d.rows = 1;
  d.cols = static_cast<int>(source.feature_dim());
  d.id_slots = static_cast<int>(source.id_slots());
  const bool targets = source.has_targets();
  Record r;
  while (limit < 0 || d.size < limit) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) break;
    d.images.resize(d.images.size() + d.cols);
    r.CopyTo(d.images.data() + d.size * d.cols, d.cols);
    d.lookup_ids.insert(d.lookup_ids.end(), r.lookup_ids.begin(), r.lookup_ids.end());
    d.lookup_weights.insert(d.lookup_weights.end(), r.lookup_weights.begin(),
                            r.lookup_weights.end());
    d.labels.push_back(r.label);
    if (targets) d.targets.push_back(r.target);
    ++d.size;
  }
  d.skipped_records = (*reader)->skipped();
  return d;
}

TrainingSet InMemoryTrainingSet(Dataset data) {
  auto owned = std::make_shared<const Dataset>(std::move(data));
  TrainingSet set;
  set.size = owned->size;
  set.skipped_records = owned->skipped_records;
  set.norm_mean = owned->norm_mean;
  set.norm_std = owned->norm_std;
  // The source refers to the Dataset; the aliasing pointer keeps it alive.
  struct Holder {
    std::shared_ptr<const Dataset> data;
    DatasetSource source;
  };
  auto holder = std::make_shared<Holder>(Holder{owned, DatasetSource(*owned)});
  set.source = std::shared_ptr<const RecordSource>(holder, &holder->source);
  return set;
}

int ShardedBatcher::ShardOf(int64_t n, int num_shards, uint64_t seed) {
  if (num_shards <= 1) return 0;
  const uint64_t block = static_cast<uint64_t>(n / num_shards);
  const uint64_t rotation = SplitMix64(seed ^ SplitMix64(block)) % num_shards;
  return static_cast<int>((n % num_shards + rotation) % num_shards);
}

int64_t ShardedBatcher::ShardSize(int64_t total, int shard, int num_shards, uint64_t seed) {
  if (num_shards < 1 || shard < 0 || shard >= num_shards) return 0;
  int64_t size = total / num_shards;
  for (int64_t n = size * num_shards; n < total; ++n) {
    if (ShardOf(n, num_shards, seed) == shard) ++size;
  }
  return size;
}

ShardedBatcher::ShardedBatcher(const RecordSource& source, int shard, int num_shards, uint64_t seed,
                               int64_t buffer_records)
    : source_(source),
      shard_(shard),
      num_shards_(num_shards),
      seed_(seed),
      capacity_(static_cast<size_t>(std::max<int64_t>(1, buffer_records))) {}

ShardedBatcher::ShardedBatcher(const Dataset& data, int shard, int num_shards, uint64_t seed)
    : owned_(std::make_unique<DatasetSource>(data)),
      source_(*owned_),
      shard_(shard),
      num_shards_(num_shards),
      seed_(seed),
      capacity_(static_cast<size_t>(std::max<int64_t>(1, data.size))) {}

void ShardedBatcher::StartPass() {
  // The same generator for every standard library (std::shuffle's algorithm
  // is unspecified; we draw with rng() % k ourselves).
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(epoch_), static_cast<uint32_t>(epoch_ >> 32),
                    static_cast<uint32_t>(shard_)};
  rng_.seed(seq);
  record_index_ = 0;
  emitted_ = 0;
  draining_ = false;
}

absl::Status ShardedBatcher::NextRecord() {
  while (true) {
    if (reader_ == nullptr) {
      auto reader = source_.Open();
      if (!reader.ok()) return reader.status();
      reader_ = std::move(*reader);
      StartPass();
    }
    while (!draining_) {
      auto more = reader_->Next(&scratch_);
      if (!more.ok()) return more.status();
      if (!*more) {
        draining_ = true;
        break;
      }
      if (ShardOf(record_index_++, num_shards_, seed_) != shard_) continue;
      if (buffer_.size() < capacity_) {
        buffer_.push_back(std::move(scratch_));
        continue;
      }
      const size_t j = rng_() % capacity_;
      std::swap(out_, buffer_[j]);
      buffer_[j] = std::move(scratch_);
      ++emitted_;
      return absl::OkStatus();
    }
    if (!buffer_.empty()) {
      const size_t j = rng_() % buffer_.size();
      std::swap(out_, buffer_[j]);
      if (j + 1 != buffer_.size()) buffer_[j] = std::move(buffer_.back());
      buffer_.pop_back();
      ++emitted_;
      return absl::OkStatus();
    }
    reader_.reset();
    if (emitted_ == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard_, " of ", num_shards_, " has no records (the training set has ",
          record_index_, ", fewer than the workers)"));
    }
    ++epoch_;
  }
}

absl::Status ShardedBatcher::Next(int batch, std::vector<float>* x, std::vector<int32_t>* y,
                                  std::vector<float>* t, std::vector<int64_t>* lookup_ids,
                                  std::vector<float>* lookup_weights) {
  if (num_shards_ < 1 || shard_ < 0 || shard_ >= num_shards_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_, " is not one of ", num_shards_, " shards"));
  }
  const bool targets = t != nullptr && source_.has_targets();
  if (t != nullptr) t->clear();
  const int64_t dim = source_.feature_dim();
  const int64_t slots = lookup_ids != nullptr ? source_.id_slots() : 0;
  x->resize(static_cast<size_t>(std::max(0, batch)) * dim);
  y->resize(std::max(0, batch));
  if (targets) t->resize(batch);
  if (lookup_ids != nullptr)
    lookup_ids->assign(static_cast<size_t>(std::max(0, batch)) * slots, -1);
  if (lookup_weights != nullptr) {
    lookup_weights->assign(static_cast<size_t>(std::max(0, batch)) * slots, 1.0f);
  }
  for (int i = 0; i < batch; ++i) {
    if (absl::Status s = NextRecord(); !s.ok()) return s;
    out_.CopyTo(x->data() + static_cast<size_t>(i) * dim, dim);
    (*y)[i] = out_.label;
    if (targets) (*t)[i] = out_.target;
    if (slots > 0) {
      std::copy_n(out_.lookup_ids.begin(), std::min<int64_t>(slots, out_.lookup_ids.size()),
                  lookup_ids->begin() + static_cast<size_t>(i) * slots);
      if (lookup_weights != nullptr) {
        std::copy_n(out_.lookup_weights.begin(),
                    std::min<int64_t>(slots, out_.lookup_weights.size()),
                    lookup_weights->begin() + static_cast<size_t>(i) * slots);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
