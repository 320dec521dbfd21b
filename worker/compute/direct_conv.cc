#include "worker/compute/direct_conv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/vector_ops.h"
#include "worker/compute/lanes.h"

namespace summa::worker::direct {
namespace {

using lanes::kLanes;
using lanes::Load;
using lanes::Mask;
using lanes::Relu;
using lanes::Store;
using lanes::Total;
using lanes::Vec;

constexpr int kTaps = kKernel * kKernel;

// A row `width` columns wide (at least kLanes) in vectors ("blocks"): at 0, 16, 32, ..., the last
// at width - 16 (overlapping the one before unless width is a multiple of 16).
int Blocks(int width) { return (width + kLanes - 1) / kLanes; }
int BlockStart(int b, int blocks, int width) { return b + 1 < blocks ? b * kLanes : width - kLanes; }

}  // namespace

// Compiled for AVX-512, AVX2 and baseline x86-64 (SUMMA_VECTOR_CLONES): with AVX-512 a block is
// one register, and a pair of blocks' 18 input vectors stay in registers across the channels.
SUMMA_VECTOR_CLONES void Forward(const ConvShape& s, const float* x, const float* w, const float* bias,
                                 float* y, bool relu) {
  const int width = s.width, ho = s.out_height(), wo = s.out_width(), o_n = s.out_channels;
  const int blocks = Blocks(wo);
  const int64_t plane = int64_t{ho} * wo;
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* image = x + n * s.height * width;
    float* out = y + n * o_n * plane;
    for (int r = 0; r < ho; ++r) {
      for (int b = 0; b < blocks; b += 2) {
        // Two blocks at once (the last one twice where there is an odd number).
        const int c0 = BlockStart(b, blocks, wo), c1 = BlockStart(std::min(b + 1, blocks - 1), blocks, wo);
        Vec in0[kTaps], in1[kTaps];
        for (int t = 0; t < kTaps; ++t) {
          const float* at = image + (r + t / kKernel) * width + t % kKernel;
          in0[t] = Load(at + c0);
          in1[t] = Load(at + c1);
        }
        for (int o = 0; o < o_n; ++o) {
          // One order of operations for every column: where blocks overlap, both write the same
          // bits.
          Vec a0 = Vec{} + bias[o], a1 = a0;
          for (int t = 0; t < kTaps; ++t) {
            const float k = w[o * kTaps + t];
            a0 += k * in0[t];
            a1 += k * in1[t];
          }
          if (relu) {
            a0 = Relu(a0);
            a1 = Relu(a1);
          }
          float* row = out + o * plane + int64_t{r} * wo;
          Store(row + c0, a0);
          Store(row + c1, a1);
        }
      }
    }
  }
}

