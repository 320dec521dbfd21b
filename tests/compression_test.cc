#include "common/compression.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace summa {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

std::vector<uint16_t> Encode16(WireDType dtype, const std::vector<float>& in) {
  std::vector<uint16_t> out(in.size());
  EncodeValues(dtype, in, out.data());
  return out;
}

TEST(CompressionTest, Bfloat16RoundsToNearestEvenAndKeepsNaN) {
  const std::vector<float> in = {
      1.0f, FromBits(0x3f808000),  // a tie, the kept bit even: down
      FromBits(0x3f818000),        // a tie, the kept bit odd: up
      FromBits(0x3f808001),        // above the tie: up
      -2.5f, std::numeric_limits<float>::infinity(), FromBits(0x7f7fffff),  // max float rounds to infinity
      std::numeric_limits<float>::quiet_NaN(), FromBits(0x7f800001), 0.0f, -0.0f};
  const std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f80, 0x7f80,
                                      0x7fc0, 0x7fc0, 0x0000, 0x8000};
  EXPECT_EQ(Encode16(WireDType::kBfloat16, in), want);
  // Every finite bfloat16 widens to the float32 it is and encodes back to itself.
  std::vector<uint16_t> all(1 << 16);
  for (uint32_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> wide(all.size());
  DecodeValues(WireDType::kBfloat16, all.data(), absl::MakeSpan(wide));
  const std::vector<uint16_t> back = Encode16(WireDType::kBfloat16, wide);
  for (uint32_t h = 0; h < all.size(); ++h) {
    ASSERT_EQ(Bits(wide[h]), h << 16) << h;
    if (!std::isnan(wide[h])) {
      ASSERT_EQ(back[h], h) << h;
    }
  }
}

TEST(CompressionTest, Float16RoundsToNearestEvenAtEveryRangeEdgeAndSaturatesFiniteValues) {
  // Past 65504 (the largest half) a finite value saturates; infinity stays infinity.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {1.0f, 65504.0f, 65519.0f, 65520.0f, -1e6f, FromBits(0x7f7fffff), inf, -inf,
                                 std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.5f, -25),
                                 std::ldexp(3.0f, -25),  // a subnormal tie, rounds to even (2 * 2^-24)
                                 std::ldexp(1.0f, -14), 0.1f, -0.0f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<uint16_t> want = {0x3c00, 0x7bff, 0x7bff, 0x7bff, 0xfbff, 0x7bff, 0x7c00, 0xfc00, 0x0001, 0x0000, 0x0001,
                                      0x0002, 0x0400, 0x2e66, 0x8000, 0x7e00};
  std::vector<uint16_t> portable(in.size());
  internal::ToHalfPortable(in.data(), static_cast<int64_t>(in.size()), portable.data());
  EXPECT_EQ(portable, want);
  EXPECT_EQ(Encode16(WireDType::kFloat16, in), want);
  // The vector loop (8 at a time) saturates as the scalar tail does.
  std::vector<float> eight(16, 1e5f);
  eight[3] = -7e4f;
  eight[5] = inf;
  eight[6] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint16_t> halves = Encode16(WireDType::kFloat16, eight);
  for (size_t i = 0; i < eight.size(); ++i) {
    const uint16_t expected = i == 3 ? 0xfbff : i == 5 ? 0x7c00 : i == 6 ? 0x7e00 : 0x7bff;
    EXPECT_EQ(halves[i], expected) << i;
  }
}

TEST(CompressionTest, PortableFloat16MatchesTheHardwareOnEveryHalfAndAMillionFloats) {
  if (!internal::HasF16c()) GTEST_SKIP() << "this CPU has no F16C to compare with";
  std::vector<uint16_t> all(1 << 16);
  for (uint32_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> hw(all.size()), sw(all.size());
  DecodeValues(WireDType::kFloat16, all.data(), absl::MakeSpan(hw));
  internal::FromHalfPortable(all.data(), static_cast<int64_t>(all.size()), sw.data());
  for (uint32_t h = 0; h < all.size(); ++h) ASSERT_EQ(Bits(hw[h]), Bits(sw[h])) << h;
  // Floats across the whole bit space (a stride prime to every power of two), in a length that
  // leaves a tail for the scalar loop.
  std::vector<float> floats;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) floats.push_back(FromBits(static_cast<uint32_t>(u)));
  floats.resize(floats.size() - floats.size() % 8 + 5);
  std::vector<uint16_t> a = Encode16(WireDType::kFloat16, floats), b(floats.size());
  internal::ToHalfPortable(floats.data(), static_cast<int64_t>(floats.size()), b.data());
  for (size_t i = 0; i < floats.size(); ++i) ASSERT_EQ(a[i], b[i]) << "float bits " << Bits(floats[i]);
}

