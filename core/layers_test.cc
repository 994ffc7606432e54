#include "core/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kubetrain {
namespace {

LayerSpec Conv(int filters, int kernel, int stride, bool same) {
  LayerSpec l;
  l.type = LayerType::kConv2D;
  l.filters = filters;
  l.kernel = kernel;
  l.stride = stride;
  l.same_padding = same;
  return l;
}

// Direct convolution, HWC, kernel [ky][kx][c][f], the definition im2col
// must reproduce.
std::vector<float> NaiveConv(const WindowGeometry& g, const std::vector<float>& in, int batch,
                             const std::vector<float>& kernel, const std::vector<float>& bias,
                             int filters) {
  std::vector<float> out(static_cast<size_t>(batch) * g.out_h * g.out_w * filters);
  for (int b = 0; b < batch; ++b) {
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox) {
        for (int f = 0; f < filters; ++f) {
          double acc = bias[f];
          for (int ky = 0; ky < g.k; ++ky) {
            for (int kx = 0; kx < g.k; ++kx) {
              const int iy = oy * g.stride - g.pad_top + ky;
              const int ix = ox * g.stride - g.pad_left + kx;
              if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) continue;
              for (int c = 0; c < g.in_c; ++c) {
                acc += in[((static_cast<size_t>(b) * g.in_h + iy) * g.in_w + ix) * g.in_c + c] *
                       kernel[((ky * g.k + kx) * g.in_c + c) * filters + f];
              }
            }
          }
          out[((static_cast<size_t>(b) * g.out_h + oy) * g.out_w + ox) * filters + f] =
              static_cast<float>(acc);
        }
      }
    }
  }
  return out;
}

TEST(LayersTest, OutputShapes) {
  EXPECT_EQ(*OutputShape(Conv(8, 3, 1, true), {28, 28, 1}), (Shape{28, 28, 8}));
  EXPECT_EQ(*OutputShape(Conv(8, 3, 1, false), {28, 28, 1}), (Shape{26, 26, 8}));
  EXPECT_EQ(*OutputShape(Conv(4, 3, 2, true), {7, 5, 2}), (Shape{4, 3, 4}));
  EXPECT_EQ(*OutputShape(Conv(4, 3, 2, false), {7, 6, 2}), (Shape{3, 2, 4}));
  LayerSpec pool;
  pool.type = LayerType::kMaxPool2D;
  pool.kernel = 2;
  pool.stride = 2;
  EXPECT_EQ(*OutputShape(pool, {7, 5, 3}), (Shape{3, 2, 3}));  // valid: remainder dropped
  LayerSpec flatten;
  flatten.type = LayerType::kFlatten;
  EXPECT_EQ(*OutputShape(flatten, {3, 2, 3}), (Shape{18}));
  EXPECT_EQ(OutputShape(Conv(4, 3, 1, true), {128}).status().message(),
            "conv2d needs a 3-D input, got [128]");
  EXPECT_EQ(OutputShape(Conv(4, 9, 1, false), {8, 8, 1}).status().message(),
            "conv2d window 9x9 is larger than its input [8, 8, 1] (padding valid)");
  EXPECT_TRUE(OutputShape(Conv(4, 9, 1, true), {8, 8, 1}).ok());  // same padding allows it
}

TEST(LayersTest, SamePaddingFollowsTensorFlow) {
  // 5 wide, k 3, stride 2: out 3, pad total (3-1)*2+3-5 = 2 -> 1 before.
  WindowGeometry g = MakeWindowGeometry(Conv(1, 3, 2, true), {5, 5, 1});
  EXPECT_EQ(g.out_h, 3);
  EXPECT_EQ(g.pad_top, 1);
  // 6 wide, k 3, stride 2: out 3, pad total 1 -> 0 before, 1 after.
  g = MakeWindowGeometry(Conv(1, 3, 2, true), {6, 6, 1});
  EXPECT_EQ(g.out_w, 3);
  EXPECT_EQ(g.pad_left, 0);
}

