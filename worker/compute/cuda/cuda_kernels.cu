// Summa's CUDA kernels: everything LeNet needs besides the matrix products (cuBLAS).
#include <cuda_runtime.h>

#include <algorithm>

#include "worker/compute/cuda/cuda_kernels.h"

namespace summa::worker::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }
cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }
int Last() { return static_cast<int>(cudaGetLastError()); }

// The element-wise kernels below index with I: int32_t where every array they touch is small
// enough (Fits32), else int64_t. A 64-bit division costs several times a 32-bit one, and these
// kernels divide per element: conv1's im2col took 111 us per call on an H200 in 64 bits.
constexpr int64_t kMax32 = int64_t{1} << 30;  // leaves room for the grid stride past the end
bool Fits32(int64_t n) { return n < kMax32; }

// One thread per col element: col[(c*k + ki)*k + kj][n*P + oh*Wo + ow] = x[n][c][oh+ki][ow+kj].
template <typename I>
__global__ void Im2ColKernel(ConvDims d, const float* __restrict__ x, float* __restrict__ col) {
  const I pixels = I(d.out_height) * d.out_width;
  const I np = I(d.batch) * pixels;
  const I total = I(d.in_channels) * d.kernel * d.kernel * np;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I row = i / np, column = i % np;
    const int kj = row % d.kernel, ki = (row / d.kernel) % d.kernel;
    const int c = static_cast<int>(row / (d.kernel * d.kernel));
    const int n = static_cast<int>(column / pixels);
    const int p = static_cast<int>(column % pixels);
    const int oh = p / d.out_width, ow = p % d.out_width;
    col[i] = x[((I(n) * d.in_channels + c) * d.height + oh + ki) * d.width + ow + kj];
  }
}

// One thread per dx element, gathering every col entry that came from it (no atomics).
template <typename I>
__global__ void Col2ImKernel(ConvDims d, const float* __restrict__ dcol, float* __restrict__ dx) {
  const I pixels = I(d.out_height) * d.out_width;
  const I np = I(d.batch) * pixels;
  const I total = I(d.batch) * d.in_channels * d.height * d.width;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const int w = i % d.width, h = (i / d.width) % d.height;
    const int c = (i / (I(d.width) * d.height)) % d.in_channels;
    const int n = static_cast<int>(i / (I(d.width) * d.height * d.in_channels));
    float sum = 0;
    for (int ki = 0; ki < d.kernel; ++ki) {
      const int oh = h - ki;
      if (oh < 0 || oh >= d.out_height) continue;
      for (int kj = 0; kj < d.kernel; ++kj) {
        const int ow = w - kj;
        if (ow < 0 || ow >= d.out_width) continue;
        const I row = (I(c) * d.kernel + ki) * d.kernel + kj;
        sum += dcol[row * np + n * pixels + oh * d.out_width + ow];
      }
    }
    dx[i] = sum;
  }
}

template <typename I>
__global__ void ChannelMajorToNchwBiasKernel(ConvDims d, const float* __restrict__ out,
                                             const float* __restrict__ bias, float* __restrict__ y) {
  const I pixels = I(d.out_height) * d.out_width;
  const I total = I(d.batch) * d.out_channels * pixels;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I p = i % pixels;
    const int o = (i / pixels) % d.out_channels;
    const I n = i / (pixels * d.out_channels);
    y[i] = out[o * d.batch * pixels + n * pixels + p] + bias[o];
  }
}

template <typename I>
__global__ void NchwToChannelMajorKernel(ConvDims d, const float* __restrict__ dy,
                                         float* __restrict__ dyt) {
  const I pixels = I(d.out_height) * d.out_width;
  const I total = I(d.batch) * d.out_channels * pixels;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I p = i % pixels;
    const int o = (i / pixels) % d.out_channels;
    const I n = i / (pixels * d.out_channels);
    dyt[o * d.batch * pixels + n * pixels + p] = dy[i];
  }
}

// The sum of x[c * stride] for c in [begin, end) over the block, valid in thread 0 (blockDim.x ==
// kThreads). Every thread adds a fixed set of elements and the tree below is fixed, so the result
// does not depend on timing.
__device__ float BlockSum(const float* __restrict__ x, int64_t begin, int64_t end, int64_t stride) {
  __shared__ float partial[kThreads];
  float s = 0;
  for (int64_t c = begin + threadIdx.x; c < end; c += blockDim.x) s += x[c * stride];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  return partial[0];
}

// Block (slice, r): sums[r * gridDim.x + slice] = the sum of the slice of row r of m[rows, cols]
// (plus what was there when `add`); with one slice, the row's sum.
__global__ void RowSlicesKernel(const float* __restrict__ m, int64_t cols, bool add,
                                float* __restrict__ sums) {
  const int64_t per = (cols + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * per;
  const int64_t end = begin + per < cols ? begin + per : cols;
  const float s = BlockSum(m + blockIdx.y * cols, begin, end, 1);
  float* out = sums + int64_t{blockIdx.y} * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) *out = add ? *out + s : s;
}

