// Backend: the device math the models (LeNet, MLP) need, forward and backward, behind one
// interface. The CPU implementation runs on OpenBLAS; the CUDA one (cuda_backend) on cuBLAS and
// kernels. Nothing above this interface knows which device runs.
//
// Pointers given to the operations are device pointers from Alloc() (host memory on the CPU).
// Tensors are row-major float32; images are NCHW. Every operation returns a status: on CUDA a
// failed launch or call becomes an error naming the operation, never a crash.
// A Backend is used by one thread at a time.
#ifndef SUMMA_WORKER_COMPUTE_BACKEND_H_
#define SUMMA_WORKER_COMPUTE_BACKEND_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/winograd.h"

namespace summa::worker {

// Device memory of `size` floats, freed with the object.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  float* data() const { return data_; }
  int64_t size() const { return size_; }

 protected:
  DeviceBuffer(float* data, int64_t size) : data_(data), size_(size) {}
  float* data_;
  int64_t size_;
};

// A valid convolution: stride 1, no padding, square kernel.
struct ConvShape {
  int batch = 0, in_channels = 0, height = 0, width = 0;
  int out_channels = 0, kernel = 0;
  int out_height() const { return height - kernel + 1; }
  int out_width() const { return width - kernel + 1; }
  int64_t pixels() const { return int64_t{out_height()} * out_width(); }
  // Floats of the im2col matrix of the whole batch: [C*k*k, batch*pixels].
  int64_t col_floats() const { return int64_t{in_channels} * kernel * kernel * batch * pixels(); }
  // Floats of the output in channel-major order: [O, batch*pixels].
  int64_t out_floats() const { return int64_t{out_channels} * batch * pixels(); }
  // The CPU backend's Winograd buffers for a 5x5 kernel (worker/compute/winograd.h).
  winograd::Layout winograd() const {
    return winograd::Layout::Of(batch, in_channels, height, width, out_channels);
  }
  // Floats of scratch space the forward and backward passes need (an implementation may use
  // less): two im2col matrices and one channel-major output, or the Winograd buffers of a 5x5
  // kernel where those are more.
  int64_t workspace_floats() const {
    const int64_t im2col = 2 * col_floats() + out_floats();
    return kernel == winograd::kKernel ? std::max(im2col, winograd().floats) : im2col;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0", ...
  virtual std::string name() const = 0;
  // How many examples a model should push through at once (0: the whole batch). Small chunks
  // keep a CPU's activations in cache; a GPU wants the whole batch.
  virtual int preferred_chunk() const = 0;
  // True when Alloc's memory is the host's (the CPU): a host array can serve as device memory
  // in place, without a copy (the training set, say).
  virtual bool host_memory() const = 0;

  // Zero-filled device memory, allocated (and touched) once.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Alloc(int64_t floats) = 0;
  // Host memory the device copies to and from fastest (pinned on CUDA), for staging.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocHost(int64_t floats) = 0;
  virtual absl::Status Upload(const float* host, int64_t n, float* device) = 0;
  virtual absl::Status Download(const float* device, int64_t n, float* host) = 0;
  virtual absl::Status Zero(float* device, int64_t n) = 0;
  // out[i, :] = table[rows[i], :] for i < n, rows of `row_floats` floats. `rows` holds row
  // indices stored as floats (exact below 2^24); table, rows and out are device memory. How a
  // batch is drawn from a training set kept on the device.
  virtual absl::Status Gather(const float* table, int64_t row_floats, const float* rows, int n,
                              float* out) = 0;
  // dst (on this device) = src (on `from`'s device), for summing gradients across local devices.
  // UNIMPLEMENTED between kinds of backend.
  virtual absl::Status CopyFromPeer(const Backend& from, const float* src, int64_t n, float* dst) = 0;

  // C[M,N] = alpha * op(A) op(B) + beta * C, with op(A) of shape [M,K] and op(B) [K,N].
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float* a, const float* b, float beta, float* c) = 0;

  // y[N,O,Ho,Wo] = conv(x[N,C,H,W], w[O,C,k,k]) + bias[O]. `workspace` holds
  // shape.workspace_floats(); the forward pass leaves there what its backward pass may reuse
  // (x's im2col matrix, or its Winograd transform).
  virtual absl::Status Conv2dForward(const ConvShape& shape, const float* x, const float* w,
                                     const float* bias, float* y, float* workspace) = 0;
  // dw = dL/dw, dbias = dL/dbias (both overwritten), and dx = dL/dx unless dx is null.
  // `columns_ready`: the workspace still holds what the last Conv2dForward of this shape, x and w
  // left there (nothing has written to it since, and x and w are unchanged), so the
  // backward pass skips rebuilding it: true for a network's last convolution, whose backward
  // pass follows its forward pass with no other convolution between them.
  virtual absl::Status Conv2dBackward(const ConvShape& shape, const float* x, const float* w,
                                      const float* dy, float* dx, float* dw, float* dbias,
                                      float* workspace, bool columns_ready) = 0;