SUMMA_VECTOR_CLONES void ForwardReluPool(const ConvShape& s, const float* x, const float* w, const float* bias,
                                         float* y, float* pooled) {
  using Half = float __attribute__((vector_size(kLanes / 2 * sizeof(float))));
  const int width = s.width, ho = s.out_height(), wo = s.out_width(), o_n = s.out_channels;
  const int blocks = Blocks(wo), pooled_width = wo / 2;
  const int64_t plane = int64_t{ho} * wo, pooled_plane = int64_t{ho / 2} * pooled_width;
  // AvgPool2Forward's order: ((top left + top right) + bottom left) + bottom right, then / 4.
  auto pool = [](const Vec& top, const Vec& bottom) {
    Half sum = __builtin_shufflevector(top, top, 0, 2, 4, 6, 8, 10, 12, 14) +
               __builtin_shufflevector(top, top, 1, 3, 5, 7, 9, 11, 13, 15);
    sum += __builtin_shufflevector(bottom, bottom, 0, 2, 4, 6, 8, 10, 12, 14);
    sum += __builtin_shufflevector(bottom, bottom, 1, 3, 5, 7, 9, 11, 13, 15);
    return 0.25f * sum;
  };
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* image = x + n * s.height * width;
    float* out = y + n * o_n * plane;
    float* pooled_out = pooled + n * o_n * pooled_plane;
    for (int r = 0; r < ho; r += 2) {
      for (int b = 0; b < blocks; b += 2) {
        const int c0 = BlockStart(b, blocks, wo), c1 = BlockStart(std::min(b + 1, blocks - 1), blocks, wo);
        // Input rows r to r + 3 under output rows r and r + 1.
        Vec in0[kKernel + 1][kKernel], in1[kKernel + 1][kKernel];
        for (int i = 0; i <= kKernel; ++i) {
          for (int j = 0; j < kKernel; ++j) {
            const float* at = image + (r + i) * width + j;
            in0[i][j] = Load(at + c0);
            in1[i][j] = Load(at + c1);
          }
        }
        for (int o = 0; o < o_n; ++o) {
          // Forward's order of operations, so that y is its bits.
          Vec top0 = Vec{} + bias[o], top1 = top0, bottom0 = top0, bottom1 = top0;
          for (int t = 0; t < kTaps; ++t) {
            const float k = w[o * kTaps + t];
            const int i = t / kKernel, j = t % kKernel;
            top0 += k * in0[i][j];
            top1 += k * in1[i][j];
            bottom0 += k * in0[i + 1][j];
            bottom1 += k * in1[i + 1][j];
          }
          top0 = Relu(top0);
          top1 = Relu(top1);
          bottom0 = Relu(bottom0);
          bottom1 = Relu(bottom1);
          float* row = out + o * plane + int64_t{r} * wo;
          Store(row + c0, top0);
          Store(row + c1, top1);
          Store(row + wo + c0, bottom0);
          Store(row + wo + c1, bottom1);
          float* pooled_row = pooled_out + o * pooled_plane + int64_t{r / 2} * pooled_width;
          const Half p0 = pool(top0, bottom0), p1 = pool(top1, bottom1);
          std::memcpy(pooled_row + c0 / 2, &p0, sizeof p0);
          std::memcpy(pooled_row + c1 / 2, &p1, sizeof p1);
        }
      }
    }
  }
}

SUMMA_VECTOR_CLONES void BackwardWeights(const ConvShape& s, const float* x, const float* dy, float* dw,
                                         float* dbias) {
  const int width = s.width, ho = s.out_height(), wo = s.out_width(), o_n = s.out_channels;
  const int blocks = Blocks(wo), last = BlockStart(blocks - 1, blocks, wo);
  const int64_t plane = int64_t{ho} * wo;
  // The last block's lanes that the block before it has not counted.
  Mask fresh;
  for (int lane = 0; lane < kLanes; ++lane) fresh[lane] = last + lane >= (blocks - 1) * kLanes ? -1 : 0;
  for (int o0 = 0; o0 < o_n; o0 += 2) {
    // Two channels at once (the last one twice where there is an odd number): 18 tap sums and
    // two bias sums, in registers over the whole batch.
    const int o1 = std::min(o0 + 1, o_n - 1);
    Vec acc0[kTaps] = {}, acc1[kTaps] = {}, bias0 = {}, bias1 = {};
    for (int64_t n = 0; n < s.batch; ++n) {
      const float* image = x + n * s.height * width;
      const float* dy0 = dy + (n * o_n + o0) * plane;
      const float* dy1 = dy + (n * o_n + o1) * plane;
      for (int r = 0; r < ho; ++r) {
        for (int b = 0; b < blocks; ++b) {
          const int c = BlockStart(b, blocks, wo);
          Vec d0 = Load(dy0 + int64_t{r} * wo + c), d1 = Load(dy1 + int64_t{r} * wo + c);
          if (b == blocks - 1) {  // bitwise: zero where the mask is
            d0 = reinterpret_cast<Vec>(reinterpret_cast<Mask>(d0) & fresh);
            d1 = reinterpret_cast<Vec>(reinterpret_cast<Mask>(d1) & fresh);
          }
          bias0 += d0;
          bias1 += d1;
          for (int t = 0; t < kTaps; ++t) {
            const Vec in = Load(image + (r + t / kKernel) * width + t % kKernel + c);
            acc0[t] += d0 * in;
            acc1[t] += d1 * in;
          }
        }
      }
    }
    for (int t = 0; t < kTaps; ++t) {
      dw[o0 * kTaps + t] = Total(acc0[t]);
      dw[o1 * kTaps + t] = Total(acc1[t]);
    }
    dbias[o0] = Total(bias0);
    dbias[o1] = Total(bias1);
  }
}

}  // namespace summa::worker::direct
