// The CPU backend's direct convolution for a single input channel and a 3x3 kernel (LeNet's
// first layer): no im2col matrix, no matrix product and no layout pass. Each output row is
// computed in vectors of 16 columns, the last one overlapping the one before where the width is
// not a multiple of 16 (26 = 0-15 and 10-25), from the nine input vectors under it, held in
// registers across the output channels; the bias (and the ReLU that follows, where asked) is
// applied in the same pass and the result is written in NCHW order. The weights' gradient (and the bias's) is the adjoint, with the
// overlapping lanes masked out: pairs of output channels accumulate their 18 tap sums in
// registers over the whole batch. One output row per vector pass keeps every load inside the
// image, whatever its width (16 columns or more).
//
// On LeNet's conv1 (summa-bench-layers) 1.3 ms a step against 4.7 ms for im2col, OpenBLAS and the
// layout passes; within 1e-6 of im2col's results relative to the largest (cpu_backend_test).
#ifndef SUMMA_WORKER_COMPUTE_DIRECT_CONV_H_
#define SUMMA_WORKER_COMPUTE_DIRECT_CONV_H_

#include "worker/compute/backend.h"

namespace summa::worker::direct {

inline constexpr int kKernel = 3;
inline constexpr int kMinWidth = 16;  // output columns: one vector

// Whether this file computes convolution `s`.
inline bool Handles(const ConvShape& s) {
  return s.in_channels == 1 && s.kernel == kKernel && s.out_width() >= kMinWidth && s.out_height() >= 1;
}

// y[N][O][Ho][Wo] = bias[o] + the convolution of x[N][1][H][W] with w[O][1][3][3]; with `relu`,
// max(that, 0) (exactly what Backend::ReluForward gives).
void Forward(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, bool relu);
// Whether ForwardReluPool computes `s`: rows and columns of the output even (no edge for 2x2
// pooling to drop; every vector starts on an even column).
inline bool PoolHandles(const ConvShape& s) {
  return Handles(s) && s.out_height() % 2 == 0 && s.out_width() % 2 == 0;
}
// Forward with ReLU into y, and y's 2x2 average pooling into pooled[N][O][Ho/2][Wo/2], in the
// same pass: output rows two at a time, each vector's pairs of columns summed across lanes.
// Bit for bit Backend::AvgPool2Forward of y (the same additions in the same order).
void ForwardReluPool(const ConvShape& s, const float* x, const float* w, const float* bias, float* y,
                     float* pooled);
// dw[O][1][3][3] and dbias[O] from dy[N][O][Ho][Wo] (overwritten, not added to).
void BackwardWeights(const ConvShape& s, const float* x, const float* dy, float* dw, float* dbias);

}  // namespace summa::worker::direct

#endif  // SUMMA_WORKER_COMPUTE_DIRECT_CONV_H_