  // y = max(x, 0) elementwise (y may equal x).
  virtual absl::Status ReluForward(const float* x, float* y, int64_t n) = 0;
  // dx = dy where y > 0, else 0 (dx may equal dy).
  virtual absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) = 0;

  // 2x2 average pooling with stride 2 over `planes` planes of h x w (odd edges dropped).
  virtual absl::Status AvgPool2Forward(const float* x, float* y, int planes, int h, int w) = 0;
  virtual absl::Status AvgPool2Backward(const float* dy, float* dx, int planes, int h, int w) = 0;

  // Fused operations, each exactly the operations it names in a row (the default), which a
  // backend may compute in one pass over the data instead (the CPU one does).
  // Conv2dForward, then ReluForward on its output in place.
  virtual absl::Status Conv2dReluForward(const ConvShape& shape, const float* x, const float* w,
                                         const float* bias, float* y, float* workspace) {
    if (absl::Status s = Conv2dForward(shape, x, w, bias, y, workspace); !s.ok()) return s;
    return ReluForward(y, y, int64_t{shape.batch} * shape.out_channels * shape.pixels());
  }
  // Conv2dReluForward into y (kept for the backward pass), then AvgPool2Forward from y into
  // `pooled`.
  virtual absl::Status Conv2dReluPoolForward(const ConvShape& shape, const float* x, const float* w,
                                             const float* bias, float* y, float* pooled, float* workspace) {
    if (absl::Status s = Conv2dReluForward(shape, x, w, bias, y, workspace); !s.ok()) return s;
    return AvgPool2Forward(y, pooled, shape.batch * shape.out_channels, shape.out_height(), shape.out_width());
  }
  // AvgPool2Backward from dy into dx, then ReluBackward with ReLU's output y, in place in dx.
  virtual absl::Status AvgPool2ReluBackward(const float* y, const float* dy, float* dx, int planes,
                                            int h, int w) {
    if (absl::Status s = AvgPool2Backward(dy, dx, planes, h, w); !s.ok()) return s;
    return ReluBackward(y, dx, dx, int64_t{planes} * h * w);
  }

  // y[N,O] = x[N,I] w[I,O] + bias[O].
  virtual absl::Status LinearForward(const float* x, const float* w, const float* bias, float* y,
                                     int batch, int in, int out) = 0;
  // dw, dbias overwritten; dx unless null.
  virtual absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                                      float* dw, float* dbias, int batch, int in, int out) = 0;

  // Softmax cross-entropy of logits[N,C] against labels[N] (class indices stored as floats).
  // Writes dlogits = softmax - onehot (the gradient of the *summed* loss) and adds to totals[0]
  // the summed loss and to totals[1] the rows whose label is outside [0, C), whose loss and
  // gradient are zero (totals: 2 floats of device memory). Nothing waits for the device: the
  // totals are read when wanted (a step's loss need not cost a round trip to the host).
  virtual absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels,
                                           float* dlogits, int batch, int classes,
                                           float* totals) = 0;
  // How many rows of logits[N,C] have their largest entry at the label.
  virtual absl::StatusOr<int64_t> CountCorrect(const float* logits, const float* labels, int batch,
                                               int classes) = 0;

  // y += alpha * x: sums of gradients across chunks of a batch and across local devices (the
  // server, not the worker, applies the optimizer).
  virtual absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) = 0;
};

// Where the CPU backend's time goes, phase by phase ("conv 20->50 backward-weights GEMM",
// "avgpool 26x26 forward", ...): calls, seconds and floating-point operations, accumulated while
// the backend has one (the layer benchmark, bench/layers_main.cc). Not thread-safe.
struct CpuPhase {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // of the matrix products; 0 for phases that only move data
};
using CpuProfile = std::map<std::string, CpuPhase>;

// How the CPU backend computes convolutions. kFastest chooses by shape: 5x5 kernels by Winograd's
// F(3x3, 5x5) (worker/compute/winograd.h), single-channel 3x3 ones directly when the output is 16 or
// more columns wide and no input gradient is asked for (worker/compute/direct_conv.h), the rest by im2col
// and one matrix product per batch. kIm2col computes every one by im2col: the layer benchmark's
// comparison, and the reference the tests hold the others to.
enum class ConvMethod { kFastest, kIm2col };

// The OpenBLAS backend; `threads` OpenBLAS threads (process-wide setting). With `profile`, each
// phase of each operation adds its time to it (not owned; must outlive the backend).
std::unique_ptr<Backend> NewCpuBackend(int threads, CpuProfile* profile = nullptr,
                                       ConvMethod conv = ConvMethod::kFastest);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_COMPUTE_BACKEND_H_
