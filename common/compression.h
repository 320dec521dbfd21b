// Gradients and weights on the wire in fewer bytes: float32 values carried as bfloat16 or
// float16, and top-k sparsification with error feedback. The server decodes whatever a push
// carries into float32 before it sums (accumulation and master weights stay float32); the worker
// encodes its pushes and decodes its pulls. Conversions round to nearest even and are
// vectorised (F16C for float16 where the CPU has it, as every x86-64 since 2013 does).
//
// A sparse partition is k uint32 little-endian positions, strictly ascending, followed by the
// k values at those positions in the wire dtype; every other value is zero.
//
// Free functions are thread-safe; a TopKEncoder is not.
#ifndef SUMMA_COMMON_COMPRESSION_H_
#define SUMMA_COMMON_COMPRESSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace summa {

enum class WireDType { kFloat32, kBfloat16, kFloat16 };

// "fp32", "bf16", "fp16": the --wire_dtype spellings.
absl::string_view WireDTypeName(WireDType dtype);
// INVALID_ARGUMENT naming the choices for anything else.
absl::StatusOr<WireDType> ParseWireDType(absl::string_view name);
// Bytes per value: 4 or 2.
int WireDTypeBytes(WireDType dtype);

// out holds in.size() values of `dtype` (WireDTypeBytes each). NaN stays NaN; a float32 beyond
// float16's range becomes infinity.
void EncodeValues(WireDType dtype, absl::Span<const float> in, void* out);
// out.size() values of `dtype` at `in`, widened to float32 (exactly: every value is one).
void DecodeValues(WireDType dtype, const void* in, absl::Span<float> out);

// --compress: none, or topk:RATIO with 0 < RATIO < 1 (the share of each partition's gradient a
// push carries).
struct Compression {
  double topk_ratio = 0;  // 0: dense
  bool sparse() const { return topk_ratio > 0; }
};
absl::StatusOr<Compression> ParseCompression(absl::string_view spec);
std::string CompressionName(const Compression& c);  // "none" or "topk:RATIO"

// The values a top-k push of a partition of `length` carries: ceil(ratio * length), at least 1.
int64_t TopKCount(int64_t length, double ratio);
// The bytes of a sparse partition of k values.
int64_t SparseBytes(int64_t k, WireDType dtype);

// Decodes a sparse partition into `dense` (every position not named is set to zero).
// INVALID_ARGUMENT when the length is not whole entries, there are more entries than `dense`
// holds, or a position is out of range or not above the one before it.
absl::Status DecodeSparse(WireDType dtype, absl::string_view bytes, absl::Span<float> dense);

// Top-k with error feedback (Stich et al. 2018, "Sparsified SGD with memory"; Lin et al. 2018,
// "Deep Gradient Compression"): what a push leaves out, and the rounding of what it carries, is
// kept and added to the next step's gradient, so nothing a worker computes is lost, only late.
class TopKEncoder {
 public:
  // A partition of `length` values of which pushes carry `k` (clamped to [min(1, length), length]).
  TopKEncoder(int64_t length, int64_t k, WireDType dtype);

  // acc = gradient + residual; writes the k values of acc of largest magnitude (NaN and
  // infinity first, so that the server's --nonfinite policy sees them) to `out`
  // (SparseBytes(k) bytes) in the sparse layout; residual = acc - what was sent.
  void Encode(absl::Span<const float> gradient, char* out);
  // Takes the last Encode back (a push the server never applied): the residual is again what it
  // was before it. Once; a second Undo, or one before any Encode, changes nothing.
  void Undo();
  // Forgets what earlier pushes left out (the server's history and this worker's parted).
  void Reset();

  // Whether Undo would take an Encode back.
  bool can_undo() const { return can_undo_; }
  int64_t k() const { return k_; }
  int64_t bytes() const { return SparseBytes(k_, dtype_); }
  absl::Span<const float> residual() const { return residual_[current_]; }

 private:
  const int64_t k_;
  const WireDType dtype_;
  // The residual before and after the last Encode, which writes the one not current (so that
  // Undo costs nothing).
  std::vector<float> residual_[2];
  int current_ = 0;
  bool can_undo_ = false;
  std::vector<uint32_t> keys_;     // |acc| as ordered keys, reordered by the selection
  std::vector<uint32_t> positions_;
  std::vector<float> picked_;      // the chosen values in float32, then as sent
};

namespace internal {
// The portable float16 conversions (no F16C), exposed to test them against the hardware's.
void ToHalfPortable(const float* in, int64_t n, uint16_t* out);
void FromHalfPortable(const uint16_t* in, int64_t n, float* out);
bool HasF16c();
}  // namespace internal

}  // namespace summa

#endif  // SUMMA_COMMON_COMPRESSION_H_
