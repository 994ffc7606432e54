// The layers a kubetrain model is built from (spec.training.model.layers),
// their shape inference, and the kernels that compute them.
//
// An activation is a row-major float matrix of `batch` rows; each row holds
// one example's features in the order of its shape: [d] is a vector, and
// [h, w, c] an image stored height-major with channels fastest (HWC), so a
// flatten is free and a 28x28 IDX image is already [28, 28, 1].
//
// Convolutions are im2col + one Eigen GEMM over the whole batch: the
// patches of every output position form the rows of a (batch*oh*ow) x
// (k*k*c) matrix, and the kernel variable is stored as [k*k*c, filters]
// (rows = patch features, so a split by rows across PS tasks is a contiguous
// slice, as for dense kernels).
//
// Everything here is stateless and thread-compatible. The kernels that take
// a ThreadPool (core/thread_pool.h) split their work into chunks that are a
// function of the sizes and the thread count only: by OUTPUT elements
// (images of the batch, rows or columns of a GEMM's result), each computed
// whole by one thread, except conv2d's weight and bias gradients
// (ConvBackward: one sum per chunk of images, the chunks' sums added in
// chunk order). Either way, with a fixed thread count the bits are the same
// on every run. A null pool or one thread runs the single-threaded code as
// it was; more threads may differ from it in the last bits (Eigen blocks a
// GEMM by its sizes, chunks are smaller, and sums are split).
#ifndef KUBETRAIN_CORE_LAYERS_H_
#define KUBETRAIN_CORE_LAYERS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// GCC 12.2 (GCC bug 105593) reports false "__Y is used uninitialized"
// warnings inside its own AVX-512 intrinsics whenever Eigen vectorizes with
// -march=native; they are noise, not bugs here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <eigen3/Eigen/Dense>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "absl/status/statusor.h"
#include "core/thread_pool.h"