TEST(CompressionTest, Float32PassesThroughAndParsingNamesTheChoices) {
  const std::vector<float> in = {1.5f, -3.25f, 7.0f};
  std::vector<float> wire(3), out(3);
  EncodeValues(WireDType::kFloat32, in, wire.data());
  DecodeValues(WireDType::kFloat32, wire.data(), absl::MakeSpan(out));
  EXPECT_EQ(out, in);
  EXPECT_EQ(*ParseWireDType("bf16"), WireDType::kBfloat16);
  EXPECT_EQ(WireDTypeBytes(WireDType::kFloat16), 2);
  EXPECT_EQ(ParseWireDType("int8").status().message(), "unknown wire dtype 'int8' (choose one of fp32, bf16, fp16)");
  EXPECT_EQ(ParseCompression("topk:0.01")->topk_ratio, 0.01);
  EXPECT_FALSE(ParseCompression("none")->sparse());
  for (const char* bad : {"topk:0", "topk:1", "topk:x", "top:0.1", "topk:-0.5", ""}) {
    EXPECT_FALSE(ParseCompression(bad).ok()) << bad;
  }
  EXPECT_EQ(CompressionName(*ParseCompression("topk:0.01")), "topk:0.01");
  EXPECT_EQ(TopKCount(1000, 0.01), 10);
  EXPECT_EQ(TopKCount(1001, 0.01), 11);  // rounded up
  EXPECT_EQ(TopKCount(10, 0.001), 1);    // never none
  EXPECT_EQ(SparseBytes(10, WireDType::kBfloat16), 60);
}

// A sparse partition as a push carries it.
std::string Sparse(const std::vector<uint32_t>& positions, const std::vector<float>& values) {
  std::string s(positions.size() * 8, '\0');
  std::memcpy(s.data(), positions.data(), positions.size() * 4);
  std::memcpy(s.data() + positions.size() * 4, values.data(), values.size() * 4);
  return s;
}

TEST(CompressionTest, DecodeSparseFillsThePositionsAndRefusesMalformedOnes) {
  std::vector<float> dense(6, 9.0f);
  ASSERT_TRUE(DecodeSparse(WireDType::kFloat32, Sparse({1, 4}, {2.5f, -1.0f}), absl::MakeSpan(dense)).ok());
  EXPECT_EQ(dense, (std::vector<float>{0, 2.5f, 0, 0, -1.0f, 0}));
  ASSERT_TRUE(DecodeSparse(WireDType::kFloat32, "", absl::MakeSpan(dense)).ok());
  EXPECT_EQ(dense, std::vector<float>(6, 0.0f));
  EXPECT_EQ(DecodeSparse(WireDType::kFloat32, Sparse({1, 6}, {1, 1}), absl::MakeSpan(dense)).message(),
            "a sparse push's position 1 is 6: positions must be strictly ascending and below 6 (the one before is 1)");
  EXPECT_FALSE(DecodeSparse(WireDType::kFloat32, Sparse({3, 3}, {1, 1}), absl::MakeSpan(dense)).ok());
  EXPECT_FALSE(DecodeSparse(WireDType::kFloat32, Sparse({3, 2}, {1, 1}), absl::MakeSpan(dense)).ok());
  EXPECT_EQ(DecodeSparse(WireDType::kBfloat16, std::string(7, '\0'), absl::MakeSpan(dense)).message(),
            "a sparse push of bf16 values is whole 6-byte entries; got 7 bytes");
  EXPECT_EQ(DecodeSparse(WireDType::kFloat32, Sparse({0, 1, 2, 3, 4, 5, 6}, std::vector<float>(7, 1)),
                         absl::MakeSpan(dense)).message(),
            "a sparse push names 7 values; the partition holds 6");
}

// What an encoder's push decodes to, densely.
std::vector<float> Sent(const TopKEncoder& e, WireDType dtype, const std::vector<char>& wire, int64_t n) {
  std::vector<float> dense(n);
  EXPECT_TRUE(DecodeSparse(dtype, absl::string_view(wire.data(), wire.size()), absl::MakeSpan(dense)).ok());
  return dense;
}

TEST(CompressionTest, TopKSendsTheLargestMagnitudesInPositionOrder) {
  TopKEncoder e(8, 3, WireDType::kFloat32);
  std::vector<char> wire(e.bytes());
  e.Encode({0.5f, -7.0f, 1.0f, 3.0f, -0.25f, 6.0f, 2.0f, 0.0f}, wire.data());
  std::vector<uint32_t> positions(3);
  std::memcpy(positions.data(), wire.data(), 12);
  EXPECT_EQ(positions, (std::vector<uint32_t>{1, 3, 5}));
  EXPECT_EQ(Sent(e, WireDType::kFloat32, wire, 8), (std::vector<float>{0, -7, 0, 3, 0, 6, 0, 0}));
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()),
            (std::vector<float>{0.5f, 0, 1.0f, 0, -0.25f, 0, 2.0f, 0}));
  // Equal magnitudes: the first positions win.
  TopKEncoder ties(5, 2, WireDType::kFloat32);
  ties.Encode({1, -1, 1, 1, -1}, wire.data());
  std::memcpy(positions.data(), wire.data(), 8);
  EXPECT_EQ(positions[0], 0u);
  EXPECT_EQ(positions[1], 1u);
}

