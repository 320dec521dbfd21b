#include "common/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace summa {

void AddInto(absl::Span<float> sum, absl::Span<const float> values) {
  float* __restrict s = sum.data();
  const float* __restrict v = values.data();
  const size_t n = sum.size();
  for (size_t i = 0; i < n; ++i) s[i] += v[i];
}

int64_t FirstNonFinite(absl::Span<const float> values) {
  // A float is NaN or infinite when its exponent bits are all ones. Blocks are scanned with a
  // branch-free OR (vectorised); only a block that has one is searched element by element.
  constexpr size_t kBlock = 1024;
  const size_t n = values.size();
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = std::min(n, start + kBlock);
    uint32_t any = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[i], sizeof(bits));
      any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (any == 0) continue;
    for (size_t i = start; i < end; ++i) {
      if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace summa
