#include "common/compression.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/vector_ops.h"

namespace summa {
namespace {

// bfloat16 is the upper half of a float32: rounding to nearest even adds 0x7fff plus the lowest
// kept bit before the shift. NaN is kept NaN (its quiet bit set), which the rounding could carry
// into infinity. Branch-free, so that the loop vectorises.
SUMMA_VECTOR_CLONES
void ToBfloat16(const float* __restrict in, int64_t n, uint16_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, sizeof(u));
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

SUMMA_VECTOR_CLONES
void FromBfloat16(const uint16_t* __restrict in, int64_t n, float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, sizeof(u));
  }
}

uint16_t HalfOf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quieted
  if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // infinity stays infinity
  // A finite value past the largest half (65504) saturates there: a gradient that large is sent
  // as the largest half (top-k keeps the rest), not as an infinity the server would refuse.
  if (a >= 0x477fe000u) return static_cast<uint16_t>(sign | 0x7bffu);
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, or zero
    if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // up to 2^-25 (a tie) rounds to zero
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // m * 2^(e-150) in units of 2^-24
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = m >> shift;
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t v = a - 0x38000000u;  // rebias the exponent from 127 to 15
  return static_cast<uint16_t>(sign | ((v + 0xfffu + ((v >> 13) & 1u)) >> 13));
}

float FloatOfHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    const float sub = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    std::memcpy(&x, &sub, sizeof(x));
    x |= sign;
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0u);  // NaN comes out quiet, as F16C's does
  } else {
    x = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

__attribute__((target("avx,f16c")))
void ToHalfF16c(const float* in, int64_t n, uint16_t* out) {
  // Finite values saturate at +-65504 as HalfOf's do; infinity and NaN pass (min and max return
  // their second operand when either is NaN, so x goes second).
  const __m256 largest = _mm256_set1_ps(65504.0f);
  const __m256 lowest = _mm256_set1_ps(-65504.0f);
  const __m256 infinity = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256 clamped = _mm256_max_ps(lowest, _mm256_min_ps(largest, x));
    const __m256 is_infinite = _mm256_cmp_ps(_mm256_and_ps(x, magnitude), infinity, _CMP_EQ_OQ);
    const __m256 y = _mm256_blendv_ps(clamped, x, is_infinite);
    const __m128i h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = HalfOf(in[i]);
}

__attribute__((target("avx,f16c")))
void FromHalfF16c(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = FloatOfHalf(in[i]);
}

// One value of a sparse partition, widened.
float DecodeOne(WireDType dtype, const char* values, int64_t j) {
  switch (dtype) {
    case WireDType::kFloat32: {
      float f;
      std::memcpy(&f, values + 4 * j, sizeof(f));
      return f;
    }
    case WireDType::kBfloat16: {
      uint16_t h;
      std::memcpy(&h, values + 2 * j, sizeof(h));
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, sizeof(f));
      return f;
    }
    case WireDType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, values + 2 * j, sizeof(h));
      return FloatOfHalf(h);
    }
  }
  return 0;
}

// A float's magnitude as an ordered key: the bits of |x| compare as the values do; NaN counts as
// infinity (the largest), so that a non-finite value is always sent.
inline uint32_t MagnitudeKey(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return std::min(u & 0x7fffffffu, 0x7f800000u);
}

}  // namespace