TEST(LayersTest, Im2ColConvMatchesDirectConvolution) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [shape, layer] :
       std::vector<std::pair<Shape, LayerSpec>>{{{7, 5, 3}, Conv(4, 3, 1, true)},
                                                {{7, 5, 3}, Conv(4, 3, 2, true)},
                                                {{9, 6, 2}, Conv(3, 3, 2, false)},
                                                {{6, 6, 1}, Conv(2, 4, 1, true)},
                                                {{5, 8, 2}, Conv(5, 1, 1, false)}}) {
    WindowGeometry g = MakeWindowGeometry(layer, shape);
    const int batch = 3;
    std::vector<float> in(static_cast<size_t>(batch) * NumElements(shape));
    std::vector<float> kernel(g.patch_size() * layer.filters), bias(layer.filters);
    for (float& f : in) f = normal(rng);
    for (float& f : kernel) f = normal(rng);
    for (float& f : bias) f = normal(rng);
    RowMatrix col, out;
    ConvForward(g, in.data(), batch, kernel.data(), bias.data(), layer.filters, &col, &out);
    std::vector<float> want = NaiveConv(g, in, batch, kernel, bias, layer.filters);
    ASSERT_EQ(static_cast<size_t>(out.size()), want.size()) << ShapeString(shape);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(out.data()[i], want[i], 1e-4)
          << ShapeString(shape) << " k" << layer.kernel << " s" << layer.stride << " at " << i;
    }
  }
}

TEST(LayersTest, Col2ImIsTheAdjointOfIm2Col) {
  // <im2col(x), c> == <x, col2im(c)> for all x, c: the backward pass
  // routes every patch gradient to the input it came from.
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  WindowGeometry g = MakeWindowGeometry(Conv(1, 3, 2, true), {7, 6, 2});
  const int batch = 2;
  std::vector<float> x(static_cast<size_t>(batch) * 7 * 6 * 2);
  for (float& f : x) f = normal(rng);
  RowMatrix col;
  Im2Col(g, x.data(), batch, &col);
  RowMatrix c(col.rows(), col.cols());
  for (int64_t i = 0; i < c.size(); ++i) c.data()[i] = normal(rng);
  std::vector<float> back(x.size(), 0.0f);
  Col2ImAdd(g, c, batch, back.data());
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < c.size(); ++i) lhs += double{col.data()[i]} * c.data()[i];
  for (size_t i = 0; i < x.size(); ++i) rhs += double{x[i]} * back[i];
  EXPECT_NEAR(lhs, rhs, 1e-3 * std::fabs(lhs) + 1e-3);
}

// Every column summed in row order, bit for bit, at every alignment of the
// input and the output (so a rerun gives the same bits wherever the buffers are).
TEST(LayersTest, ColumnSumsAddRowsInOrderAtAnyAlignment) {
  const int rows = 37, cols = 261;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  std::vector<float> m(rows * cols);
  for (float& f : m) f = u(rng);
  std::vector<float> want(cols);
  for (int j = 0; j < cols; ++j) {
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += m[r * cols + j];
    want[j] = sum;
  }
  for (int in_shift = 0; in_shift < 16; ++in_shift) {
    std::vector<float> in(m.size() + in_shift);
    std::copy(m.begin(), m.end(), in.begin() + in_shift);
    for (int out_shift = 0; out_shift < 16; ++out_shift) {
      std::vector<float> out(cols + out_shift, -1.0f);
      ColumnSums(in.data() + in_shift, rows, cols, out.data() + out_shift);
      for (int j = 0; j < cols; ++j) {
        ASSERT_EQ(out[out_shift + j], want[j])
            << "column " << j << " input shift " << in_shift << " output shift " << out_shift;
      }
    }
  }
}

TEST(LayersTest, PoolingValues) {
  LayerSpec pool;
  pool.type = LayerType::kMaxPool2D;
  pool.kernel = 2;
  pool.stride = 2;
  WindowGeometry g = MakeWindowGeometry(pool, {3, 4, 1});  // 1x2 output, last row dropped
  std::vector<float> in = {1, 5, 2, 0,                     //
                           3, 4, 7, 8,                     //
                           9, 9, 9, 9};
  RowMatrix out;
  std::vector<int32_t> argmax;
  MaxPoolForward(g, in.data(), 1, &out, &argmax);
  ASSERT_EQ(out.cols(), 2);
  EXPECT_EQ(out(0, 0), 5);
  EXPECT_EQ(out(0, 1), 8);
  EXPECT_EQ(argmax, (std::vector<int32_t>{1, 7}));
  RowMatrix dout(1, 2), din;
  dout << 10, 20;
  MaxPoolBackward(g, dout, argmax, &din);
  EXPECT_EQ(din(0, 1), 10);
  EXPECT_EQ(din(0, 7), 20);
  EXPECT_EQ(din.sum(), 30);
  AvgPoolForward(g, in.data(), 1, &out);
  EXPECT_FLOAT_EQ(out(0, 0), 13.0f / 4);
  EXPECT_FLOAT_EQ(out(0, 1), 17.0f / 4);
}

