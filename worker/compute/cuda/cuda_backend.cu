// The CUDA backend: cuBLAS for every matrix product, Summa's kernels (cuda_kernels.cu) for the
// rest, all on one stream per device. Every CUDA or cuBLAS failure becomes a status naming the
// device, the operation and the CUDA error.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/cuda/cuda_backend.h"
#include "worker/compute/cuda/cuda_kernels.h"

namespace summa::worker {
namespace {

#define SUMMA_CUDA_RETURN_IF_ERROR(expr, op)                        \
  do {                                                              \
    const cudaError_t summa_cuda_err_ = (expr);                     \
    if (summa_cuda_err_ != cudaSuccess) return Error(summa_cuda_err_, op); \
  } while (0)
#define SUMMA_KERNEL_RETURN_IF_ERROR(expr, op) \
  SUMMA_CUDA_RETURN_IF_ERROR(static_cast<cudaError_t>(expr), op)
#define SUMMA_CUBLAS_RETURN_IF_ERROR(expr, op)                        \
  do {                                                                \
    const cublasStatus_t summa_cublas_st_ = (expr);                   \
    if (summa_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                  \
      return absl::InternalError(absl::StrCat(name(), " ", op, ": ",  \
                                              cublasGetStatusString(summa_cublas_st_))); \
    }                                                                 \
  } while (0)

class CudaDeviceBuffer final : public DeviceBuffer {
 public:
  CudaDeviceBuffer(float* data, int64_t n, int device) : DeviceBuffer(data, n), device_(device) {}
  ~CudaDeviceBuffer() override {
    cudaSetDevice(device_);
    cudaFree(data_);
  }