namespace internal {

void ToHalfPortable(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = HalfOf(in[i]);
}

void FromHalfPortable(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatOfHalf(in[i]);
}

bool HasF16c() {
  // AVX (with the OS saving its registers, which __builtin_cpu_supports checks) and F16C
  // (CPUID leaf 1, ECX; not every compiler's __builtin_cpu_supports knows it).
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

}  // namespace internal

absl::string_view WireDTypeName(WireDType dtype) {
  switch (dtype) {
    case WireDType::kFloat32: return "fp32";
    case WireDType::kBfloat16: return "bf16";
    case WireDType::kFloat16: return "fp16";
  }
  return "?";
}

absl::StatusOr<WireDType> ParseWireDType(absl::string_view name) {
  for (WireDType d : {WireDType::kFloat32, WireDType::kBfloat16, WireDType::kFloat16}) {
    if (name == WireDTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown wire dtype '", name, "' (choose one of fp32, bf16, fp16)"));
}

int WireDTypeBytes(WireDType dtype) { return dtype == WireDType::kFloat32 ? 4 : 2; }

void EncodeValues(WireDType dtype, absl::Span<const float> in, void* out) {
  const int64_t n = static_cast<int64_t>(in.size());
  uint16_t* const half = static_cast<uint16_t*>(out);
  switch (dtype) {
    case WireDType::kFloat32: std::memcpy(out, in.data(), n * sizeof(float)); return;
    case WireDType::kBfloat16: ToBfloat16(in.data(), n, half); return;
    case WireDType::kFloat16:
      if (internal::HasF16c()) {
        ToHalfF16c(in.data(), n, half);
      } else {
        internal::ToHalfPortable(in.data(), n, half);
      }
      return;
  }
}

void DecodeValues(WireDType dtype, const void* in, absl::Span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  const uint16_t* const half = static_cast<const uint16_t*>(in);
  switch (dtype) {
    case WireDType::kFloat32: std::memcpy(out.data(), in, n * sizeof(float)); return;
    case WireDType::kBfloat16: FromBfloat16(half, n, out.data()); return;
    case WireDType::kFloat16:
      if (internal::HasF16c()) {
        FromHalfF16c(half, n, out.data());
      } else {
        internal::FromHalfPortable(half, n, out.data());
      }
      return;
  }
}

absl::StatusOr<Compression> ParseCompression(absl::string_view spec) {
  Compression c;
  if (spec == "none") return c;
  absl::string_view ratio = spec;
  double r = 0;
  if (!absl::ConsumePrefix(&ratio, "topk:") || !absl::SimpleAtod(ratio, &r) || !(r > 0 && r < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad compression '", spec, "': give none, or topk:RATIO with 0 < RATIO < 1 (topk:0.01 sends "
        "the largest 1% of each partition's gradient)"));
  }
  c.topk_ratio = r;
  return c;
}

std::string CompressionName(const Compression& c) {
  return c.sparse() ? absl::StrCat("topk:", c.topk_ratio) : "none";
}

int64_t TopKCount(int64_t length, double ratio) {
  const int64_t k = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(length)));
  return std::clamp<int64_t>(k, 1, std::max<int64_t>(1, length));
}

int64_t SparseBytes(int64_t k, WireDType dtype) { return k * (4 + WireDTypeBytes(dtype)); }

absl::Status DecodeSparse(WireDType dtype, absl::string_view bytes, absl::Span<float> dense) {
  const int64_t entry = 4 + WireDTypeBytes(dtype);
  const int64_t n = static_cast<int64_t>(dense.size());
  if (static_cast<int64_t>(bytes.size()) % entry != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a sparse push of ", WireDTypeName(dtype), " values is whole ",
                                                   entry, "-byte entries; got ", bytes.size(), " bytes"));
  }
  const int64_t k = static_cast<int64_t>(bytes.size()) / entry;
  if (k > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sparse push names ", k, " values; the partition holds ", n));
  }
  std::fill(dense.begin(), dense.end(), 0.0f);
  const char* const values = bytes.data() + 4 * k;
  int64_t previous = -1;
  for (int64_t j = 0; j < k; ++j) {
    uint32_t position;
    std::memcpy(&position, bytes.data() + 4 * j, sizeof(position));
    if (static_cast<int64_t>(position) >= n || static_cast<int64_t>(position) <= previous) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a sparse push's position ", j, " is ", position, ": positions must be strictly ascending and below ",
          n, (j > 0 ? absl::StrCat(" (the one before is ", previous, ")") : "")));
    }
    previous = position;
    dense[position] = DecodeOne(dtype, values, j);
  }
  return absl::OkStatus();
}

TopKEncoder::TopKEncoder(int64_t length, int64_t k, WireDType dtype)
    : k_(std::clamp<int64_t>(k, std::min<int64_t>(1, length), std::max<int64_t>(0, length))), dtype_(dtype),
      residual_{std::vector<float>(length, 0.0f), std::vector<float>(length, 0.0f)}, keys_(length),
      positions_(k_), picked_(k_) {}

void TopKEncoder::Undo() {
  if (!can_undo_) return;
  current_ = 1 - current_;
  can_undo_ = false;
}

void TopKEncoder::Reset() {
  for (std::vector<float>& r : residual_) std::fill(r.begin(), r.end(), 0.0f);
  can_undo_ = false;
}

void TopKEncoder::Encode(absl::Span<const float> gradient, char* out) {
  const int64_t n = static_cast<int64_t>(keys_.size());
  if (k_ == 0) return;  // an empty partition sends nothing
  const float* __restrict before = residual_[current_].data();
  float* __restrict acc = residual_[1 - current_].data();
  current_ = 1 - current_;
  can_undo_ = true;
  uint32_t* __restrict keys = keys_.data();
  for (int64_t i = 0; i < n; ++i) {
    acc[i] = before[i] + gradient[i];
    keys[i] = MagnitudeKey(acc[i]);
  }
  // The k-th largest magnitude; then every value above it, and as many equal to it as make k,
  // taken in position order (so the positions come out ascending).
  std::nth_element(keys, keys + (k_ - 1), keys + n, [](uint32_t a, uint32_t b) { return a > b; });
  const uint32_t threshold = keys[k_ - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += MagnitudeKey(acc[i]) > threshold;
  int64_t equal_left = k_ - above;
  int64_t j = 0;
  for (int64_t i = 0; i < n && j < k_; ++i) {
    const uint32_t key = MagnitudeKey(acc[i]);
    if (key > threshold || (key == threshold && equal_left-- > 0)) {
      positions_[j] = static_cast<uint32_t>(i);
      picked_[j] = acc[i];
      ++j;
    }
  }
  std::memcpy(out, positions_.data(), k_ * sizeof(uint32_t));
  char* const values = out + k_ * sizeof(uint32_t);
  EncodeValues(dtype_, picked_, values);
  // What stays behind: the values not sent, and the rounding of those sent (none for a value
  // that was not finite: the server's policy deals with it, and it must not come back).
  DecodeValues(dtype_, values, absl::MakeSpan(picked_));
  for (int64_t s = 0; s < k_; ++s) {
    float& r = acc[positions_[s]];
    r -= picked_[s];
    if (!std::isfinite(r)) r = 0;
  }
}

}  // namespace summa
