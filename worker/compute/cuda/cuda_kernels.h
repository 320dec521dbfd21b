// Launchers for Summa's CUDA kernels: plain C++ declarations (cudaStream_t is passed as void*)
// so that cuda_backend.cu and tests see no kernel syntax. Each returns cudaGetLastError() as int.
#ifndef SUMMA_WORKER_COMPUTE_CUDA_CUDA_KERNELS_H_
#define SUMMA_WORKER_COMPUTE_CUDA_CUDA_KERNELS_H_

#include <cstdint>

namespace summa::worker::cuda {

struct ConvDims {
  int batch, in_channels, height, width, out_channels, kernel, out_height, out_width;
};

int Im2Col(const ConvDims& d, const float* x, float* col, void* stream);
int Col2Im(const ConvDims& d, const float* dcol, float* dx, void* stream);
// y[n,o,p] = out[o, n*P + p] + bias[o]
int ChannelMajorToNchwBias(const ConvDims& d, const float* out, const float* bias, float* y, void* stream);
// dyt[o, n*P + p] = dy[n,o,p]
int NchwToChannelMajor(const ConvDims& d, const float* dy, float* dyt, void* stream);
// sums[r] = sum of row r of m[rows, cols] (sums[r] += with `add`). A row of many columns is cut into RowSumSlices(cols)
// slices, one block each, whose sums land in `partial` (rows * RowSumSlices(cols) floats of
// scratch) and are then summed per row: a long row no longer runs on one multiprocessor (conv1's
// bias gradient, 20 rows of 173056 columns at batch 256, took 266 us on an H200 that way). With
// `partial` null, one block per row. The order of every addition is fixed (deterministic).
constexpr int64_t kRowSliceColumns = 4096;
constexpr int64_t kMaxRowSlices = 64;
int64_t RowSumSlices(int64_t cols);
int RowSums(const float* m, int64_t rows, int64_t cols, float* sums, float* partial, bool add,
            void* stream);
// sums[c] = sum of column c of m[rows, cols].
int ColumnSums(const float* m, int64_t rows, int64_t cols, float* sums, void* stream);
// y[r, :] = bias for every row.
int BroadcastRows(const float* bias, int64_t rows, int64_t cols, float* y, void* stream);
int ReluForward(const float* x, float* y, int64_t n, void* stream);
int ReluBackward(const float* y, const float* dy, float* dx, int64_t n, void* stream);
int AvgPool2Forward(const float* x, float* y, int planes, int h, int w, void* stream);
int AvgPool2Backward(const float* dy, float* dx, int planes, int h, int w, void* stream);
// Per row: dlogits = softmax - onehot; row_loss[i] = logsumexp - logit[label] and
// row_loss[batch + i] = 0, or for a label outside [0, classes): 0 and 1 (and dlogits zero).
int SoftmaxCrossEntropy(const float* logits, const float* labels, float* dlogits, float* row_loss,
                        int batch, int classes, void* stream);
// out[i, :] = table[rows[i], :] for i < n (rows: indices stored as floats).
int Gather(const float* table, int64_t row_floats, const float* rows, int64_t n, float* out,
           void* stream);
// correct[0] += rows whose argmax is the label.
int CountCorrect(const float* logits, const float* labels, int batch, int classes,
                 unsigned long long* correct, void* stream);

}  // namespace summa::worker::cuda

#endif  // SUMMA_WORKER_COMPUTE_CUDA_CUDA_KERNELS_H_
