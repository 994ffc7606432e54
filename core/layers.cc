#include "core/layers.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kubetrain {
namespace {

using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using MatrixMap = Eigen::Map<RowMatrix>;

// Keeps shapes far from int overflow in index arithmetic.
constexpr int64_t kMaxElements = int64_t{1} << 28;

int SameOut(int side, int stride) { return (side + stride - 1) / stride; }

}  // namespace

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int d : shape) n *= d;
  return n;
}

const char* ActivationName(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return "relu";
    case Activation::kTanh:
      return "tanh";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kLinear:
      break;
  }
  return "linear";
}

const char* LayerTypeName(LayerType t) {
  switch (t) {
    case LayerType::kConv2D:
      return "conv2d";
    case LayerType::kMaxPool2D:
      return "maxpool2d";
    case LayerType::kAvgPool2D:
      return "avgpool2d";
    case LayerType::kFlatten:
      return "flatten";
    case LayerType::kDropout:
      return "dropout";
    case LayerType::kDense:
      break;
  }
  return "dense";
}

const char* HeadTypeName(HeadType h) {
  switch (h) {
    case HeadType::kSigmoid:
      return "sigmoid";
    case HeadType::kMeanSquaredError:
      return "meanSquaredError";
    case HeadType::kWideAndDeep:
      return "wideAndDeep";
    case HeadType::kSoftmax:
      break;
  }
  return "softmax";
}

std::optional<Activation> ActivationFromName(const std::string& name) {
  for (Activation a :
       {Activation::kLinear, Activation::kRelu, Activation::kTanh, Activation::kSigmoid}) {
    if (name == ActivationName(a)) return a;
  }
  return std::nullopt;
}

std::optional<LayerType> LayerTypeFromName(const std::string& name) {
  for (LayerType t : {LayerType::kDense, LayerType::kConv2D, LayerType::kMaxPool2D,
                      LayerType::kAvgPool2D, LayerType::kFlatten, LayerType::kDropout}) {
    if (name == LayerTypeName(t)) return t;
  }
  return std::nullopt;
}

std::optional<HeadType> HeadTypeFromName(const std::string& name) {
  for (HeadType h : {HeadType::kSoftmax, HeadType::kSigmoid, HeadType::kMeanSquaredError,
                     HeadType::kWideAndDeep}) {
    if (name == HeadTypeName(h)) return h;
  }
  return std::nullopt;
}

WindowGeometry MakeWindowGeometry(const LayerSpec& layer, const Shape& input) {
  WindowGeometry g;
  g.in_h = input[0];
  g.in_w = input[1];
  g.in_c = input[2];
  g.k = layer.kernel;
  g.stride = layer.stride;
  if (layer.type == LayerType::kConv2D && layer.same_padding) {
    g.out_h = SameOut(g.in_h, g.stride);
    g.out_w = SameOut(g.in_w, g.stride);
    g.pad_top = std::max((g.out_h - 1) * g.stride + g.k - g.in_h, 0) / 2;
    g.pad_left = std::max((g.out_w - 1) * g.stride + g.k - g.in_w, 0) / 2;
  } else {
    g.out_h = (g.in_h - g.k) / g.stride + 1;
    g.out_w = (g.in_w - g.k) / g.stride + 1;
  }
  return g;
}