 private:
  int device_;
};

class PinnedBuffer final : public DeviceBuffer {
 public:
  PinnedBuffer(float* data, int64_t n) : DeviceBuffer(data, n) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
};

cuda::ConvDims Dims(const ConvShape& s) {
  return {s.batch, s.in_channels, s.height, s.width, s.out_channels, s.kernel, s.out_height(),
          s.out_width()};
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream, cublasHandle_t cublas)
      : device_(device), stream_(stream), cublas_(cublas) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (host_scalars_ != nullptr) cudaFreeHost(host_scalars_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  int preferred_chunk() const override { return 0; }
  bool host_memory() const override { return false; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Makes this backend's device current: the first thing every operation that allocates or
  // launches does, since the stream, cuBLAS handle and buffers all belong to device_ and a
  // caller may have used another device (a worker with --devices=cuda:0,cuda:1) in between.
  absl::Status OnDevice() const {
    SUMMA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    return absl::OkStatus();
  }

  absl::Status Error(cudaError_t e, const char* op) const {
    return absl::InternalError(absl::StrCat(name(), " ", op, ": ", cudaGetErrorName(e), ": ",
                                            cudaGetErrorString(e)));
  }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Alloc(int64_t floats) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    void* p = nullptr;
    const size_t bytes = std::max<int64_t>(floats, 1) * sizeof(float);
    SUMMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes), "cudaMalloc");
    auto buffer = std::make_unique<CudaDeviceBuffer>(static_cast<float*>(p), floats, device_);
    SUMMA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
    return std::unique_ptr<DeviceBuffer>(std::move(buffer));
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocHost(int64_t floats) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    void* p = nullptr;
    const size_t bytes = std::max<int64_t>(floats, 1) * sizeof(float);
    SUMMA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes), "cudaMallocHost");
    std::memset(p, 0, bytes);
    return std::unique_ptr<DeviceBuffer>(new PinnedBuffer(static_cast<float*>(p), floats));
  }
  absl::Status Upload(const float* host, int64_t n, float* device) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "Upload");
    return absl::OkStatus();
  }
  absl::Status Download(const float* device, int64_t n, float* host) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "Download");
    SUMMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "Download (synchronize)");
    return absl::OkStatus();
  }
  absl::Status Zero(float* device, int64_t n) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device, 0, n * sizeof(float), stream_), "Zero");
    return absl::OkStatus();
  }
  absl::Status Gather(const float* table, int64_t row_floats, const float* rows, int n,
                      float* out) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::Gather(table, row_floats, rows, n, out, stream_), "Gather");
    return absl::OkStatus();
  }
  absl::Status CopyFromPeer(const Backend& from, const float* src, int64_t n, float* dst) override {
    const auto* peer = dynamic_cast<const CudaBackend*>(&from);
    if (peer == nullptr) {
      return absl::UnimplementedError(absl::StrCat("cannot copy from ", from.name(), " to ", name()));
    }
    SUMMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(peer->stream()), "CopyFromPeer (source)");
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyPeerAsync(dst, device_, src, peer->device(), n * sizeof(float), stream_),
        "CopyFromPeer");
    return absl::OkStatus();
  }

  absl::Status Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    SUMMA_CUBLAS_RETURN_IF_ERROR(
        cublasSgemm(cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                    &alpha, b, tb ? k : n, a, ta ? m : k, &beta, c, n),
        "Gemm");
    return absl::OkStatus();
  }

  absl::Status Conv2dForward(const ConvShape& s, const float* x, const float* w, const float* bias,
                             float* y, float* workspace) override {
    const cuda::ConvDims d = Dims(s);
    const int ckk = s.in_channels * s.kernel * s.kernel;
    const int np = static_cast<int>(s.batch * s.pixels());
    float* col = workspace;
    float* out = workspace + 2 * s.col_floats();
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::Im2Col(d, x, col, stream_), "Conv2dForward im2col");
    SUMMA_RETURN_IF_ERROR(Gemm(false, false, s.out_channels, np, ckk, 1.0f, w, col, 0.0f, out));
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::ChannelMajorToNchwBias(d, out, bias, y, stream_),
                                 "Conv2dForward bias");
    return absl::OkStatus();
  }

  absl::Status Conv2dBackward(const ConvShape& s, const float* x, const float* w, const float* dy,
                              float* dx, float* dw, float* dbias, float* workspace,
                              bool columns_ready) override {
    const cuda::ConvDims d = Dims(s);
    const int ckk = s.in_channels * s.kernel * s.kernel;
    const int np = static_cast<int>(s.batch * s.pixels());
    float* col = workspace;
    float* dcol = workspace + s.col_floats();
    float* dyt = workspace + 2 * s.col_floats();
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::NchwToChannelMajor(d, dy, dyt, stream_), "Conv2dBackward transpose");
    // dcol's space is free until the dx product below: scratch for the row sums' slices.
    float* partial = s.out_channels * cuda::RowSumSlices(np) <= s.col_floats() ? dcol : nullptr;
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::RowSums(dyt, s.out_channels, np, dbias, partial, /*add=*/false, stream_),
                                 "Conv2dBackward dbias");
    if (!columns_ready) {
      SUMMA_KERNEL_RETURN_IF_ERROR(cuda::Im2Col(d, x, col, stream_), "Conv2dBackward im2col");
    }
    SUMMA_RETURN_IF_ERROR(Gemm(false, true, s.out_channels, ckk, np, 1.0f, dyt, col, 0.0f, dw));
    if (dx != nullptr) {
      SUMMA_RETURN_IF_ERROR(Gemm(true, false, ckk, np, s.out_channels, 1.0f, w, dyt, 0.0f, dcol));
      SUMMA_KERNEL_RETURN_IF_ERROR(cuda::Col2Im(d, dcol, dx, stream_), "Conv2dBackward col2im");
    }
    return absl::OkStatus();
  }

  absl::Status ReluForward(const float* x, float* y, int64_t n) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::ReluForward(x, y, n, stream_), "ReluForward");
    return absl::OkStatus();
  }
  absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::ReluBackward(y, dy, dx, n, stream_), "ReluBackward");
    return absl::OkStatus();
  }
  absl::Status AvgPool2Forward(const float* x, float* y, int planes, int h, int w) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::AvgPool2Forward(x, y, planes, h, w, stream_), "AvgPool2Forward");
    return absl::OkStatus();
  }
  absl::Status AvgPool2Backward(const float* dy, float* dx, int planes, int h, int w) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::AvgPool2Backward(dy, dx, planes, h, w, stream_), "AvgPool2Backward");
    return absl::OkStatus();
  }

  absl::Status LinearForward(const float* x, const float* w, const float* bias, float* y, int batch,
                             int in, int out) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::BroadcastRows(bias, batch, out, y, stream_), "LinearForward bias");
    return Gemm(false, false, batch, out, in, 1.0f, x, w, 1.0f, y);
  }
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                              float* dbias, int batch, int in, int out) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_RETURN_IF_ERROR(Gemm(true, false, in, out, batch, 1.0f, x, dy, 0.0f, dw));
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::ColumnSums(dy, batch, out, dbias, stream_), "LinearBackward dbias");
    if (dx != nullptr) return Gemm(false, true, batch, in, out, 1.0f, dy, w, 0.0f, dx);
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, float* dlogits,
                                   int batch, int classes, float* totals) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUDA_RETURN_IF_ERROR(EnsureScratch(2 * int64_t{batch}), "SoftmaxCrossEntropy scratch");
    float* row_loss = scratch_;  // [2, batch]: each row's loss, and 1 where its label is bad
    SUMMA_KERNEL_RETURN_IF_ERROR(
        cuda::SoftmaxCrossEntropy(logits, labels, dlogits, row_loss, batch, classes, stream_),
        "SoftmaxCrossEntropy");
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::RowSums(row_loss, 2, batch, totals, nullptr, /*add=*/true, stream_),
                                 "SoftmaxCrossEntropy totals");
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> CountCorrect(const float* logits, const float* labels, int batch,
                                       int classes) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUDA_RETURN_IF_ERROR(EnsureScratch(batch), "CountCorrect scratch");
    auto* correct = reinterpret_cast<unsigned long long*>(scratch_);
    SUMMA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(correct, 0, sizeof(*correct), stream_), "CountCorrect");
    SUMMA_KERNEL_RETURN_IF_ERROR(cuda::CountCorrect(logits, labels, batch, classes, correct, stream_),
                                 "CountCorrect");
    unsigned long long host = 0;
    SUMMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_scalars_, correct, sizeof(host),
                                               cudaMemcpyDeviceToHost, stream_), "CountCorrect copy");
    SUMMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "CountCorrect");
    std::memcpy(&host, host_scalars_, sizeof(host));
    return static_cast<int64_t>(host);
  }

  absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) override {
    SUMMA_RETURN_IF_ERROR(OnDevice());
    SUMMA_CUBLAS_RETURN_IF_ERROR(cublasSaxpy(cublas_, static_cast<int>(n), &alpha, x, 1, y, 1), "Axpy");
    return absl::OkStatus();
  }

 private:
  // Grows (rarely: once per new batch size) the scratch for per-row losses and scalars, on
  // device_ (current: the caller has called OnDevice). scratch_floats_ only ever describes memory
  // that exists: a failed allocation leaves none recorded, so the next call tries again.
  cudaError_t EnsureScratch(int64_t floats) {
    cudaError_t e = cudaSuccess;
    if (host_scalars_ == nullptr) {
      e = cudaMallocHost(reinterpret_cast<void**>(&host_scalars_), 4 * sizeof(float));
      if (e != cudaSuccess) {
        host_scalars_ = nullptr;
        return e;
      }
    }
    const int64_t need = floats + 4;
    if (scratch_ != nullptr && need <= scratch_floats_) return cudaSuccess;
    e = cudaStreamSynchronize(stream_);  // the old scratch may still be in use
    if (e != cudaSuccess) return e;
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_floats_ = 0;
    float* fresh = nullptr;
    e = cudaMalloc(reinterpret_cast<void**>(&fresh), need * sizeof(float));
    if (e != cudaSuccess) return e;
    scratch_ = fresh;
    scratch_floats_ = need;
    return cudaSuccess;
  }

  const int device_;
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  float* scratch_ = nullptr;
  int64_t scratch_floats_ = 0;
  float* host_scalars_ = nullptr;  // pinned
};

}  // namespace