TEST(CompressionTest, ErrorFeedbackSendsWhatEarlierPushesLeftOut) {
  // [3, 1] each step with k = 1: position 0 goes out three times (the third a tie, 3 against 3,
  // which the first position wins), while position 1's residual grows to 4 and goes out fourth.
  TopKEncoder e(2, 1, WireDType::kFloat32);
  std::vector<char> wire(e.bytes());
  for (int step = 0; step < 3; ++step) {
    e.Encode({3, 1}, wire.data());
    EXPECT_EQ(Sent(e, WireDType::kFloat32, wire, 2), (std::vector<float>{3, 0})) << step;
  }
  e.Encode({3, 1}, wire.data());
  EXPECT_EQ(Sent(e, WireDType::kFloat32, wire, 2), (std::vector<float>{0, 4}));
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{3, 0}));
}

TEST(CompressionTest, WhatIsSentPlusWhatIsKeptIsExactlyWhatWasComputed) {
  // Each step, for every position: sent (as the server decodes it) + residual after = residual
  // before + gradient, bit for bit, rounding to the wire dtype included.
  for (WireDType dtype : {WireDType::kFloat32, WireDType::kBfloat16, WireDType::kFloat16}) {
    const int64_t n = 1000;
    TopKEncoder e(n, 37, dtype);
    std::vector<char> wire(e.bytes());
    std::vector<float> before(n, 0.0f), g(n);
    uint32_t seed = 12345;
    for (int step = 0; step < 20; ++step) {
      for (float& x : g) {
        seed = seed * 1664525u + 1013904223u;
        x = (static_cast<float>(seed >> 8) / 16777216.0f - 0.5f) * 0.01f;
      }
      e.Encode(g, wire.data());
      const std::vector<float> sent = Sent(e, dtype, wire, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(sent[i] + e.residual()[i], before[i] + g[i])
            << WireDTypeName(dtype) << " step " << step << " position " << i;
      }
      before.assign(e.residual().begin(), e.residual().end());
    }
  }
}

TEST(CompressionTest, TopKInFloat16KeepsWhatSaturationLeftOut) {
  TopKEncoder e(2, 1, WireDType::kFloat16);
  std::vector<char> wire(e.bytes());
  e.Encode({1e5f, 1.0f}, wire.data());
  EXPECT_EQ(Sent(e, WireDType::kFloat16, wire, 2), (std::vector<float>{65504.0f, 0}));
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{1e5f - 65504.0f, 1}));
}

TEST(CompressionTest, UndoTakesTheLastEncodeBackOnceAndResetForgetsEverything) {
  TopKEncoder e(3, 1, WireDType::kFloat32);
  std::vector<char> wire(e.bytes());
  e.Undo();  // nothing to take back
  e.Encode({4, 2, 1}, wire.data());
  e.Encode({1, 1, 1}, wire.data());  // acc [1, 3, 2]: 3 goes out
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{1, 0, 2}));
  e.Undo();
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{0, 2, 1}));
  e.Undo();  // once only
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{0, 2, 1}));
  e.Encode({1, 1, 1}, wire.data());
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{1, 0, 2}));
  e.Reset();
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{0, 0, 0}));
  e.Undo();  // a reset is not taken back
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{0, 0, 0}));
}

TEST(CompressionTest, AnEmptyPartitionSendsNothing) {
  TopKEncoder e(0, 5, WireDType::kBfloat16);
  EXPECT_EQ(e.k(), 0);
  EXPECT_EQ(e.bytes(), 0);
  e.Encode({}, nullptr);
  EXPECT_TRUE(e.residual().empty());
}

TEST(CompressionTest, NonFiniteValuesAreSentFirstAndNotKept) {
  TopKEncoder e(4, 1, WireDType::kFloat32);
  std::vector<char> wire(e.bytes());
  e.Encode({100.0f, std::numeric_limits<float>::quiet_NaN(), 5.0f, 1.0f}, wire.data());
  const std::vector<float> sent = Sent(e, WireDType::kFloat32, wire, 4);
  EXPECT_TRUE(std::isnan(sent[1]));
  EXPECT_EQ(std::vector<float>(e.residual().begin(), e.residual().end()), (std::vector<float>{100, 0, 5, 1}));
}

}  // namespace
}  // namespace summa
