// Sixteen floats, one per vector lane, for the CPU backend's hand-vectorised loops (Winograd's
// transforms, the direct convolution): GCC's vector extension, lowered to whatever vectors the
// target has (one AVX-512 register, two AVX ones, four SSE ones); the loops are compiled for
// each (SUMMA_VECTOR_CLONES, common/vector_ops.h). Only for use inside .cc files: a Vec never
// crosses a function boundary that another translation unit compiles, so the warning that an
// AVX-512 build would pass it differently does not apply.
#ifndef SUMMA_WORKER_COMPUTE_LANES_H_
#define SUMMA_WORKER_COMPUTE_LANES_H_

#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"

namespace summa::worker::lanes {

inline constexpr int kLanes = 16;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using Mask = int __attribute__((vector_size(kLanes * sizeof(int))));

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store(float* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }
// The first `lanes` floats only; the rest of the vector is zero.
inline Vec LoadFirst(const float* p, int lanes) {
  Vec v = {};
  std::memcpy(&v, p, lanes * sizeof(float));
  return v;
}
inline void StoreFirst(float* p, const Vec& v, int lanes) { std::memcpy(p, &v, lanes * sizeof(float)); }
// max(v, 0) lane by lane as Backend::ReluForward computes it (NaN and -0 become +0).
inline Vec Relu(const Vec& v) { return v > 0.0f ? v : Vec{}; }
// The sum of the lanes, in a fixed order (halves folded onto each other).
inline float Total(const Vec& v) {
  float half[kLanes];
  std::memcpy(half, &v, sizeof half);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int i = 0; i < width; ++i) half[i] += half[i + width];
  }
  return half[0];
}

}  // namespace summa::worker::lanes

#endif  // SUMMA_WORKER_COMPUTE_LANES_H_