int CudaDeviceCount(std::string* why, std::string* error_name) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (error_name != nullptr) *error_name = e == cudaSuccess ? "" : cudaGetErrorName(e);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    cudaGetLastError();  // clear the sticky error so later calls are not confused
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device";
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        count == 0 ? absl::StrCat("cuda:", device, " is not available: ", why)
                   : absl::StrCat("cuda:", device, " does not exist (", count, " CUDA devices)"));
  }
  cudaError_t e = cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cuda:", device, " cannot start: ",
                                                      cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
  cublasHandle_t cublas = nullptr;
  cublasStatus_t st = cublasCreate(&cublas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(cublas, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return absl::FailedPreconditionError(absl::StrCat("cuda:", device, " cuBLAS cannot start: ",
                                                      cublasGetStatusString(st)));
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, stream, cublas));
}

}  // namespace summa::worker

namespace {
void CopyOut(const std::string& text, char* buffer, int size) {
  if (buffer == nullptr || size <= 0) return;
  const size_t n = std::min(text.size(), static_cast<size_t>(size - 1));
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
}
}  // namespace

extern "C" int SummaCudaDeviceCount(char* why, int why_size) {
  std::string reason;
  const int count = summa::worker::CudaDeviceCount(&reason);
  CopyOut(reason, why, why_size);
  return count;
}

extern "C" int SummaCudaProbe(char* error_name, int error_name_size, char* why, int why_size) {
  std::string name, reason;
  const int count = summa::worker::CudaDeviceCount(&reason, &name);
  CopyOut(name, error_name, error_name_size);
  CopyOut(reason, why, why_size);
  return count;
}

extern "C" summa::worker::Backend* SummaCudaNewBackend(int device, char* error, int error_size) {
  absl::StatusOr<std::unique_ptr<summa::worker::Backend>> backend = summa::worker::NewCudaBackend(device);
  if (!backend.ok()) {
    CopyOut(std::string(backend.status().message()), error, error_size);
    return nullptr;
  }
  return backend->release();
}
