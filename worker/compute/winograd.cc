#include "worker/compute/winograd.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>

#include "common/vector_ops.h"
#include "worker/compute/lanes.h"

namespace summa::worker::winograd {
namespace {

using lanes::Load;
using lanes::LoadFirst;
using lanes::Store;
using lanes::StoreFirst;
using lanes::Vec;
static_assert(lanes::kLanes == kLanes, "one image per vector lane");

template <size_t R, size_t C>
using Matrix = std::array<std::array<float, C>, R>;

template <size_t R, size_t C>
constexpr Matrix<C, R> Transposed(const Matrix<R, C>& m) {
  Matrix<C, R> t{};
  for (size_t i = 0; i < R; ++i) {
    for (size_t j = 0; j < C; ++j) t[j][i] = m[i][j];
  }
  return t;
}

// Points 0, 1, -1, 2, -2, 1/2 and infinity (derived by Cook-Toom; winograd_test checks the
// products against the direct convolution).
constexpr Matrix<kTile, kIn> kAT = {{
    {1, 1, 1, 1, 1, 1, 0},
    {0, 1, -1, 2, -2, 0.5f, 0},
    {0, 1, 1, 4, 4, 0.25f, 1},
}};
constexpr Matrix<kIn, kKernel> kG = {{
    {-0.5f, 0, 0, 0, 0},
    {-1.0f / 3, -1.0f / 3, -1.0f / 3, -1.0f / 3, -1.0f / 3},
    {1.0f / 9, -1.0f / 9, 1.0f / 9, -1.0f / 9, 1.0f / 9},
    {1.0f / 36, 1.0f / 18, 1.0f / 9, 2.0f / 9, 4.0f / 9},
    {-1.0f / 60, 1.0f / 30, -1.0f / 15, 2.0f / 15, -4.0f / 15},
    {32.0f / 45, 16.0f / 45, 8.0f / 45, 4.0f / 45, 2.0f / 45},
    {0, 0, 0, 0, 1},
}};
constexpr Matrix<kIn, kIn> kBT = {{
    {-2, 4, 2.5f, -5, -0.5f, 1, 0},
    {0, 2, -2, -4.5f, 0.5f, 1, 0},
    {0, -2, 6, -3.5f, -1.5f, 1, 0},
    {0, 1, -1.5f, -2, 1.5f, 1, 0},
    {0, -1, 2.5f, 0, -2.5f, 1, 0},
    {0, 4, 0, -5, 0, 1, 0},
    {0, -2, 4, 2.5f, -5, -0.5f, 1},
}};
// The adjoints' matrices.
constexpr Matrix<kIn, kTile> kA = Transposed(kAT);
constexpr Matrix<kIn, kIn> kB = Transposed(kBT);
constexpr Matrix<kKernel, kIn> kGT = Transposed(kG);

// out = P in P^T, on vectors of lanes. P is a compile-time constant: unrolled, the products with
// its zeros vanish and those with +-1 become additions.
template <int Out, int In, const Matrix<Out, In>& P>
inline void Sandwich(const Vec (&in)[In][In], Vec (&out)[Out][Out]) {
  Vec rows[Out][In];
#pragma GCC unroll 8
  for (int a = 0; a < Out; ++a) {
#pragma GCC unroll 8
    for (int j = 0; j < In; ++j) {
      Vec s = {};
#pragma GCC unroll 8
      for (int i = 0; i < In; ++i) {
        if (P[a][i] != 0.0f) s += P[a][i] * in[i][j];
      }
      rows[a][j] = s;
    }
  }
#pragma GCC unroll 8
  for (int a = 0; a < Out; ++a) {
#pragma GCC unroll 8
    for (int b = 0; b < Out; ++b) {
      Vec s = {};
#pragma GCC unroll 8
      for (int j = 0; j < In; ++j) {
        if (P[b][j] != 0.0f) s += P[b][j] * rows[a][j];
      }
      out[a][b] = s;
    }
  }
}

int64_t OutHeight(const Layout& l) { return l.height - kKernel + 1; }
int64_t OutWidth(const Layout& l) { return l.width - kKernel + 1; }
// The first column of tile (ty, tx) of group g in V, M and their gradients.
int64_t Column(const Layout& l, int64_t g, int64_t ty, int64_t tx) {
  return ((g * l.tiles_h + ty) * l.tiles_w + tx) * kLanes;
}
// packed[g][c][h][w][lane]
int64_t Packed(const Layout& l, int64_t g, int64_t c, int64_t h, int64_t w) {
  return (((g * l.in_channels + c) * l.padded_h + h) * l.padded_w + w) * kLanes;
}
int LanesOf(const Layout& l, int64_t g) {
  return static_cast<int>(std::min<int64_t>(kLanes, l.batch - g * kLanes));
}

}  // namespace

// Each transform is compiled three times, for AVX-512, AVX2 and baseline x86-64, and the loader
// picks the one this CPU runs (SUMMA_VECTOR_CLONES, common/vector_ops.h): a vector of 16 floats
// is one AVX-512 register, two AVX ones or four SSE ones.

SUMMA_VECTOR_CLONES void TransformInput(const Layout& l, const float* x, float* work) {
  float* packed = work + l.packed;
  std::fill(packed, work + l.v, 0.0f);
  const int64_t c_n = l.in_channels, h_n = l.height, w_n = l.width;
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t g = n / kLanes, lane = n % kLanes;
    for (int64_t c = 0; c < c_n; ++c) {
      const float* from = x + (n * c_n + c) * h_n * w_n;
      for (int64_t h = 0; h < h_n; ++h) {
        float* to = packed + Packed(l, g, c, h, 0) + lane;
        for (int64_t w = 0; w < w_n; ++w) to[w * kLanes] = from[h * w_n + w];
      }
    }
  }
  float* v = work + l.v;
  const int64_t point = c_n * l.columns;  // between V[p] and V[p + 1]
  for (int64_t g = 0; g < l.groups; ++g) {
    for (int64_t c = 0; c < c_n; ++c) {
      for (int64_t ty = 0; ty < l.tiles_h; ++ty) {
        for (int64_t tx = 0; tx < l.tiles_w; ++tx) {
          const float* base = packed + Packed(l, g, c, ty * kTile, tx * kTile);
          Vec d[kIn][kIn], t[kIn][kIn];
          for (int i = 0; i < kIn; ++i) {
            for (int j = 0; j < kIn; ++j) d[i][j] = Load(base + (i * l.padded_w + j) * kLanes);
          }
          Sandwich<kIn, kIn, kBT>(d, t);
          float* to = v + c * l.columns + Column(l, g, ty, tx);
          for (int p = 0; p < kPoints; ++p) Store(to + p * point, t[p / kIn][p % kIn]);
        }
      }
    }
  }
}