// Average pooling's gradient, vectorised, is the scalar loop it was, bit
// for bit (one multiply and one add per element, whichever unit runs them).
TEST(LayersTest, AvgPoolBackwardIsTheScalarLoop) {
  LayerSpec p;
  p.type = LayerType::kAvgPool2D;
  p.kernel = 3;
  p.stride = 2;
  const WindowGeometry g = MakeWindowGeometry(p, {9, 9, 19});
  std::mt19937_64 rng(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int batch = 3;
  RowMatrix dout(batch, g.positions() * g.in_c);
  for (int64_t i = 0; i < dout.size(); ++i) dout.data()[i] = n(rng);
  RowMatrix want = RowMatrix::Zero(batch, 9 * 9 * 19), got;
  const float scale = 1.0f / static_cast<float>(g.k * g.k);
  for (int b = 0; b < batch; ++b) {
    for (int oy = 0; oy < g.out_h; ++oy) {
      for (int ox = 0; ox < g.out_w; ++ox) {
        for (int ky = 0; ky < g.k; ++ky) {
          for (int kx = 0; kx < g.k; ++kx) {
            for (int c = 0; c < g.in_c; ++c) {
              want(b, ((oy * g.stride + ky) * g.in_w + (ox * g.stride + kx)) * g.in_c + c) +=
                  dout(b, (oy * g.out_w + ox) * g.in_c + c) * scale;
            }
          }
        }
      }
    }
  }
  AvgPoolBackward(g, dout, &got);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * want.size()), 0);
}

