#include "common/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace summa {

namespace {

// `v`, or 0 where it is NaN or infinite: its exponent bits all ones carry into the sign bit when
// one is added to the exponent, and the arithmetic shift spreads that bit into a mask.
inline float FiniteOrZero(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t bad = static_cast<uint32_t>(static_cast<int32_t>((bits & 0x7f800000u) + 0x00800000u) >> 31);
  bits &= ~bad;
  std::memcpy(&v, &bits, sizeof(bits));
  return v;
}

}  // namespace

SUMMA_VECTOR_CLONES void CopyFiniteOrZero(absl::Span<float> to, absl::Span<const float> values) {
  float* __restrict s = to.data();
  const float* __restrict v = values.data();
  const size_t n = to.size();
  for (size_t i = 0; i < n; ++i) s[i] = FiniteOrZero(v[i]);
}

SUMMA_VECTOR_CLONES void AddFiniteOrZero(absl::Span<float> sum, absl::Span<const float> values) {
  float* __restrict s = sum.data();
  const float* __restrict v = values.data();
  const size_t n = sum.size();
  for (size_t i = 0; i < n; ++i) s[i] += FiniteOrZero(v[i]);
}

SUMMA_VECTOR_CLONES void AddInto(absl::Span<float> sum, absl::Span<const float> values) {
  float* __restrict s = sum.data();
  const float* __restrict v = values.data();
  const size_t n = sum.size();
  for (size_t i = 0; i < n; ++i) s[i] += v[i];
}

SUMMA_VECTOR_CLONES int64_t FirstNonFinite(absl::Span<const float> values) {
  // A float is NaN or infinite when its exponent bits are all ones: adding one to the exponent
  // then carries into the sign bit. Blocks are scanned with that add and an OR, branch-free, which
  // the compiler vectorises with any SSE2 (a compare into a bool did not: a scalar loop that took
  // half of a server's time); only a block that has one is searched element by element.
  // (A raw pointer, not the span's checked operator[], which kept the loop scalar.)
  constexpr size_t kBlock = 1024;
  const size_t n = values.size();
  const float* const v = values.data();
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = std::min(n, start + kBlock);
    uint32_t any = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, v + i, sizeof(bits));
      any |= (bits & 0x7f800000u) + 0x00800000u;
    }
    any &= 0x80000000u;
    if (any == 0) continue;
    for (size_t i = start; i < end; ++i) {
      if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace summa