absl::StatusOr<Shape> OutputShape(const LayerSpec& layer, const Shape& input) {
  const char* name = LayerTypeName(layer.type);
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(name, " ", why));
  };
  for (int d : input) {
    if (d <= 0) return fail(absl::StrCat("got an empty input ", ShapeString(input)));
  }
  Shape out;
  switch (layer.type) {
    case LayerType::kDense:
      if (input.size() != 1) {
        return fail(absl::StrCat("needs a 1-D input, got ", ShapeString(input),
                                 " (add a flatten layer before it)"));
      }
      if (layer.units < 1) return fail(absl::StrCat("needs units >= 1, got ", layer.units));
      out = {layer.units};
      break;
    case LayerType::kConv2D:
    case LayerType::kMaxPool2D:
    case LayerType::kAvgPool2D: {
      if (input.size() != 3) {
        return fail(absl::StrCat("needs a 3-D input, got ", ShapeString(input)));
      }
      if (layer.kernel < 1) return fail(absl::StrCat("needs kernel >= 1, got ", layer.kernel));
      if (layer.stride < 1) return fail(absl::StrCat("needs stride >= 1, got ", layer.stride));
      const bool same = layer.type == LayerType::kConv2D && layer.same_padding;
      if (!same && (layer.kernel > input[0] || layer.kernel > input[1])) {
        return fail(absl::StrCat("window ", layer.kernel, "x", layer.kernel,
                                 " is larger than its input ", ShapeString(input),
                                 same ? "" : " (padding valid)"));
      }
      WindowGeometry g = MakeWindowGeometry(layer, input);
      int channels = input[2];
      if (layer.type == LayerType::kConv2D) {
        if (layer.filters < 1) return fail(absl::StrCat("needs filters >= 1, got ", layer.filters));
        channels = layer.filters;
      }
      out = {g.out_h, g.out_w, channels};
      break;
    }
    case LayerType::kFlatten:
      if (NumElements(input) > kMaxElements) break;  // reported below
      out = {static_cast<int>(NumElements(input))};
      break;
    case LayerType::kDropout:
      if (!(layer.rate >= 0 && layer.rate < 1)) {
        return fail(absl::StrCat("needs rate in [0, 1), got ", layer.rate));
      }
      out = input;
      break;
  }
  if (out.empty() || NumElements(out) > kMaxElements) {
    return fail(absl::StrCat("output of input ", ShapeString(input), " is too large (more than ",
                             kMaxElements, " values per example)"));
  }
  return out;
}

namespace {

// Below this many elements an element-wise pass stays on the caller's
// thread: waking another costs more (it never changes the bits).
constexpr int64_t kMinParallelElements = int64_t{1} << 15;

ThreadPool* PoolFor(ThreadPool* pool, int64_t elements) {
  return elements < kMinParallelElements ? nullptr : pool;
}

// Im2Col of images [b0, b1) into their rows of col (sized).
void Im2ColImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                  RowMatrix* col) {
  const int64_t patch = g.patch_size();
  const int64_t in_size = int64_t{g.in_h} * g.in_w * g.in_c;
  const size_t run = static_cast<size_t>(g.k) * g.in_c;  // one kernel row, contiguous in HWC
  for (int64_t b = b0; b < b1; ++b) {
    const float* image = in + b * in_size;
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox) {
        float* dst = col->data() + ((b * g.out_h + oy) * g.out_w + ox) * patch;
        const int x0 = ox * g.stride - g.pad_left;
        const bool row_inside = x0 >= 0 && x0 + g.k <= g.in_w;
        for (int ky = 0; ky < g.k; ++ky) {
          const int iy = oy * g.stride - g.pad_top + ky;
          float* d = dst + ky * run;
          if (iy < 0 || iy >= g.in_h) {
            std::memset(d, 0, run * sizeof(float));
            continue;
          }
          const float* src_row = image + int64_t{iy} * g.in_w * g.in_c;
          if (row_inside) {
            std::memcpy(d, src_row + int64_t{x0} * g.in_c, run * sizeof(float));
            continue;
          }
          for (int kx = 0; kx < g.k; ++kx) {
            const int ix = x0 + kx;
            if (ix < 0 || ix >= g.in_w) {
              std::memset(d + kx * g.in_c, 0, g.in_c * sizeof(float));
            } else {
              std::memcpy(d + kx * g.in_c, src_row + int64_t{ix} * g.in_c, g.in_c * sizeof(float));
            }
          }
        }
      }
    }
  }
}

}  // namespace

void Im2Col(const WindowGeometry& g, const float* in, int batch, RowMatrix* col, ThreadPool* pool) {
  col->resize(batch * g.positions(), g.patch_size());
  ParallelFor(pool, batch, [&](int64_t b0, int64_t b1) { Im2ColImages(g, in, b0, b1, col); });
}