// The element-wise kernels give the same bits with any pool (each output
// computed as without one); the conv GEMMs, split by output rows, the same
// bits on every run with a pool of a given size, within rounding of none.
TEST(LayersTest, KernelsOnAPool) {
  std::mt19937_64 rng(4);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto random = [&](int64_t rows, int64_t cols) {
    RowMatrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = n(rng);
    return m;
  };
  auto same = [](const RowMatrix& a, const RowMatrix& b) {
    return a.rows() == b.rows() && a.cols() == b.cols() &&
           std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
  };
  const int batch = 7;
  const Shape in_shape = {9, 8, 3};
  const RowMatrix in = random(batch, NumElements(in_shape));
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    // Pools (2x2 and 3x3 stride 2 windows) and ReLU: identical.
    for (int k : {2, 3}) {
      LayerSpec p;
      p.type = LayerType::kMaxPool2D;
      p.kernel = k;
      p.stride = 2;
      const WindowGeometry g = MakeWindowGeometry(p, in_shape);
      RowMatrix out0, out1, din0, din1;
      std::vector<int32_t> arg0, arg1;
      MaxPoolForward(g, in.data(), batch, &out0, &arg0);
      MaxPoolForward(g, in.data(), batch, &out1, &arg1, &pool);
      EXPECT_TRUE(same(out0, out1));
      EXPECT_EQ(arg0, arg1);
      const RowMatrix dout = random(batch, out0.cols());
      MaxPoolBackward(g, dout, arg0, &din0);
      MaxPoolBackward(g, dout, arg1, &din1, &pool);
      EXPECT_TRUE(same(din0, din1));
      AvgPoolForward(g, in.data(), batch, &out0);
      AvgPoolForward(g, in.data(), batch, &out1, &pool);
      EXPECT_TRUE(same(out0, out1));
      AvgPoolBackward(g, dout, &din0);
      AvgPoolBackward(g, dout, &din1, &pool);
      EXPECT_TRUE(same(din0, din1));
    }
    RowMatrix big = random(300, 211), relu0 = big, relu1 = big;
    ApplyActivation(Activation::kRelu, &relu0);
    ApplyActivation(Activation::kRelu, &relu1, &pool);
    EXPECT_TRUE(same(relu0, relu1));
    RowMatrix g0 = big, g1 = big;
    ActivationGradient(Activation::kRelu, relu0, &g0);
    ActivationGradient(Activation::kRelu, relu0, &g1, &pool);
    EXPECT_TRUE(same(g0, g1));
    RowMatrix m0 = big, m1 = big;
    MultiplyInPlace(&m0, g0);
    MultiplyInPlace(&m1, g0, &pool);
    EXPECT_TRUE(same(m0, m1));
    RowMatrix m2 = big;
    m2.array() *= g0.array();  // the code before pools
    EXPECT_TRUE(same(m0, m2));
    std::vector<float> sums0(211), sums1(211);
    ColumnSums(big.data(), big.rows(), big.cols(), sums0.data());
    ColumnSums(big.data(), big.rows(), big.cols(), sums1.data(), &pool);
    EXPECT_EQ(sums0, sums1);

    // conv2d forward and backward.
    for (bool pad : {true, false}) {
      const WindowGeometry g = MakeWindowGeometry(Conv(5, 3, 1, pad), in_shape);
      const RowMatrix kernel = random(g.patch_size(), 5), bias = random(1, 5);
      RowMatrix col0, out0, din0;
      ConvForward(g, in.data(), batch, kernel.data(), bias.data(), 5, &col0, &out0);
      const RowMatrix dout = random(batch, out0.cols());
      std::vector<float> dk0(kernel.size()), db0(5);
      ConvBackward(g, col0, dout, kernel.data(), 5, batch, dk0.data(), db0.data(), &din0);
      // No pool and one thread: the whole-batch code before pools, written out.
      const Eigen::Map<const RowMatrix> dz(dout.data(), col0.rows(), 5);
      const RowMatrix want_dk = col0.transpose() * dz;
      RowMatrix want_din = RowMatrix::Zero(batch, in.cols());
      Col2ImAdd(g, dz * kernel.transpose(), batch, want_din.data());
      std::vector<float> want_db(5);
      ColumnSums(dz.data(), dz.rows(), 5, want_db.data());
      EXPECT_TRUE(same(Eigen::Map<RowMatrix>(dk0.data(), g.patch_size(), 5), want_dk));
      EXPECT_EQ(db0, want_db);
      EXPECT_TRUE(same(din0, want_din));
      {
        ThreadPool one(1);
        RowMatrix din;
        std::vector<float> dk(kernel.size()), db(5);
        ConvBackward(g, col0, dout, kernel.data(), 5, batch, dk.data(), db.data(), &din, &one);
        EXPECT_EQ(dk, dk0);
        EXPECT_EQ(db, db0);
        EXPECT_TRUE(same(din, din0));
      }
      // N threads: dbias is each chunk's images summed in row order, the
      // chunks' sums added in chunk order.
      const int chunks = std::min(batch, threads);
      std::vector<float> want_db_n(5, 0.0f);
      for (int c = 0; c < chunks; ++c) {
        const int64_t r0 = int64_t{batch} * c / chunks * g.positions();
        const int64_t r1 = int64_t{batch} * (c + 1) / chunks * g.positions();
        for (int f = 0; f < 5; ++f) {
          float sum = 0.0f;
          for (int64_t r = r0; r < r1; ++r) sum += dz(r, f);
          want_db_n[f] = c == 0 ? sum : want_db_n[f] + sum;
        }
      }
      RowMatrix first_out, first_din;
      std::vector<float> first_dk;
      for (int rep = 0; rep < 3; ++rep) {
        RowMatrix col1, out1, din1;
        ConvForward(g, in.data(), batch, kernel.data(), bias.data(), 5, &col1, &out1, &pool);
        EXPECT_TRUE(same(col0, col1));  // im2col: copies
        std::vector<float> dk1(kernel.size()), db1(5);
        ConvBackward(g, col1, dout, kernel.data(), 5, batch, dk1.data(), db1.data(), &din1, &pool);
        EXPECT_EQ(db1, want_db_n);
        if (rep == 0) {
          first_out = out1;
          first_din = din1;
          first_dk = dk1;
          EXPECT_LE((out1 - out0).cwiseAbs().maxCoeff(), 1e-5f * out0.cwiseAbs().maxCoeff());
          EXPECT_LE((din1 - din0).cwiseAbs().maxCoeff(), 1e-5f * din0.cwiseAbs().maxCoeff());
          for (size_t i = 0; i < dk0.size(); ++i) EXPECT_NEAR(dk1[i], dk0[i], 1e-4f);
          for (int f = 0; f < 5; ++f) EXPECT_NEAR(db1[f], db0[f], 1e-4f);
        } else {
          EXPECT_TRUE(same(out1, first_out));
          EXPECT_TRUE(same(din1, first_din));
          EXPECT_EQ(dk1, first_dk);
        }
        // Without din (a first layer): the same kernel gradients.
        std::vector<float> dk2(kernel.size()), db2(5);
        ConvBackward(g, col1, dout, kernel.data(), 5, batch, dk2.data(), db2.data(), nullptr,
                     &pool);
        EXPECT_EQ(dk2, first_dk);
        EXPECT_EQ(db2, want_db_n);
      }
    }
  }
}