SUMMA_VECTOR_CLONES void TransformKernels(const Layout& l, const float* w, float* work) {
  float* u = work + l.u;
  const int64_t kernels = l.out_channels * l.in_channels;  // U[p] is [O][C]: kernel o*C + c
  for (int64_t first = 0; first < kernels; first += kLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, kernels - first));
    Vec g[kKernel][kKernel] = {}, t[kIn][kIn];
    for (int lane = 0; lane < lanes; ++lane) {
      const float* k = w + (first + lane) * kKernel * kKernel;
      for (int i = 0; i < kKernel; ++i) {
        for (int j = 0; j < kKernel; ++j) g[i][j][lane] = k[i * kKernel + j];
      }
    }
    Sandwich<kIn, kKernel, kG>(g, t);
    for (int p = 0; p < kPoints; ++p) StoreFirst(u + p * kernels + first, t[p / kIn][p % kIn], lanes);
  }
}

SUMMA_VECTOR_CLONES void TransformOutput(const Layout& l, const float* bias, const float* work, float* y,
                                         bool relu) {
  const float* m = work + l.m;
  const int64_t o_n = l.out_channels, ho = OutHeight(l), wo = OutWidth(l);
  const int64_t point = o_n * l.columns;
  for (int64_t g = 0; g < l.groups; ++g) {
    const int lanes = LanesOf(l, g);
    for (int64_t ty = 0; ty < l.tiles_h; ++ty) {
      const int rows = static_cast<int>(std::min<int64_t>(kTile, ho - ty * kTile));
      for (int64_t tx = 0; tx < l.tiles_w; ++tx) {
        const int cols = static_cast<int>(std::min<int64_t>(kTile, wo - tx * kTile));
        for (int64_t o = 0; o < o_n; ++o) {
          const float* from = m + o * l.columns + Column(l, g, ty, tx);
          Vec in[kIn][kIn], out[kTile][kTile];
          for (int p = 0; p < kPoints; ++p) in[p / kIn][p % kIn] = Load(from + p * point);
          Sandwich<kTile, kIn, kAT>(in, out);
          for (int i = 0; i < rows; ++i) {
            for (int j = 0; j < cols; ++j) {
              out[i][j] += bias[o];
              if (relu) out[i][j] = lanes::Relu(out[i][j]);
            }
          }
          for (int lane = 0; lane < lanes; ++lane) {
            float* to = y + ((g * kLanes + lane) * o_n + o) * ho * wo + ty * kTile * wo + tx * kTile;
            for (int i = 0; i < rows; ++i) {
              for (int j = 0; j < cols; ++j) to[i * wo + j] = out[i][j][lane];
            }
          }
        }
      }
    }
  }
}

