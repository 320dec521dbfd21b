// The CPU backend's small kernels (worker/compute/cpu_backend.cc): row copies and sums in SSE
// vectors, ReLU and pooling gradients, the im2col layout of a convolution and its adjoint,
// Winograd's point products, and the denormal flags of the computing threads.
#ifndef SUMMA_WORKER_COMPUTE_CPU_KERNELS_H_
#define SUMMA_WORKER_COMPUTE_CPU_KERNELS_H_

#include <xmmintrin.h>

#include <cstdint>

#include "worker/compute/backend.h"

namespace summa::worker {

// Rows of a convolution's output width (9 or 26 floats for LeNet), copied in 4-float vectors, the
// last one overlapping the one before (for a 9-float row: 0-3, 4-7, 5-8): 2.2x the plain loop,
// whose vector version the compiler enters only past an overlap check and a remainder loop
// (conv2's im2col, 16 images: 89 us against 199 us per chunk, measured at -O3).
inline void CopyRow(const float* from, float* to, int n) {
  if (n < 4) {
    for (int j = 0; j < n; ++j) to[j] = from[j];
    return;
  }
  for (int j = 0; j + 4 < n; j += 4) _mm_storeu_ps(to + j, _mm_loadu_ps(from + j));
  _mm_storeu_ps(to + n - 4, _mm_loadu_ps(from + n - 4));
}
// The adding counterpart cannot overlap (an element would be added twice); with restrict the
// compiler's own vectorisation served best (conv2's col2im: 130 us per chunk, against 153 us for
// 4-float vectors and a scalar tail).
inline void AddRow(const float* __restrict from, float* __restrict to, int n) {
  for (int j = 0; j < n; ++j) to[j] += from[j];
}

// The sum of from[0, n), in four lanes (a fixed order: the same result on every run) that
// vectorise where one running sum would chain every addition on the last (strict float order
// keeps the compiler from splitting it); with `to`, also to[0, n) = from[0, n). conv1's dy layout
// and bias gradient went from 1.9 ms to 0.6 ms of a LeNet step (summa-bench-layers). One function
// for both, so that im2col's and Winograd's bias gradients are the same bits.
inline float Sum(const float* from, int64_t n, float* to = nullptr) {
  __m128 lanes = _mm_setzero_ps();
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m128 v = _mm_loadu_ps(from + j);
    if (to != nullptr) _mm_storeu_ps(to + j, v);
    lanes = _mm_add_ps(lanes, v);
  }
  alignas(16) float sums[4];
  _mm_store_ps(sums, lanes);
  float sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  for (; j < n; ++j) {
    if (to != nullptr) to[j] = from[j];
    sum += from[j];
  }
  return sum;
}

// ReLU's backward: dx = dy where y > 0, else 0. dx may be dy (in place): element-wise, so no
// iteration depends on another, which ivdep tells the vectoriser (its overlap check would
// otherwise fall back to a scalar loop whose branch mispredicts on half the elements: 16% of a
// LeNet step, summa-bench-layers).
inline void ReluSelect(const float* y, const float* dy, float* dx, int64_t n) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];  // loaded whatever y says, so that the select needs no branch
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

// The gradient of 2x2 average pooling, spread over each window; with kRelu, zero where ReLU's
// output y is not positive (ReluBackward's select, on each pair of rows while it is in L1).
template <bool kRelu>
inline void PoolBackward(const float* y, const float* dy, float* dx, int planes, int h, int w) {
  const int oh = h / 2, ow = w / 2;
  if (h % 2 != 0 || w % 2 != 0) std::fill_n(dx, int64_t{planes} * h * w, 0.0f);
  for (int p = 0; p < planes; ++p) {
    const float* dyp = dy + int64_t{p} * oh * ow;
    float* dxp = dx + int64_t{p} * h * w;
    for (int i = 0; i < oh; ++i) {
      float* r0 = dxp + (2 * i) * w;
      float* r1 = r0 + w;
      for (int j = 0; j < ow; ++j) {
        const float g = 0.25f * dyp[i * ow + j];
        r0[2 * j] = r0[2 * j + 1] = r1[2 * j] = r1[2 * j + 1] = g;
      }
      if constexpr (kRelu) {
        const float* y0 = y + int64_t{p} * h * w + (2 * i) * w;
        ReluSelect(y0, r0, r0, 2 * ow);
        ReluSelect(y0 + w, r1, r1, 2 * ow);
      }
    }
  }
}

// The batch's im2col matrix: col[(c*k + ki)*k + kj][i*P + oh*Wo + ow] = x[i][c][oh + ki][ow + kj],
// with P = Ho*Wo. Row by row, so that the matrix (megabytes: more than L2 holds) is written in
// one sequential stream while the inputs it reads (kilobytes per channel) stay in L1.
void Im2Col(const ConvShape& s, const float* x, float* col);

// The adjoint of Im2Col: dx[i][c][oh + ki][ow + kj] = the sum of col's entries for it. In col's
// order, read as one sequential stream, adding into dx (hundreds of kilobytes: in L2).
void Col2Im(const ConvShape& s, const float* col, float* dx);

// The 49 products of Winograd's transformed domain, one per point p, over the layout's
// [rows, columns] blocks: c[p] = op(a[p]) op(b[p]).
void PointProducts(bool ta, bool tb, int m, int n, int k, const float* a, int64_t a_step,
                   const float* b, int64_t b_step, float* c, int64_t c_step);

// The seed's N(0, 0.01^2) weights give gradients deep in denormal range, where every x86 multiply
// takes a slow microcode path; flush them to zero as GPUs do. The flags live in each thread's
// MXCSR, so they are set where compute runs: in the thread that creates a backend, at the start
// of every compute operation (the calling thread need not be the creating one; setting MXCSR
// costs a few cycles), and in OpenBLAS's worker threads, which the library starts when it is
// loaded, before main: the first backend restarts that pool from a thread with the flags set, so
// that the new workers inherit them. The restart goes through OpenBLAS's own fork hooks, looked
// up at run time; a build without them (the serial one) has no pool to restart.
inline void FlushDenormals() {
  constexpr unsigned kFlushToZero = 0x8000;
  constexpr unsigned kDenormalsAreZero = 0x0040;
  _mm_setcsr(_mm_getcsr() | kFlushToZero | kDenormalsAreZero);
}
void RestartBlasThreadsWithFlushToZero();

}  // namespace summa::worker

#endif  // SUMMA_WORKER_COMPUTE_CPU_KERNELS_H_