// Block c: sums[c] = the sum of column c of m[rows, cols], the block's threads taking the rows in
// turn (a thread per column summing every row alone took 27 us for the linear layers' bias
// gradients, 256 rows, on an H200).
__global__ void ColumnSumsKernel(const float* __restrict__ m, int64_t rows, int64_t cols,
                                 float* __restrict__ sums) {
  const float s = BlockSum(m + blockIdx.x, 0, rows, cols);
  if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

__global__ void BroadcastRowsKernel(const float* __restrict__ bias, int64_t rows, int64_t cols,
                                    float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = bias[i % cols];
  }
}

__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = fmaxf(x[i], 0.0f);
  }
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

template <typename I>
__global__ void AvgPool2ForwardKernel(const float* __restrict__ x, float* __restrict__ y,
                                      int planes, int h, int w) {
  const int oh = h / 2, ow = w / 2;
  const I total = I(planes) * oh * ow;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const int j = i % ow, r = (i / ow) % oh;
    const I p = i / (I(oh) * ow);
    const float* base = x + p * h * w + (2 * r) * w + 2 * j;
    y[i] = 0.25f * (base[0] + base[1] + base[w] + base[w + 1]);
  }
}

// One thread per dx element: a quarter of its window's gradient, zero on dropped odd edges.
template <typename I>
__global__ void AvgPool2BackwardKernel(const float* __restrict__ dy, float* __restrict__ dx,
                                       int planes, int h, int w) {
  const int oh = h / 2, ow = w / 2;
  const I total = I(planes) * h * w;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const int c = i % w, r = (i / w) % h;
    const I p = i / (I(h) * w);
    const int pr = r / 2, pc = c / 2;
    dx[i] = (pr < oh && pc < ow) ? 0.25f * dy[p * oh * ow + pr * ow + pc] : 0.0f;
  }
}

__global__ void SoftmaxCrossEntropyKernel(const float* __restrict__ logits,
                                          const float* __restrict__ labels,
                                          float* __restrict__ dlogits, float* __restrict__ row_loss,
                                          int batch, int classes) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= batch) return;
  const float* z = logits + int64_t{i} * classes;
  float* d = dlogits + int64_t{i} * classes;
  const int label = static_cast<int>(labels[i]);
  if (label < 0 || label >= classes) {
    row_loss[i] = 0;
    row_loss[batch + i] = 1;
    for (int c = 0; c < classes; ++c) d[c] = 0;
    return;
  }
  float m = z[0];
  for (int c = 1; c < classes; ++c) m = fmaxf(m, z[c]);
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(z[c] - m));
  const double lse = m + log(sum);
  row_loss[i] = static_cast<float>(lse - z[label]);
  row_loss[batch + i] = 0;
  for (int c = 0; c < classes; ++c) {
    d[c] = static_cast<float>(exp(z[c] - lse)) - (c == label ? 1.0f : 0.0f);
  }
}

// One thread per output float: out[i, :] = table[rows[i], :].
__global__ void GatherKernel(const float* __restrict__ table, int64_t row_floats,
                             const float* __restrict__ rows, int64_t n, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * row_floats;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / row_floats;
    out[i] = table[static_cast<int64_t>(rows[r]) * row_floats + i % row_floats];
  }
}

__global__ void CountCorrectKernel(const float* __restrict__ logits,
                                   const float* __restrict__ labels, int batch, int classes,
                                   unsigned long long* correct) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= batch) return;
  const float* z = logits + int64_t{i} * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c) {
    if (z[c] > z[best]) best = c;
  }
  if (best == static_cast<int>(labels[i])) atomicAdd(correct, 1ull);
}

int Grid(int64_t n) { return n == 0 ? 1 : static_cast<int>(std::min<int64_t>(Blocks(n), 65535)); }

}  // namespace

// The floats of a convolution's input, its im2col matrix and its output.
int64_t InputFloats(const ConvDims& d) { return int64_t{d.batch} * d.in_channels * d.height * d.width; }
int64_t ColFloats(const ConvDims& d) {
  return int64_t{d.in_channels} * d.kernel * d.kernel * d.batch * d.out_height * d.out_width;
}
int64_t OutputFloats(const ConvDims& d) { return int64_t{d.batch} * d.out_channels * d.out_height * d.out_width; }