namespace kubetrain {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Activation { kLinear, kRelu, kTanh, kSigmoid };
enum class LayerType { kDense, kConv2D, kMaxPool2D, kAvgPool2D, kFlatten, kDropout };
// The loss on the last layer's output: softmax cross-entropy over classes,
// sigmoid cross-entropy for binary (0/1) labels, or mean squared error;
// wideAndDeep: sigmoid cross-entropy of the deep tower's logit plus the wide
// (linear, sparse) part's logit (core/model.h).
enum class HeadType { kSoftmax, kSigmoid, kMeanSquaredError, kWideAndDeep };

struct LayerSpec {
  LayerType type = LayerType::kDense;
  int units = 0;                                // dense
  int filters = 0;                              // conv2d
  int kernel = 0;                               // conv2d: kernel side; pools: window side
  int stride = 1;                               // conv2d, pools
  bool same_padding = false;                    // conv2d
  Activation activation = Activation::kLinear;  // dense, conv2d
  double rate = 0;                              // dropout: fraction of units zeroed
  bool operator==(const LayerSpec& o) const {
    return type == o.type && units == o.units && filters == o.filters && kernel == o.kernel &&
           stride == o.stride && same_padding == o.same_padding && activation == o.activation &&
           rate == o.rate;
  }
};

// [d] or [h, w, c].
using Shape = std::vector<int>;
std::string ShapeString(const Shape& shape);  // "[28, 28, 1]"
int64_t NumElements(const Shape& shape);

const char* ActivationName(Activation a);
const char* LayerTypeName(LayerType t);
const char* HeadTypeName(HeadType h);
std::optional<Activation> ActivationFromName(const std::string& name);
std::optional<LayerType> LayerTypeFromName(const std::string& name);
std::optional<HeadType> HeadTypeFromName(const std::string& name);

// Whether the layer owns a kernel and a bias variable.
inline bool HasVariables(LayerType t) { return t == LayerType::kDense || t == LayerType::kConv2D; }

// The output shape of `layer` on `input`, or InvalidArgumentError saying
// what is wrong without a path ("conv2d needs a 3-D input, got [128]");
// callers prefix the layer's field path.
absl::StatusOr<Shape> OutputShape(const LayerSpec& layer, const Shape& input);

// Geometry of a conv2d or pooling window over an [h, w, c] input. "same"
// gives an output side of ceil(side / stride) and pads
// max((out-1)*stride + k - side, 0) zeros, half before (rounded down) and
// the rest after, as TensorFlow does; "valid" pads nothing, output side
// (side - k) / stride + 1.
struct WindowGeometry {
  int in_h = 0, in_w = 0, in_c = 0;
  int k = 0, stride = 1, pad_top = 0, pad_left = 0;
  int out_h = 0, out_w = 0;
  int64_t patch_size() const { return int64_t{k} * k * in_c; }
  int64_t positions() const { return int64_t{out_h} * out_w; }
};
WindowGeometry MakeWindowGeometry(const LayerSpec& layer, const Shape& input);

// col (batch*out_h*out_w) x (k*k*in_c) <- patches of `in` (batch x h*w*c);
// padding reads as zero.
// Split by image.
void Im2Col(const WindowGeometry& g, const float* in, int batch, RowMatrix* col,
            ThreadPool* pool = nullptr);
// in_grad (batch x h*w*c) += the patch gradients in `col` put back in place.
// Split by image (an image's patches only touch its own slice of in_grad).
void Col2ImAdd(const WindowGeometry& g, const RowMatrix& col, int batch, float* in_grad,
               ThreadPool* pool = nullptr);

// out (batch x out_h*out_w*filters) = im2col(in) * kernel + bias, before the
// activation; `col` keeps the patches for the backward pass. Split by image
// (rows of col and out).
void ConvForward(const WindowGeometry& g, const float* in, int batch, const float* kernel,
                 const float* bias, int filters, RowMatrix* col, RowMatrix* out,
                 ThreadPool* pool = nullptr);
// From dout (batch x out_h*out_w*filters, after the activation's gradient):
// dkernel = col^T dout, dbias = column sums, and, if din is not null,
// din (batch x h*w*c) = col2im(dout kernel^T). Split by images: each chunk
// sums dkernel and dbias over its own images, and the chunks' sums are
// added in chunk order after (ConvGradientSums: fixed bits per thread
// count, within float rounding of one thread; a null pool or one thread is
// the whole-batch code as before pools); din is per image.
void ConvBackward(const WindowGeometry& g, const RowMatrix& col, const RowMatrix& dout,
                  const float* kernel, int filters, int batch, float* dkernel, float* dbias,
                  RowMatrix* din, ThreadPool* pool = nullptr);

// Max/average pooling over each channel (windows wholly inside the input:
// padding is always "valid"). Max pooling records the flat input index of
// each output's maximum in `argmax` for the backward pass. Split by image;
// the same bits with any pool.
void MaxPoolForward(const WindowGeometry& g, const float* in, int batch, RowMatrix* out,
                    std::vector<int32_t>* argmax, ThreadPool* pool = nullptr);
void MaxPoolBackward(const WindowGeometry& g, const RowMatrix& dout,
                     const std::vector<int32_t>& argmax, RowMatrix* din,
                     ThreadPool* pool = nullptr);
void AvgPoolForward(const WindowGeometry& g, const float* in, int batch, RowMatrix* out,
                    ThreadPool* pool = nullptr);
void AvgPoolBackward(const WindowGeometry& g, const RowMatrix& dout, RowMatrix* din,
                     ThreadPool* pool = nullptr);

// The forward kernels on images [b0, b1) of the batch only, into outputs
// already sized for the whole batch (col, out, argmax as the kernels above
// size them): what one chunk of a split computes, so that a caller can run
// several layers per chunk in one ParallelFor (core/model.cc). The
// activation on rows [r0, r1) of z likewise.
void ConvForwardImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                       const float* kernel, const float* bias, int filters, RowMatrix* col,
                       RowMatrix* out);
void MaxPoolForwardImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                          RowMatrix* out, std::vector<int32_t>* argmax);
void AvgPoolForwardImages(const WindowGeometry& g, const float* in, int64_t b0, int64_t b1,
                          RowMatrix* out);
void ApplyActivationRows(Activation a, RowMatrix* z, int64_t r0, int64_t r1);
// The backward kernels on images [b0, b1) (rows for the activation), into
// outputs already sized for the batch; MaxPool/AvgPoolBackwardImages write
// the same bits as the whole-batch kernels.
void MaxPoolBackwardImages(const WindowGeometry& g, const RowMatrix& dout,
                           const std::vector<int32_t>& argmax, int64_t b0, int64_t b1,
                           RowMatrix* din);
void AvgPoolBackwardImages(const WindowGeometry& g, const RowMatrix& dout, int64_t b0, int64_t b1,
                           RowMatrix* din);
// dy *= act'(y) on rows [r0, r1): ReLU exactly as ActivationGradient; tanh
// and sigmoid as its split by rows (fixed bits for fixed rows).
void ActivationGradientRows(Activation a, const RowMatrix& y, RowMatrix* dy, int64_t r0,
                            int64_t r1);