SUMMA_VECTOR_CLONES void TransformOutputGradient(const Layout& l, const float* dy, float* work) {
  float* m = work + l.m;
  const int64_t o_n = l.out_channels, ho = OutHeight(l), wo = OutWidth(l);
  const int64_t point = o_n * l.columns;
  for (int64_t g = 0; g < l.groups; ++g) {
    const int lanes = LanesOf(l, g);
    for (int64_t ty = 0; ty < l.tiles_h; ++ty) {
      const int rows = static_cast<int>(std::min<int64_t>(kTile, ho - ty * kTile));
      for (int64_t tx = 0; tx < l.tiles_w; ++tx) {
        const int cols = static_cast<int>(std::min<int64_t>(kTile, wo - tx * kTile));
        for (int64_t o = 0; o < o_n; ++o) {
          Vec d[kTile][kTile] = {}, t[kIn][kIn];
          for (int lane = 0; lane < lanes; ++lane) {
            const float* from = dy + ((g * kLanes + lane) * o_n + o) * ho * wo + ty * kTile * wo + tx * kTile;
            for (int i = 0; i < rows; ++i) {
              for (int j = 0; j < cols; ++j) d[i][j][lane] = from[i * wo + j];
            }
          }
          Sandwich<kIn, kTile, kA>(d, t);
          float* to = m + o * l.columns + Column(l, g, ty, tx);
          for (int p = 0; p < kPoints; ++p) Store(to + p * point, t[p / kIn][p % kIn]);
        }
      }
    }
  }
}

SUMMA_VECTOR_CLONES void TransformInputGradient(const Layout& l, float* work, float* dx) {
  float* packed = work + l.packed;
  std::fill(packed, work + l.v, 0.0f);
  const float* v = work + l.v;
  const int64_t c_n = l.in_channels, h_n = l.height, w_n = l.width;
  const int64_t point = c_n * l.columns;
  for (int64_t g = 0; g < l.groups; ++g) {
    for (int64_t c = 0; c < c_n; ++c) {
      for (int64_t ty = 0; ty < l.tiles_h; ++ty) {
        for (int64_t tx = 0; tx < l.tiles_w; ++tx) {
          const float* from = v + c * l.columns + Column(l, g, ty, tx);
          Vec in[kIn][kIn], t[kIn][kIn];
          for (int p = 0; p < kPoints; ++p) in[p / kIn][p % kIn] = Load(from + p * point);
          Sandwich<kIn, kIn, kB>(in, t);
          // Neighbouring tiles overlap by kKernel - 1 rows and columns: add.
          float* base = packed + Packed(l, g, c, ty * kTile, tx * kTile);
          for (int i = 0; i < kIn; ++i) {
            for (int j = 0; j < kIn; ++j) {
              float* at = base + (i * l.padded_w + j) * kLanes;
              Store(at, Load(at) + t[i][j]);
            }
          }
        }
      }
    }
  }
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t g = n / kLanes, lane = n % kLanes;
    for (int64_t c = 0; c < c_n; ++c) {
      float* to = dx + (n * c_n + c) * h_n * w_n;
      for (int64_t h = 0; h < h_n; ++h) {
        const float* from = packed + Packed(l, g, c, h, 0) + lane;
        for (int64_t w = 0; w < w_n; ++w) to[h * w_n + w] = from[w * kLanes];
      }
    }
  }
}

SUMMA_VECTOR_CLONES void TransformKernelGradient(const Layout& l, const float* work, float* dw) {
  const float* du = work + l.du;
  const int64_t kernels = l.out_channels * l.in_channels;
  for (int64_t first = 0; first < kernels; first += kLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, kernels - first));
    Vec in[kIn][kIn], t[kKernel][kKernel];
    for (int p = 0; p < kPoints; ++p) in[p / kIn][p % kIn] = LoadFirst(du + p * kernels + first, lanes);
    Sandwich<kKernel, kIn, kGT>(in, t);
    for (int lane = 0; lane < lanes; ++lane) {
      float* k = dw + (first + lane) * kKernel * kKernel;
      for (int i = 0; i < kKernel; ++i) {
        for (int j = 0; j < kKernel; ++j) k[i * kKernel + j] = t[i][j][lane];
      }
    }
  }
}

}  // namespace summa::worker::winograd