// Enough images per chunk that ConvBackward's input gradients go a few
// images at a time: the same bits on every run, close to one thread.
TEST(LayersTest, ConvBackwardInBlocksOfImages) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto random = [&](int64_t rows, int64_t cols) {
    RowMatrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = n(rng);
    return m;
  };
  const int batch = 13, filters = 6;
  const Shape in_shape = {28, 28, 8};
  const WindowGeometry g = MakeWindowGeometry(Conv(filters, 3, 1, true), in_shape);
  ASSERT_LT((int64_t{1} << 18) / (g.positions() * g.patch_size()), batch / 2);
  const RowMatrix in = random(batch, NumElements(in_shape));
  const RowMatrix kernel = random(g.patch_size(), filters), bias = random(1, filters);
  RowMatrix col, out, din0;
  ConvForward(g, in.data(), batch, kernel.data(), bias.data(), filters, &col, &out);
  const RowMatrix dout = random(batch, out.cols());
  std::vector<float> dk0(kernel.size()), db0(filters);
  ConvBackward(g, col, dout, kernel.data(), filters, batch, dk0.data(), db0.data(), &din0);
  for (int threads : {2, 3}) {
    RowMatrix first;
    for (int rep = 0; rep < 3; ++rep) {
      ThreadPool pool(threads);
      RowMatrix din;
      std::vector<float> dk(kernel.size()), db(filters);
      ConvBackward(g, col, dout, kernel.data(), filters, batch, dk.data(), db.data(), &din, &pool);
      if (rep == 0) {
        first = din;
        EXPECT_LE((din - din0).cwiseAbs().maxCoeff(), 1e-5f * din0.cwiseAbs().maxCoeff());
      } else {
        ASSERT_EQ(din.size(), first.size());
        EXPECT_EQ(std::memcmp(din.data(), first.data(), 4 * din.size()), 0) << threads;
      }
    }
  }
}