// ConvBackward's work for images [b0, b1) of the batch: dkernel and dbias
// (patch_size x filters, and filters) = the sums over those images' rows
// only, and, if din is not null, their rows of din (sized for the batch).
void ConvBackwardImages(const WindowGeometry& g, const RowMatrix& col, const RowMatrix& dout,
                        const float* kernel, int filters, int64_t b0, int64_t b1, float* dkernel,
                        float* dbias, RowMatrix* din);

// Where the chunks of a conv2d backward split by images sum their weight
// and bias gradients: chunk 0 straight into dkernel and dbias, the others
// into buffers of their own; AddUp() then adds chunks 1, 2, ... into chunk
// 0's sums in that order, so a fixed chunking gives fixed bits.
class ConvGradientSums {
 public:
  ConvGradientSums(const WindowGeometry& g, int filters, int chunks, float* dkernel, float* dbias);
  float* dkernel(int chunk);  // patch_size x filters
  float* dbias(int chunk);    // filters
  void AddUp();

 private:
  int64_t kernel_size_;
  int filters_, chunks_;
  float *dkernel_, *dbias_;
  std::vector<float> parts_;
};

// Whether `pool` computes on one thread (null or threads() == 1): then the
// kernels run their single-threaded code, bit for bit as before pools.
inline bool Serial(const ThreadPool* pool) { return pool == nullptr || pool->threads() == 1; }

// Below this many multiply-adds a product stays on the caller's thread:
// handing half of it to another thread costs more than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 21;

// dst = lhs * rhs (Eigen expressions; dst a matrix or map already sized),
// split by the rows of dst if it has at least as many rows as columns, else
// by its columns: a thread computes whole elements, each from the whole
// reduction, so a fixed thread count gives fixed bits. Along the longer
// side because each thread packs all of the other operand (a 64-example
// batch split by rows would pack a whole dense kernel on every thread).
// A null pool, one thread or a product of fewer than kMinParallelMacs
// multiply-adds: the single-threaded expression (the 1-thread bits).
template <typename Dst, typename Lhs, typename Rhs>
void SplitProduct(ThreadPool* pool, Dst&& dst, const Lhs& lhs, const Rhs& rhs) {
  if (Serial(pool) || dst.rows() * dst.cols() * lhs.cols() < kMinParallelMacs) {
    dst.noalias() = lhs * rhs;
    return;
  }
  if (dst.rows() >= dst.cols()) {
    pool->ParallelFor(dst.rows(), [&](int64_t begin, int64_t end) {
      dst.middleRows(begin, end - begin).noalias() = lhs.middleRows(begin, end - begin) * rhs;
    });
  } else {
    pool->ParallelFor(dst.cols(), [&](int64_t begin, int64_t end) {
      dst.middleCols(begin, end - begin).noalias() = lhs * rhs.middleCols(begin, end - begin);
    });
  }
}

// out[j] = the sum of column j of the row-major rows x cols matrix `m`,
// added row by row in order. Eigen's colwise().sum() into a Map adds the
// columns it vectorises in a different order from the scalar ones, and which
// are which depends on where `out` happens to lie in memory, so the same
// inputs could give different bits from run to run; here they cannot.
// With a pool, split by columns: each column is still summed in row order,
// so the bits are the same with any pool.
void ColumnSums(const float* m, int64_t rows, int64_t cols, float* out, ThreadPool* pool = nullptr);

// m *= by element-wise (the same shape), split by rows across the pool: one
// rounded product per element, vectorised or not, so the same bits with any
// pool. (The dropout mask, core/model.cc.)
void MultiplyInPlace(RowMatrix* m, const RowMatrix& by, ThreadPool* pool = nullptr);

// y = act(z) in place; and dz = dy * act'(z) from the activation's output y.
// All split by rows across the pool (below 2^15 elements: on the caller's
// thread, as with no pool). What is guaranteed:
//  - ReLU: an exact select, the same bits with any pool.
//  - tanh and sigmoid, forward and gradient: a null pool, one thread or a
//    small matrix runs the whole-matrix Eigen expression as before pools
//    (the same bits as ever). With N > 1 threads, the same bits on every run
//    with N (the chunks are a function of rows and N; Eigen allocates
//    matrices aligned, so where its packets start within a chunk is fixed
//    too), and within float rounding of one thread (not the same bits:
//    Eigen's vectorised tanh/exp and its scalar code for a chunk's
//    unaligned head and tail may differ in the last bits). In a conv run
//    fused per chunk (core/model.cc), ApplyActivationRows runs them on the
//    chunk's rows: fixed bits per thread count likewise.
void ApplyActivation(Activation a, RowMatrix* z, ThreadPool* pool = nullptr);
void ActivationGradient(Activation a, const RowMatrix& y, RowMatrix* dy,
                        ThreadPool* pool = nullptr);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_LAYERS_H_