int Im2Col(const ConvDims& d, const float* x, float* col, void* stream) {
  const int64_t total = ColFloats(d);
  if (Fits32(total) && Fits32(InputFloats(d))) {
    Im2ColKernel<int32_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, x, col);
  } else {
    Im2ColKernel<int64_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, x, col);
  }
  return Last();
}
int Col2Im(const ConvDims& d, const float* dcol, float* dx, void* stream) {
  const int64_t total = InputFloats(d);
  if (Fits32(total) && Fits32(ColFloats(d))) {
    Col2ImKernel<int32_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, dcol, dx);
  } else {
    Col2ImKernel<int64_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, dcol, dx);
  }
  return Last();
}
int ChannelMajorToNchwBias(const ConvDims& d, const float* out, const float* bias, float* y, void* stream) {
  const int64_t total = OutputFloats(d);
  if (Fits32(total)) {
    ChannelMajorToNchwBiasKernel<int32_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, out, bias, y);
  } else {
    ChannelMajorToNchwBiasKernel<int64_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, out, bias, y);
  }
  return Last();
}
int NchwToChannelMajor(const ConvDims& d, const float* dy, float* dyt, void* stream) {
  const int64_t total = OutputFloats(d);
  if (Fits32(total)) {
    NchwToChannelMajorKernel<int32_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, dy, dyt);
  } else {
    NchwToChannelMajorKernel<int64_t><<<Grid(total), kThreads, 0, S(stream)>>>(d, dy, dyt);
  }
  return Last();
}
int64_t RowSumSlices(int64_t cols) {
  return std::max<int64_t>(1, std::min<int64_t>(kMaxRowSlices, cols / kRowSliceColumns));
}
int RowSums(const float* m, int64_t rows, int64_t cols, float* sums, float* partial, bool add,
            void* stream) {
  if (rows == 0) return 0;
  const int64_t slices = partial == nullptr ? 1 : RowSumSlices(cols);
  const dim3 per_row(1, static_cast<unsigned>(rows));
  if (slices == 1) {
    RowSlicesKernel<<<per_row, kThreads, 0, S(stream)>>>(m, cols, add, sums);
    return Last();
  }
  RowSlicesKernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(rows)), kThreads, 0,
                    S(stream)>>>(m, cols, false, partial);
  const int e = Last();
  if (e != 0) return e;
  RowSlicesKernel<<<per_row, kThreads, 0, S(stream)>>>(partial, slices, add, sums);
  return Last();
}
int ColumnSums(const float* m, int64_t rows, int64_t cols, float* sums, void* stream) {
  if (cols == 0) return 0;
  ColumnSumsKernel<<<static_cast<unsigned>(cols), kThreads, 0, S(stream)>>>(m, rows, cols, sums);
  return Last();
}
int BroadcastRows(const float* bias, int64_t rows, int64_t cols, float* y, void* stream) {
  BroadcastRowsKernel<<<Grid(rows * cols), kThreads, 0, S(stream)>>>(bias, rows, cols, y);
  return Last();
}
int ReluForward(const float* x, float* y, int64_t n, void* stream) {
  ReluForwardKernel<<<Grid(n), kThreads, 0, S(stream)>>>(x, y, n);
  return Last();
}
int ReluBackward(const float* y, const float* dy, float* dx, int64_t n, void* stream) {
  ReluBackwardKernel<<<Grid(n), kThreads, 0, S(stream)>>>(y, dy, dx, n);
  return Last();
}
int AvgPool2Forward(const float* x, float* y, int planes, int h, int w, void* stream) {
  const int64_t total = int64_t{planes} * (h / 2) * (w / 2);
  if (Fits32(int64_t{planes} * h * w)) {
    AvgPool2ForwardKernel<int32_t><<<Grid(total), kThreads, 0, S(stream)>>>(x, y, planes, h, w);
  } else {
    AvgPool2ForwardKernel<int64_t><<<Grid(total), kThreads, 0, S(stream)>>>(x, y, planes, h, w);
  }
  return Last();
}
int AvgPool2Backward(const float* dy, float* dx, int planes, int h, int w, void* stream) {
  const int64_t total = int64_t{planes} * h * w;
  if (Fits32(total)) {
    AvgPool2BackwardKernel<int32_t><<<Grid(total), kThreads, 0, S(stream)>>>(dy, dx, planes, h, w);
  } else {
    AvgPool2BackwardKernel<int64_t><<<Grid(total), kThreads, 0, S(stream)>>>(dy, dx, planes, h, w);
  }
  return Last();
}
int SoftmaxCrossEntropy(const float* logits, const float* labels, float* dlogits, float* row_loss,
                        int batch, int classes, void* stream) {
  SoftmaxCrossEntropyKernel<<<Grid(batch), kThreads, 0, S(stream)>>>(logits, labels, dlogits, row_loss,
                                                                     batch, classes);
  return Last();
}
int Gather(const float* table, int64_t row_floats, const float* rows, int64_t n, float* out,
           void* stream) {
  GatherKernel<<<Grid(n * row_floats), kThreads, 0, S(stream)>>>(table, row_floats, rows, n, out);
  return Last();
}
int CountCorrect(const float* logits, const float* labels, int batch, int classes,
                 unsigned long long* correct, void* stream) {
  CountCorrectKernel<<<Grid(batch), kThreads, 0, S(stream)>>>(logits, labels, batch, classes, correct);
  return Last();
}

}  // namespace summa::worker::cuda