// SplitProduct: by rows of the result when it has at least as many rows as
// columns, else by columns; fixed bits per thread count, within float
// rounding of one thread; one thread or a small product is the plain
// expression, bit for bit.
TEST(LayersTest, SplitProductOnAPool) {
  std::mt19937_64 rng(6);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto random = [&](int64_t rows, int64_t cols) {
    RowMatrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = n(rng);
    return m;
  };
  auto same = [](const RowMatrix& a, const RowMatrix& b) {
    return a.rows() == b.rows() && a.cols() == b.cols() &&
           std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
  };
  // A batch of 64 through a wide layer (split by columns), its transpose
  // (by rows), and a product below kMinParallelMacs.
  struct Case {
    int64_t m, k, n;
  };
  for (const Case& c : {Case{64, 784, 512}, Case{1000, 300, 64}, Case{64, 256, 10}}) {
    const RowMatrix a = random(c.m, c.k), b = random(c.k, c.n);
    const RowMatrix want = a * b;  // the code before pools
    const bool small = c.m * c.k * c.n < kMinParallelMacs;
    for (int threads : {1, 2, 3}) {
      RowMatrix first;
      for (int rep = 0; rep < 3; ++rep) {
        ThreadPool pool(threads);  // a new pool each time
        RowMatrix got(c.m, c.n);
        SplitProduct(&pool, got, a, b);
        if (threads == 1 || small) {
          EXPECT_TRUE(same(got, want)) << c.m << "x" << c.n << " threads " << threads;
        } else if (rep == 0) {
          first = got;
          EXPECT_LE((got - want).cwiseAbs().maxCoeff(), 1e-4f * want.cwiseAbs().maxCoeff());
        } else {
          EXPECT_TRUE(same(got, first)) << c.m << "x" << c.n << " threads " << threads;
        }
      }
    }
    RowMatrix none(c.m, c.n);
    SplitProduct(nullptr, none, a, b);
    EXPECT_TRUE(same(none, want));
    // Through a transpose, as a dense layer's input gradient computes.
    const RowMatrix bt = b.transpose();
    ThreadPool pool(2);
    RowMatrix got(c.m, c.n), again(c.m, c.n);
    SplitProduct(&pool, got, a, bt.transpose());
    SplitProduct(&pool, again, a, bt.transpose());
    EXPECT_TRUE(same(got, again));
    EXPECT_LE((got - want).cwiseAbs().maxCoeff(), 1e-4f * want.cwiseAbs().maxCoeff());
  }
}

// tanh and sigmoid: with no pool, one thread or a small matrix, the
// whole-matrix Eigen expressions they always were (bit for bit); with N > 1
// threads, the same bits on every run and with every pool of N, within float
// rounding of one thread (core/layers.h).
TEST(LayersTest, SmoothActivationsOnAPool) {
  std::mt19937_64 rng(8);
  std::normal_distribution<float> n(0.0f, 2.0f);
  auto same = [](const RowMatrix& a, const RowMatrix& b) {
    return a.rows() == b.rows() && a.cols() == b.cols() &&
           std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
  };
  // 211 columns: rows start at every offset from a packet boundary.
  for (int64_t rows : {300, 5}) {
    RowMatrix z(rows, 211), dy(rows, 211);
    for (int64_t i = 0; i < z.size(); ++i) z.data()[i] = n(rng);
    for (int64_t i = 0; i < dy.size(); ++i) dy.data()[i] = n(rng);
    for (Activation a : {Activation::kTanh, Activation::kSigmoid}) {
      // The code before pools, written out.
      RowMatrix want_y = z, want_d = dy;
      if (a == Activation::kTanh) {
        want_y = z.array().tanh();
        want_d.array() *= 1.0f - want_y.array().square();
      } else {
        want_y = (1.0f + (-z.array()).exp()).inverse();
        want_d.array() *= want_y.array() * (1.0f - want_y.array());
      }
      RowMatrix y = z, d = dy;
      ApplyActivation(a, &y);
      ActivationGradient(a, want_y, &d);
      EXPECT_TRUE(same(y, want_y)) << ActivationName(a);
      EXPECT_TRUE(same(d, want_d)) << ActivationName(a);
      for (int threads : {1, 2, 3}) {
        RowMatrix first_y, first_d;
        for (int rep = 0; rep < 3; ++rep) {
          ThreadPool pool(threads);  // a new pool each time
          for (int call = 0; call < 2; ++call) {
            y = z;
            d = dy;
            ApplyActivation(a, &y, &pool);
            ActivationGradient(a, want_y, &d, &pool);
            if (threads == 1 || rows == 5) {
              EXPECT_TRUE(same(y, want_y)) << ActivationName(a) << " " << threads;
              EXPECT_TRUE(same(d, want_d)) << ActivationName(a) << " " << threads;
            } else if (first_y.size() == 0) {
              first_y = y;
              first_d = d;
              EXPECT_LE((y - want_y).cwiseAbs().maxCoeff(), 1e-6f) << ActivationName(a);
              EXPECT_LE((d - want_d).cwiseAbs().maxCoeff(), 1e-5f * want_d.cwiseAbs().maxCoeff())
                  << ActivationName(a);
            } else {
              EXPECT_TRUE(same(y, first_y)) << ActivationName(a) << " " << threads;
              EXPECT_TRUE(same(d, first_d)) << ActivationName(a) << " " << threads;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kubetrain