namespace {

// Col2ImAdd of images [b0, b1): writes only their slices of in_grad.
// `col` points at image b0's first patch row (the rows of [b0, b1) only).
void Col2ImAddImages(const WindowGeometry& g, const float* col, int64_t b0, int64_t b1,
                     float* in_grad) {
  const int64_t patch = g.patch_size();
  const int64_t in_size = int64_t{g.in_h} * g.in_w * g.in_c;
  for (int64_t b = b0; b < b1; ++b) {
    float* image = in_grad + b * in_size;
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox) {
        const float* src = col + (((b - b0) * g.out_h + oy) * g.out_w + ox) * patch;
        for (int ky = 0; ky < g.k; ++ky) {
          const int iy = oy * g.stride - g.pad_top + ky;
          if (iy < 0 || iy >= g.in_h) continue;
          for (int kx = 0; kx < g.k; ++kx) {
            const int ix = ox * g.stride - g.pad_left + kx;
            if (ix < 0 || ix >= g.in_w) continue;
            float* d = image + (int64_t{iy} * g.in_w + ix) * g.in_c;
            const float* s = src + (int64_t{ky} * g.k + kx) * g.in_c;
            // One add per element, vectorised or not (the same bits); -O2's
            // cheap vectoriser leaves it scalar without the pragma (d and s
            // never overlap: the gradient and the patch buffer).
#pragma omp simd
            for (int c = 0; c < g.in_c; ++c) d[c] += s[c];
          }
        }
      }
    }
  }
}

}  // namespace

void Col2ImAdd(const WindowGeometry& g, const RowMatrix& col, int batch, float* in_grad,
               ThreadPool* pool) {
  ParallelFor(pool, batch, [&](int64_t b0, int64_t b1) {
    Col2ImAddImages(g, col.data() + b0 * g.positions() * g.patch_size(), b0, b1, in_grad);
  });
}

void ConvForwardImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                       const float* kernel, const float* bias, int filters, RowMatrix* col,
                       RowMatrix* out) {
  // One pass per chunk of images: their patches, their rows of the GEMM,
  // their bias; the patches are still in cache for the GEMM.
  const int64_t positions = g.positions();
  Im2ColImages(g, in, b0, b1, col);
  MatrixMap z(out->data(), col->rows(), filters);
  const int64_t r0 = b0 * positions, rows = (b1 - b0) * positions;
  z.middleRows(r0, rows).noalias() =
      col->middleRows(r0, rows) * ConstMatrixMap(kernel, g.patch_size(), filters);
  float* o = out->data() + r0 * filters;
  for (int64_t r = 0; r < rows; ++r, o += filters) {
#pragma omp simd
    for (int f = 0; f < filters; ++f) o[f] += bias[f];
  }
}

void ConvForward(const WindowGeometry& g, const float* in, int batch, const float* kernel,
                 const float* bias, int filters, RowMatrix* col, RowMatrix* out, ThreadPool* pool) {
  if (!Serial(pool)) {
    col->resize(batch * g.positions(), g.patch_size());
    out->resize(batch, g.positions() * filters);
    pool->ParallelFor(batch, [&](int64_t b0, int64_t b1) {
      ConvForwardImages(g, in, b0, b1, kernel, bias, filters, col, out);
    });
    return;
  }
  Im2Col(g, in, batch, col);
  // (batch*positions) x filters is, row-major, batch x positions*filters:
  // the GEMM writes the layer's output in place.
  out->resize(batch, g.positions() * filters);
  MatrixMap z(out->data(), col->rows(), filters);
  z.noalias() = *col * ConstMatrixMap(kernel, g.patch_size(), filters);
  float* o = out->data();
  for (int64_t r = 0; r < z.rows(); ++r, o += filters) {
#pragma omp simd
    for (int f = 0; f < filters; ++f) o[f] += bias[f];
  }
}

namespace {

// ColumnSums of columns [c0, c1).
void ColumnSumsRange(const float* m, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                     float* out) {
  float* sum = out + c0;
  const int64_t n = c1 - c0;
  std::fill(sum, sum + n, 0.0f);
  // Element-wise adds only (lanes are columns, never a sum's terms): every
  // column is summed in row order whatever the alignment of `m` or `out`
  // (or the columns a chunk starts at).
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols + c0;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) sum[j] += row[j];
  }
}

}  // namespace

