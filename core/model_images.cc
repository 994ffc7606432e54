// Model's image-by-image layers (conv2d, pools) on a pool of threads, a run
// of them at a time (core/model.h): one job per chunk of images through the
// whole run, forward and backward, not one job per layer. Fewer hand-offs
// (each a wait for a thread, longer on a busy machine), and a chunk's
// activations and gradients stay in its thread's cache from layer to layer.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/model.h"

namespace kubetrain {

const float* Model::ForwardImages(const Params& params, const float* in, int batch, size_t first,
                                  size_t end, Cache* cache, RowMatrix* out) const {
  // The chunks, so the bits, are those of the layers one by one (each
  // split by images with the same pool).
  const size_t n = end - first;
  std::vector<RowMatrix> outs(n), cols(n);
  std::vector<std::vector<int32_t>> args(n);
  for (size_t k = 0; k < n; ++k) {
    const Op& o = ops_[first + k];
    const WindowGeometry& g = o.window;
    if (o.layer.type == LayerType::kConv2D) {
      cols[k].resize(batch * g.positions(), g.patch_size());
      outs[k].resize(batch, g.positions() * o.layer.filters);
    } else {
      outs[k].resize(batch, g.positions() * g.in_c);
      if (o.layer.type == LayerType::kMaxPool2D) args[k].resize(outs[k].size());
    }
  }
  pool_->ParallelFor(batch, [&](int64_t b0, int64_t b1) {
    const float* src = in;
    for (size_t k = 0; k < n; ++k) {
      const Op& o = ops_[first + k];
      switch (o.layer.type) {
        case LayerType::kConv2D:
          ConvForwardImages(o.window, src, b0, b1, params[o.kernel].data(), params[o.bias].data(),
                            o.layer.filters, &cols[k], &outs[k]);
          ApplyActivationRows(o.layer.activation, &outs[k], b0, b1);
          break;
        case LayerType::kMaxPool2D:
          MaxPoolForwardImages(o.window, src, b0, b1, &outs[k], &args[k]);
          break;
        case LayerType::kAvgPool2D:
          AvgPoolForwardImages(o.window, src, b0, b1, &outs[k]);
          break;
        default:
          break;
      }
      src = outs[k].data();
    }
  });
  if (cache == nullptr) {
    *out = std::move(outs[n - 1]);
    return out->data();
  }
  for (size_t k = 0; k < n; ++k) {
    cache->out[first + k] = std::move(outs[k]);
    cache->aux[first + k] = std::move(cols[k]);
    cache->argmax[first + k] = std::move(args[k]);
  }
  return cache->out[end - 1].data();
}

RowMatrix Model::BackwardImages(const Params& params, const Cache& cache, int first, int last,
                                bool need_input_grad, RowMatrix d, Params* grads) const {
  const int batch = static_cast<int>(d.rows());
  // One chunk per thread, as ConvBackward splits: chunk c sums its images'
  // kernel and bias gradients (ConvGradientSums, added up in chunk order
  // after): fixed chunks, so fixed bits for a thread count (those of
  // ConvBackward and the pools' backward on this pool; the activation's
  // gradient by rows, as ActivationGradient splits all but small matrices).
  const int chunks = std::min(batch, pool_->threads());
  const int n = last - first + 1;
  // grad[k + 1]: d(loss)/d(output of op first + k); grad[0]: of op first's input.
  std::vector<RowMatrix> grad(n + 1);
  grad[n] = std::move(d);
  for (int k = need_input_grad ? 0 : 1; k < n; ++k) {
    grad[k].resize(batch, NumElements(ops_[first + k].in));
  }
  std::vector<std::unique_ptr<ConvGradientSums>> sums(n);
  for (int k = 0; k < n; ++k) {
    const Op& o = ops_[first + k];
    if (o.layer.type != LayerType::kConv2D) continue;
    sums[k] = std::make_unique<ConvGradientSums>(
        o.window, o.layer.filters, chunks, (*grads)[o.kernel].data(), (*grads)[o.bias].data());
  }
  pool_->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
    for (int c = static_cast<int>(c0); c < c1; ++c) {
      const auto [b0, b1] = ChunkRange(batch, chunks, c);
      for (int k = n - 1; k >= 0; --k) {
        const Op& o = ops_[first + k];
        RowMatrix& dout = grad[k + 1];
        RowMatrix* din = k > 0 || need_input_grad ? &grad[k] : nullptr;
        switch (o.layer.type) {
          case LayerType::kConv2D:
            ActivationGradientRows(o.layer.activation, cache.out[first + k], &dout, b0, b1);
            ConvBackwardImages(o.window, cache.aux[first + k], dout, params[o.kernel].data(),
                               o.layer.filters, b0, b1, sums[k]->dkernel(c), sums[k]->dbias(c),
                               din);
            break;
          case LayerType::kMaxPool2D:
            if (din != nullptr) {
              MaxPoolBackwardImages(o.window, dout, cache.argmax[first + k], b0, b1, din);
            }
            break;
          case LayerType::kAvgPool2D:
            if (din != nullptr) AvgPoolBackwardImages(o.window, dout, b0, b1, din);
            break;
          default:
            break;
        }
      }
    }
  });
  for (auto& s : sums) {
    if (s != nullptr) s->AddUp();
  }
  if (!need_input_grad) return RowMatrix();
  return std::move(grad[0]);
}

}  // namespace kubetrain
