// Winograd's minimal filtering F(3x3, 5x5) (Lavin and Gray, "Fast Algorithms for Convolutional
// Neural Networks", 2016): how the CPU backend computes a 5x5 convolution. Each 3x3 block
// ("tile") of the output comes from a 7x7 block of the input:
//
//   Y = A^T [ (G g G^T) .* (B^T d B) ] A      (d: 7x7 input, g: 5x5 kernel, Y: 3x3 output)
//
// and the 49 elementwise products, summed over the input channels, are 49 matrix products
//
//   M[p] (O x T) = U[p] (O x C) * V[p] (C x T),   U[p] = (G g G^T)[p],  V[p] = (B^T d B)[p]
//
// over T = the batch's tiles: 49 * 2*O*C*T multiply-adds where im2col does 2*O*C*25*9*T, 4.6x
// fewer (LeNet's second convolution). The backward pass is the exact adjoint of the same
// algebra: dM = A dY A^T, dV[p] = U[p]^T dM[p] (then dx += B dV B^T), dU[p] = dM[p] V[p]^T
// (then dw = G^T dU G). The transforms run on 16 images at once, one per vector lane: images
// are packed 16 to a group, and a group short of 16 is padded with zeros.
//
// Interpolation points 0, 1, -1, 2, -2, 1/2 and infinity: float32 results within 1e-5 of the
// exact convolution, relative to its largest output (measured in winograd_test).
//
// The layout is here, header-only, because ConvShape::workspace_floats() sizes the workspace
// every backend is handed from it.
#ifndef SUMMA_WORKER_COMPUTE_WINOGRAD_H_
#define SUMMA_WORKER_COMPUTE_WINOGRAD_H_

#include <cstdint>

namespace summa::worker::winograd {

inline constexpr int kKernel = 5;  // the kernel it computes
inline constexpr int kTile = 3;    // output tile
inline constexpr int kIn = 7;      // input tile: kTile + kKernel - 1
inline constexpr int kPoints = kIn * kIn;
inline constexpr int kLanes = 16;  // images transformed at once

// Where the buffers of one convolution lie in its workspace, in floats.
struct Layout {
  int64_t batch = 0, in_channels = 0, height = 0, width = 0, out_channels = 0;
  int64_t groups = 0;          // of kLanes images
  int64_t tiles_h = 0, tiles_w = 0;
  int64_t padded_h = 0, padded_w = 0;  // the input, padded with zeros to whole tiles
  int64_t columns = 0;         // T: groups * tiles_h * tiles_w * kLanes
  // packed[group][c][padded_h][padded_w][lane]: the input (forward) or its gradient (backward).
  int64_t packed = 0;
  int64_t v = 0;    // V[p][c][T]; the backward pass overwrites it with dV
  int64_t u = 0;    // U[p][o][c]
  int64_t du = 0;   // dU[p][o][c]
  int64_t m = 0;    // M[p][o][T], or dM in the backward pass
  int64_t floats = 0;  // all of it

  static constexpr Layout Of(int batch, int in_channels, int height, int width, int out_channels) {
    Layout l;
    l.batch = batch;
    l.in_channels = in_channels;
    l.height = height;
    l.width = width;
    l.out_channels = out_channels;
    l.groups = (batch + kLanes - 1) / kLanes;
    l.tiles_h = (height - kKernel + 1 + kTile - 1) / kTile;
    l.tiles_w = (width - kKernel + 1 + kTile - 1) / kTile;
    l.padded_h = l.tiles_h * kTile + kKernel - 1;
    l.padded_w = l.tiles_w * kTile + kKernel - 1;
    l.columns = l.groups * l.tiles_h * l.tiles_w * kLanes;
    l.packed = 0;
    l.v = l.packed + l.groups * in_channels * l.padded_h * l.padded_w * kLanes;
    l.u = l.v + kPoints * in_channels * l.columns;
    l.du = l.u + int64_t{kPoints} * out_channels * in_channels;
    l.m = l.du + int64_t{kPoints} * out_channels * in_channels;
    l.floats = l.m + kPoints * out_channels * l.columns;
    return l;
  }
};

// The forward pass's transforms. `work` is the workspace described by `l`.
// V = B^T d B for every tile of x[N][C][H][W] (packing x first).
void TransformInput(const Layout& l, const float* x, float* work);
// U = G g G^T for every kernel of w[O][C][5][5].
void TransformKernels(const Layout& l, const float* w, float* work);
// y[N][O][Ho][Wo] = A^T M A + bias[o]; with `relu`, max(that, 0) (Backend::ReluForward's result).
void TransformOutput(const Layout& l, const float* bias, const float* work, float* y, bool relu);

// The backward pass's: dM = A dY A^T from dy[N][O][Ho][Wo] (into M's place).
void TransformOutputGradient(const Layout& l, const float* dy, float* work);
// dx[N][C][H][W] = the sum over tiles of B dV B^T (dV in V's place; packed's place as scratch).
void TransformInputGradient(const Layout& l, float* work, float* dx);
// dw[O][C][5][5] = G^T dU G.
void TransformKernelGradient(const Layout& l, const float* work, float* dw);

}  // namespace summa::worker::winograd

#endif  // SUMMA_WORKER_COMPUTE_WINOGRAD_H_