void ColumnSums(const float* m, int64_t rows, int64_t cols, float* out, ThreadPool* pool) {
  ParallelFor(PoolFor(pool, rows * cols), cols,
              [&](int64_t c0, int64_t c1) { ColumnSumsRange(m, rows, cols, c0, c1, out); });
}

ConvGradientSums::ConvGradientSums(const WindowGeometry& g, int filters, int chunks, float* dkernel,
                                   float* dbias)
    : kernel_size_(g.patch_size() * filters),
      filters_(filters),
      chunks_(chunks),
      dkernel_(dkernel),
      dbias_(dbias),
      parts_(static_cast<size_t>(std::max(chunks - 1, 0)) * (kernel_size_ + filters)) {}

float* ConvGradientSums::dkernel(int c) {
  return c == 0 ? dkernel_ : parts_.data() + (c - 1) * (kernel_size_ + filters_);
}

float* ConvGradientSums::dbias(int c) {
  return c == 0 ? dbias_ : parts_.data() + (c - 1) * (kernel_size_ + filters_) + kernel_size_;
}

void ConvGradientSums::AddUp() {
  for (int c = 1; c < chunks_; ++c) {
    Eigen::Map<Eigen::ArrayXf>(dkernel_, kernel_size_) +=
        Eigen::Map<const Eigen::ArrayXf>(dkernel(c), kernel_size_);
    Eigen::Map<Eigen::ArrayXf>(dbias_, filters_) +=
        Eigen::Map<const Eigen::ArrayXf>(dbias(c), filters_);
  }
}

void ConvBackwardImages(const WindowGeometry& g, const RowMatrix& col, const RowMatrix& dout,
                        const float* kernel, int filters, int64_t b0, int64_t b1, float* dkernel,
                        float* dbias, RowMatrix* din) {
  const int64_t positions = g.positions(), patch = g.patch_size();
  const int64_t r0 = b0 * positions, rows = (b1 - b0) * positions;
  ConstMatrixMap dz(dout.data(), dout.rows() * positions, filters);
  MatrixMap(dkernel, patch, filters).noalias() =
      col.middleRows(r0, rows).transpose() * dz.middleRows(r0, rows);
  ColumnSumsRange(dz.data() + r0 * filters, rows, filters, 0, filters, dbias);
  if (din == nullptr) return;
  // A few images at a time: their patch gradients (about 1 MiB) are still
  // in cache when col2im reads them back, and no batch-sized buffer.
  const ConstMatrixMap k(kernel, patch, filters);
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 18) / (positions * patch));
  RowMatrix dcol(std::min(block, b1 - b0) * positions, patch);
  for (int64_t i0 = b0; i0 < b1; i0 += block) {
    const int64_t i1 = std::min(i0 + block, b1), n = (i1 - i0) * positions;
    dcol.topRows(n).noalias() = dz.middleRows(i0 * positions, n) * k.transpose();
    din->middleRows(i0, i1 - i0).setZero();
    Col2ImAddImages(g, dcol.data(), i0, i1, din->data());
  }
}

void ConvBackward(const WindowGeometry& g, const RowMatrix& col, const RowMatrix& dout,
                  const float* kernel, int filters, int batch, float* dkernel, float* dbias,
                  RowMatrix* din, ThreadPool* pool) {
  ConstMatrixMap dz(dout.data(), batch * g.positions(), filters);
  if (!Serial(pool)) {
    // One job, split by images (ConvGradientSums): a thread reads only its
    // images' patches and dout, not all of dout once per slice of dkernel.
    const int chunks = static_cast<int>(std::min<int64_t>(batch, pool->threads()));
    ConvGradientSums sums(g, filters, chunks, dkernel, dbias);
    if (din != nullptr) din->resize(batch, int64_t{g.in_h} * g.in_w * g.in_c);
    pool->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
      for (int c = static_cast<int>(c0); c < c1; ++c) {
        const auto [b0, b1] = ChunkRange(batch, chunks, c);
        ConvBackwardImages(g, col, dout, kernel, filters, b0, b1, sums.dkernel(c), sums.dbias(c),
                           din);
      }
    });
    sums.AddUp();
    return;
  }
  MatrixMap(dkernel, g.patch_size(), filters).noalias() = col.transpose() * dz;
  ColumnSums(dz.data(), dz.rows(), filters, dbias);
  if (din == nullptr) return;
  RowMatrix dcol(dz.rows(), g.patch_size());
  dcol.noalias() = dz * ConstMatrixMap(kernel, g.patch_size(), filters).transpose();
  din->setZero(batch, int64_t{g.in_h} * g.in_w * g.in_c);
  Col2ImAdd(g, dcol, batch, din->data());
}

void MaxPoolForwardImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                          RowMatrix* out, std::vector<int32_t>* argmax) {
  const int64_t in_size = int64_t{g.in_h} * g.in_w * g.in_c;
  const int64_t out_size = g.positions() * g.in_c;
  const int c_count = g.in_c;
  {
    for (int64_t b = b0; b < b1; ++b) {
      const float* image = in + b * in_size;
      float* o = out->data() + b * out_size;
      int32_t* arg = argmax->data() + b * out_size;
      for (int oy = 0; oy < g.out_h; ++oy) {
        for (int ox = 0; ox < g.out_w; ++ox) {
          // All channels of a window at once (HWC: channels are contiguous):
          // start from its first pixel, then keep the first maximum (">"), so
          // ties route the gradient to one input.
          const int64_t at = (int64_t{oy} * g.out_w + ox) * c_count;
          float* best = o + at;
          int32_t* best_index = arg + at;
          const int32_t first = ((oy * g.stride) * g.in_w + ox * g.stride) * c_count;
#pragma omp simd
          for (int c = 0; c < c_count; ++c) {
            best[c] = image[first + c];
            best_index[c] = first + c;
          }
          for (int ky = 0; ky < g.k; ++ky) {
            for (int kx = ky == 0 ? 1 : 0; kx < g.k; ++kx) {
              const int32_t index =
                  ((oy * g.stride + ky) * g.in_w + (ox * g.stride + kx)) * c_count;
              const float* src = image + index;
#pragma omp simd
              for (int c = 0; c < c_count; ++c) {
                const bool greater = src[c] > best[c];
                best[c] = greater ? src[c] : best[c];
                best_index[c] = greater ? index + c : best_index[c];
              }
            }
          }
        }
      }
    }
  }
}

void MaxPoolForward(const WindowGeometry& g, const float* in, int batch, RowMatrix* out,
                    std::vector<int32_t>* argmax, ThreadPool* pool) {
  out->resize(batch, g.positions() * g.in_c);
  argmax->resize(static_cast<size_t>(batch) * out->cols());
  ParallelFor(pool, batch,
              [&](int64_t b0, int64_t b1) { MaxPoolForwardImages(g, in, b0, b1, out, argmax); });
}

void MaxPoolBackwardImages(const WindowGeometry& g, const RowMatrix& dout,
                           const std::vector<int32_t>& argmax, int64_t b0, int64_t b1,
                           RowMatrix* din) {
  for (int64_t b = b0; b < b1; ++b) {
    const float* d = dout.data() + b * dout.cols();
    const int32_t* arg = argmax.data() + b * dout.cols();
    float* di = din->data() + b * din->cols();
    // Zeroed image by image: still in cache for the scatter.
    std::fill(di, di + din->cols(), 0.0f);
    for (int64_t i = 0; i < dout.cols(); ++i) di[arg[i]] += d[i];
  }
}

void MaxPoolBackward(const WindowGeometry& g, const RowMatrix& dout,
                     const std::vector<int32_t>& argmax, RowMatrix* din, ThreadPool* pool) {
  const int batch = static_cast<int>(dout.rows());
  din->resize(batch, int64_t{g.in_h} * g.in_w * g.in_c);
  ParallelFor(pool, batch,
              [&](int64_t b0, int64_t b1) { MaxPoolBackwardImages(g, dout, argmax, b0, b1, din); });
}

void AvgPoolForwardImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                          RowMatrix* out) {
  const int64_t in_size = int64_t{g.in_h} * g.in_w * g.in_c;
  const int64_t out_size = g.positions() * g.in_c;
  const float scale = 1.0f / static_cast<float>(g.k * g.k);
  {
    out->middleRows(b0, b1 - b0).setZero();
    for (int64_t b = b0; b < b1; ++b) {
      const float* image = in + b * in_size;
      float* o = out->data() + b * out_size;
      for (int oy = 0; oy < g.out_h; ++oy) {
        for (int ox = 0; ox < g.out_w; ++ox) {
          float* dst = o + (int64_t{oy} * g.out_w + ox) * g.in_c;
          for (int ky = 0; ky < g.k; ++ky) {
            for (int kx = 0; kx < g.k; ++kx) {
              const float* src =
                  image + ((oy * g.stride + ky) * g.in_w + (ox * g.stride + kx)) * g.in_c;
#pragma omp simd
              for (int c = 0; c < g.in_c; ++c) dst[c] += src[c];
            }
          }
#pragma omp simd
          for (int c = 0; c < g.in_c; ++c) dst[c] *= scale;
        }
      }
    }
  }
}

void AvgPoolForward(const WindowGeometry& g, const float* in, int batch, RowMatrix* out,
                    ThreadPool* pool) {
  out->resize(batch, g.positions() * g.in_c);
  ParallelFor(pool, batch,
              [&](int64_t b0, int64_t b1) { AvgPoolForwardImages(g, in, b0, b1, out); });
}

void AvgPoolBackwardImages(const WindowGeometry& g, const RowMatrix& dout, int64_t b0, int64_t b1,
                           RowMatrix* din) {
  const float scale = 1.0f / static_cast<float>(g.k * g.k);
  for (int64_t b = b0; b < b1; ++b) {
    const float* d = dout.data() + b * dout.cols();
    float* di = din->data() + b * din->cols();
    std::fill(di, di + din->cols(), 0.0f);
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox) {
        const float* src = d + (int64_t{oy} * g.out_w + ox) * g.in_c;
        for (int ky = 0; ky < g.k; ++ky) {
          for (int kx = 0; kx < g.k; ++kx) {
            float* dst = di + ((oy * g.stride + ky) * g.in_w + (ox * g.stride + kx)) * g.in_c;
#pragma omp simd
            for (int c = 0; c < g.in_c; ++c) dst[c] += src[c] * scale;
          }
        }
      }
    }
  }
}

void AvgPoolBackward(const WindowGeometry& g, const RowMatrix& dout, RowMatrix* din,
                     ThreadPool* pool) {
  const int batch = static_cast<int>(dout.rows());
  din->resize(batch, int64_t{g.in_h} * g.in_w * g.in_c);
  ParallelFor(pool, batch,
              [&](int64_t b0, int64_t b1) { AvgPoolBackwardImages(g, dout, b0, b1, din); });
}

// ReLU as plain loops: Eigen 3.4 does not vectorise select(); these compute
// the same values (z > 0 ? z : 0, NaN and -0 give 0) in vector registers.
void ApplyActivationRows(Activation a, RowMatrix* z, int64_t r0, int64_t r1) {
  const int64_t cols = z->cols();
  switch (a) {
    case Activation::kRelu: {
      float* p = z->data() + r0 * cols;
      const int64_t n = (r1 - r0) * cols;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] > 0.0f ? p[i] : 0.0f;
      break;
    }
    case Activation::kTanh:
      z->middleRows(r0, r1 - r0) = z->middleRows(r0, r1 - r0).array().tanh();
      break;
    case Activation::kSigmoid:
      z->middleRows(r0, r1 - r0) = (1.0f + (-z->middleRows(r0, r1 - r0).array()).exp()).inverse();
      break;
    case Activation::kLinear:
      break;
  }
}

