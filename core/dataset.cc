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

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  std::unique_ptr<LineReader> r(new LineReader(path));
  errno = 0;
  if (absl::EndsWith(path, ".gz")) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) return CannotOpen(path);
    gzbuffer(f, 1 << 17);
    r->gz_ = f;
  } else {
    r->raw_ = std::fopen(path.c_str(), "rb");
    if (r->raw_ == nullptr) return CannotOpen(path);
  }
  return r;
}

LineReader::~LineReader() {
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
  if (raw_ != nullptr) std::fclose(raw_);
}

absl::StatusOr<size_t> LineReader::Fill() {
  const size_t old_size = buf_.size();
  buf_.resize(old_size + kChunk);
  size_t n = 0;
  if (gz_ != nullptr) {
    gzFile f = static_cast<gzFile>(gz_);
    const int got = gzread(f, &buf_[old_size], static_cast<unsigned>(kChunk));
    n = got > 0 ? static_cast<size_t>(got) : 0;
    // As ReadGzip: truncation and bad data show only through gzerror.
    int errnum = Z_OK;
    const char* message = gzerror(f, &errnum);
    if (errnum == Z_ERRNO) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": read error: ", std::strerror(errno)));
    }
    if (errnum != Z_OK) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": corrupt gzip data: ", message));
    }
  } else {
    n = std::fread(&buf_[old_size], 1, kChunk, raw_);
    if (std::ferror(raw_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": read error: ", std::strerror(errno)));
    }
  }
  buf_.resize(old_size + n);
  return n;
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
    auto n = Fill();
    if (!n.ok()) return n.status();
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

ShardedBatcher::ShardedBatcher(const Dataset& data, int shard, int num_shards, uint64_t seed)
    : data_(data), seed_(seed), shard_(shard) {
  // An invalid shard assignment yields an empty shard; Next() then returns
  // empty batches rather than reading out of bounds.
  if (num_shards < 1 || shard < 0 || shard >= num_shards) return;
  std::vector<int64_t> all(data.size);
  for (int64_t i = 0; i < data.size; ++i) all[i] = i;
  // Every worker derives the same global permutation from the seed alone, so
  // the strided shards are disjoint and cover everything.
  std::mt19937_64 rng(seed);
  for (int64_t i = data.size - 1; i > 0; --i) {
    std::swap(all[i], all[rng() % static_cast<uint64_t>(i + 1)]);
  }
  for (int64_t pos = shard; pos < data.size; pos += num_shards) {
    indices_.push_back(all[pos]);
  }
  Reshuffle();
}

void ShardedBatcher::Reshuffle() {
  // Hand-rolled Fisher-Yates (std::shuffle's algorithm is unspecified), so the
  // order is identical across standard libraries.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(epoch_), static_cast<uint32_t>(epoch_ >> 32),
                    static_cast<uint32_t>(shard_)};
  std::mt19937_64 rng(seq);
  for (size_t i = indices_.size(); i > 1; --i) {
    std::swap(indices_[i - 1], indices_[rng() % i]);
  }
  cursor_ = 0;
}

void ShardedBatcher::Next(int batch, std::vector<float>* x, std::vector<int32_t>* y) {
  Next(batch, x, y, nullptr);
}

void ShardedBatcher::Next(int batch, std::vector<float>* x, std::vector<int32_t>* y,
                          std::vector<float>* t) {
  const bool targets = t != nullptr && !data_.targets.empty();
  if (t != nullptr) t->clear();
  if (indices_.empty() || batch <= 0) {
    x->clear();
    y->clear();
    return;
  }
  if (targets) t->resize(batch);
  const int dim = data_.feature_dim();
  x->resize(static_cast<size_t>(batch) * dim);
  y->resize(batch);
  for (int i = 0; i < batch; ++i) {
    if (cursor_ == indices_.size()) {
      ++epoch_;
      Reshuffle();
    }
    const int64_t example = indices_[cursor_++];
    std::memcpy(x->data() + static_cast<size_t>(i) * dim, data_.images.data() + example * dim,
                dim * sizeof(float));
    (*y)[i] = data_.labels[example];
    if (targets) (*t)[i] = data_.targets[example];
  }
}

}  // namespace kubetrain
