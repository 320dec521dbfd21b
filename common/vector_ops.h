// Elementwise float32 loops of the data path, written so that the compiler vectorises them
// (no aliasing, no early exit): the server sums gradients and checks them for NaN and infinity
// at memory speed.
#ifndef SUMMA_COMMON_VECTOR_OPS_H_
#define SUMMA_COMMON_VECTOR_OPS_H_

#include <cstdint>

#include "absl/types/span.h"

// Marks a hot loop to be compiled for AVX-512, AVX2 and baseline x86-64, the loader picking the
// one this CPU runs (GCC's function multiversioning: an ifunc resolver chooses at load time).
// Under ThreadSanitizer only the baseline is built: a resolver runs before TSan's runtime has
// started, and TSan's instrumentation of it crashes the program as it loads.
#if defined(__SANITIZE_THREAD__)
#define SUMMA_VECTOR_CLONES
#else
#define SUMMA_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace summa {

// sum[i] += values[i]. The spans have one length and do not overlap.
void AddInto(absl::Span<float> sum, absl::Span<const float> values);

// The index of the first NaN or infinite value, or -1 when all are finite.
int64_t FirstNonFinite(absl::Span<const float> values);

// to[i] = values[i], and sum[i] += values[i], with NaN and infinite values taken as 0 (a push
// under --nonfinite=zero, or one the sender may still rewrite: the shared-memory plane's).
// Branch-free bit operations, vectorised.
void CopyFiniteOrZero(absl::Span<float> to, absl::Span<const float> values);
void AddFiniteOrZero(absl::Span<float> sum, absl::Span<const float> values);

}  // namespace summa

#endif  // SUMMA_COMMON_VECTOR_OPS_H_