void MultiplyInPlace(RowMatrix* m, const RowMatrix& by, ThreadPool* pool) {
  if (Serial(PoolFor(pool, m->size()))) {
    m->array() *= by.array();
    return;
  }
  pool->ParallelFor(m->rows(), [&](int64_t r0, int64_t r1) {
    m->middleRows(r0, r1 - r0).array() *= by.middleRows(r0, r1 - r0).array();
  });
}

void ApplyActivation(Activation a, RowMatrix* z, ThreadPool* pool) {
  switch (a) {
    case Activation::kRelu: {
      const int64_t cols = z->cols();
      ParallelFor(PoolFor(pool, z->size()), z->rows(), [&](int64_t r0, int64_t r1) {
        float* p = z->data() + r0 * cols;
        const int64_t n = (r1 - r0) * cols;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) p[i] = p[i] > 0.0f ? p[i] : 0.0f;
      });
      break;
    }
    case Activation::kTanh:
    case Activation::kSigmoid:
      if (Serial(PoolFor(pool, z->size()))) {
        // The whole-matrix expressions, as before pools (the 1-thread bits).
        if (a == Activation::kTanh) {
          *z = z->array().tanh();
        } else {
          *z = (1.0f + (-z->array()).exp()).inverse();
        }
      } else {
        // By rows: a chunk's first and last elements may fall in Eigen's
        // scalar head/tail where the whole matrix had them in a packet
        // (exp and tanh differ there in the last bits), so this is fixed
        // bits per thread count, not the 1-thread bits.
        pool->ParallelFor(z->rows(),
                          [&](int64_t r0, int64_t r1) { ApplyActivationRows(a, z, r0, r1); });
      }
      break;
    case Activation::kLinear:
      break;
  }
}

namespace {

// dy *= act'(y) on rows [r0, r1) for tanh and sigmoid.
void SmoothGradientRows(Activation a, const RowMatrix& y, RowMatrix* dy, int64_t r0, int64_t r1) {
  const auto ys = y.middleRows(r0, r1 - r0).array();
  auto ds = dy->middleRows(r0, r1 - r0).array();
  if (a == Activation::kTanh) {
    ds *= 1.0f - ys.square();
  } else {
    ds *= ys * (1.0f - ys);
  }
}

// Pass through where the activation was positive.
void ReluGradientRows(const RowMatrix& y, RowMatrix* dy, int64_t r0, int64_t r1) {
  const int64_t cols = dy->cols();
  const float* py = y.data() + r0 * cols;
  float* pd = dy->data() + r0 * cols;
  const int64_t n = (r1 - r0) * cols;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) pd[i] = py[i] > 0.0f ? pd[i] : 0.0f;
}

}  // namespace

void ActivationGradientRows(Activation a, const RowMatrix& y, RowMatrix* dy, int64_t r0,
                            int64_t r1) {
  switch (a) {
    case Activation::kRelu:
      ReluGradientRows(y, dy, r0, r1);
      break;
    case Activation::kTanh:
    case Activation::kSigmoid:
      SmoothGradientRows(a, y, dy, r0, r1);
      break;
    case Activation::kLinear:
      break;
  }
}

void ActivationGradient(Activation a, const RowMatrix& y, RowMatrix* dy, ThreadPool* pool) {
  switch (a) {
    case Activation::kRelu:
      ParallelFor(PoolFor(pool, dy->size()), dy->rows(),
                  [&](int64_t r0, int64_t r1) { ReluGradientRows(y, dy, r0, r1); });
      break;
    case Activation::kTanh:
    case Activation::kSigmoid:
      if (Serial(PoolFor(pool, dy->size()))) {
        if (a == Activation::kTanh) {
          dy->array() *= 1.0f - y.array().square();
        } else {
          dy->array() *= y.array() * (1.0f - y.array());
        }
      } else {
        // By rows; a packet and the scalar code may round 1 - y*y apart
        // (the compiler may fuse the scalar one into an FMA), hence fixed
        // bits per thread count, as ApplyActivation.
        pool->ParallelFor(dy->rows(),
                          [&](int64_t r0, int64_t r1) { SmoothGradientRows(a, y, dy, r0, r1); });
      }
      break;
    case Activation::kLinear:
      break;
  }
}

}  // namespace kubetrain
