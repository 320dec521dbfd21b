// The CPU backend: 5x5 convolutions by Winograd's F(3x3, 5x5) (worker/compute/winograd.h), single-channel
// 3x3 ones directly (worker/compute/direct_conv.h), the others as im2col + one cblas_sgemm per batch; the
// rest as plain loops.
#include <cblas.h>
#include <dlfcn.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu_kernels.h"
#include "worker/compute/direct_conv.h"
#include "worker/compute/winograd.h"

namespace summa::worker {
namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  explicit HostBuffer(int64_t n) : DeviceBuffer(new float[n](), n) {}
  ~HostBuffer() override { delete[] data_; }
};

// Times one phase of an operation into a CpuProfile, from construction to destruction; nothing
// (not even the name) when there is no profile.
class Phase {
 public:
  template <typename... Name>
  Phase(CpuProfile* profile, double flops, const Name&... name) : profile_(profile), flops_(flops) {
    if (profile_ == nullptr) return;
    name_ = absl::StrCat(name...);
    start_ = std::chrono::steady_clock::now();
  }
  ~Phase() {
    if (profile_ == nullptr) return;
    CpuPhase& p = (*profile_)[name_];
    p.calls += 1;
    p.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    p.flops += flops_;
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  CpuProfile* const profile_;
  const double flops_;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

double GemmFlops(int64_t m, int64_t n, int64_t k) { return 2.0 * m * n * k; }

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, CpuProfile* profile, ConvMethod conv)
      : profile_(profile), fastest_(conv == ConvMethod::kFastest) {
    FlushDenormals();
    RestartBlasThreadsWithFlushToZero();
    // After the restart: workers this adds are created by this thread and inherit its flags.
    openblas_set_num_threads(std::max(1, threads));
  }

  std::string name() const override { return "cpu"; }
  // Measured on LeNet (docs/design.md, the CPU worker): chunks of 8-32 examples train ~20% faster than the
  // whole batch of 256 at once, whose conv1 activations (14 MB) spill out of cache.
  int preferred_chunk() const override { return 16; }
  bool host_memory() const override { return true; }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Alloc(int64_t floats) override {
    if (floats < 0) return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", floats, " floats"));
    return std::unique_ptr<DeviceBuffer>(new HostBuffer(std::max<int64_t>(floats, 1)));
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocHost(int64_t floats) override {
    return Alloc(floats);
  }
  absl::Status CopyFromPeer(const Backend& from, const float* src, int64_t n, float* dst) override {
    if (from.name() != "cpu") {
      return absl::UnimplementedError(absl::StrCat("cannot copy from ", from.name(), " to cpu"));
    }
    std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Upload(const float* host, int64_t n, float* device) override {
    Phase phase(profile_, 0, "copy in (weights, labels)");
    if (host != device) std::memcpy(device, host, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Download(const float* device, int64_t n, float* host) override {
    Phase phase(profile_, 0, "copy out (gradient, totals)");
    if (host != device) std::memcpy(host, device, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Zero(float* device, int64_t n) override {
    Phase phase(profile_, 0, "zero");
    std::fill_n(device, n, 0.0f);
    return absl::OkStatus();
  }
  absl::Status Gather(const float* table, int64_t row_floats, const float* rows, int n,
                      float* out) override {
    Phase phase(profile_, 0, "gather (the batch's examples)");
    for (int i = 0; i < n; ++i) {
      std::memcpy(out + i * row_floats, table + static_cast<int64_t>(rows[i]) * row_floats,
                  row_floats * sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override {
    FlushDenormals();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
    return absl::OkStatus();
  }

  // One GEMM for the whole batch: out[O, N*P] = w[O, CKK] col[CKK, N*P], then back to NCHW.
  absl::Status Conv2dForward(const ConvShape& s, const float* x, const float* w, const float* bias,
                             float* y, float* workspace) override {
    FlushDenormals();
    if (Winograd(s)) return WinogradForward(s, x, w, bias, y, workspace, /*relu=*/false);
    if (Direct(s)) return DirectForward(s, x, w, bias, y, /*relu=*/false);
    const int64_t pixels = s.pixels(), np = s.batch * pixels;
    const int ckk = s.in_channels * s.kernel * s.kernel;
    float* col = workspace;
    float* out = workspace + 2 * s.col_floats();
    const std::string conv = ConvName(s);
    {
      Phase phase(profile_, 0, conv, "im2col (forward)");
      Im2Col(s, x, col);
    }
    {
      Phase phase(profile_, GemmFlops(s.out_channels, np, ckk), conv, "forward GEMM");
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.out_channels, np, ckk, 1.0f, w, ckk,
                  col, np, 0.0f, out, np);
    }
    Phase phase(profile_, 0, conv, "bias and NCHW layout");
    for (int i = 0; i < s.batch; ++i) {
      for (int o = 0; o < s.out_channels; ++o) {
        const float* from = out + o * np + i * pixels;
        float* to = y + (int64_t{i} * s.out_channels + o) * pixels;
        const float b = bias[o];
        for (int64_t p = 0; p < pixels; ++p) to[p] = from[p] + b;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Conv2dBackward(const ConvShape& s, const float* x, const float* w, const float* dy,
                              float* dx, float* dw, float* dbias, float* workspace,
                              bool columns_ready) override {
    FlushDenormals();
    if (Winograd(s)) return WinogradBackward(s, x, w, dy, dx, dw, dbias, workspace, columns_ready);
    if (Direct(s)) {
      if (dx == nullptr) {
        Phase phase(profile_, GemmFlops(s.out_channels, s.kernel * s.kernel, s.batch * s.pixels()),
                    ConvName(s), "backward-weights and bias (direct)");
        direct::BackwardWeights(s, x, dy, dw, dbias);
        return absl::OkStatus();
      }
      columns_ready = false;  // the direct forward pass left no im2col matrix
    }
    const int64_t pixels = s.pixels(), np = s.batch * pixels;
    const int ckk = s.in_channels * s.kernel * s.kernel;
    float* col = workspace;
    float* dcol = workspace + s.col_floats();
    float* dyt = workspace + 2 * s.col_floats();
    const std::string conv = ConvName(s);
    std::optional<Phase> phase(std::in_place, profile_, 0, conv, "dy layout and bias gradient");
    // dy to channel-major [O, N*P], summing the bias gradient on the way.
    std::fill_n(dbias, s.out_channels, 0.0f);
    for (int i = 0; i < s.batch; ++i) {
      for (int o = 0; o < s.out_channels; ++o) {
        const float* from = dy + (int64_t{i} * s.out_channels + o) * pixels;
        dbias[o] += Sum(from, pixels, dyt + o * np + i * pixels);
      }
    }
    if (!columns_ready) {
      phase.emplace(profile_, 0, conv, "im2col (backward)");
      Im2Col(s, x, col);
    }
    // dw[O, CKK] = dyt[O, N*P] col[CKK, N*P]^T
    phase.emplace(profile_, GemmFlops(s.out_channels, ckk, np), conv, "backward-weights GEMM");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.out_channels, ckk, np, 1.0f, dyt, np, col,
                np, 0.0f, dw, ckk);
    if (dx != nullptr) {
      // dcol[CKK, N*P] = w[O, CKK]^T dyt[O, N*P]
      phase.emplace(profile_, GemmFlops(ckk, np, s.out_channels), conv, "backward-data GEMM");
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, np, s.out_channels, 1.0f, w, ckk, dyt,
                  np, 0.0f, dcol, np);
      phase.emplace(profile_, 0, conv, "col2im");
      Col2Im(s, dcol, dx);
    }
    return absl::OkStatus();
  }

  // Winograd's output transform and the direct convolution apply ReLU as they write the output.
  absl::Status Conv2dReluForward(const ConvShape& s, const float* x, const float* w, const float* bias,
                                 float* y, float* workspace) override {
    FlushDenormals();
    if (Winograd(s)) return WinogradForward(s, x, w, bias, y, workspace, /*relu=*/true);
    if (Direct(s)) return DirectForward(s, x, w, bias, y, /*relu=*/true);
    return Backend::Conv2dReluForward(s, x, w, bias, y, workspace);
  }
  // The direct convolution pools its output rows as it writes them.
  absl::Status Conv2dReluPoolForward(const ConvShape& s, const float* x, const float* w, const float* bias,
                                     float* y, float* pooled, float* workspace) override {
    FlushDenormals();
    if (!fastest_ || !direct::PoolHandles(s)) return Backend::Conv2dReluPoolForward(s, x, w, bias, y, pooled, workspace);
    return DirectForward(s, x, w, bias, y, /*relu=*/true, pooled);
  }

  absl::Status ReluForward(const float* x, float* y, int64_t n) override {
    FlushDenormals();
    Phase phase(profile_, 0, "relu forward");
#pragma GCC ivdep  // y may be x (in place), element by element
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return absl::OkStatus();
  }
  absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) override {
    FlushDenormals();
    Phase phase(profile_, 0, "relu backward");
    ReluSelect(y, dy, dx, n);
    return absl::OkStatus();
  }

  absl::Status AvgPool2Forward(const float* x, float* y, int planes, int h, int w) override {
    FlushDenormals();
    Phase phase(profile_, 0, "avgpool ", h, "x", w, " forward");
    const int oh = h / 2, ow = w / 2;
    for (int p = 0; p < planes; ++p) {
      const float* xp = x + int64_t{p} * h * w;
      float* yp = y + int64_t{p} * oh * ow;
      for (int i = 0; i < oh; ++i) {
        const float* r0 = xp + (2 * i) * w;
        const float* r1 = r0 + w;
        for (int j = 0; j < ow; ++j) {
          yp[i * ow + j] = 0.25f * (r0[2 * j] + r0[2 * j + 1] + r1[2 * j] + r1[2 * j + 1]);
        }
      }
    }
    return absl::OkStatus();
  }
  absl::Status AvgPool2Backward(const float* dy, float* dx, int planes, int h, int w) override {
    FlushDenormals();
    Phase phase(profile_, 0, "avgpool ", h, "x", w, " backward");
    PoolBackward<false>(nullptr, dy, dx, planes, h, w);
    return absl::OkStatus();
  }
  absl::Status AvgPool2ReluBackward(const float* y, const float* dy, float* dx, int planes, int h,
                                    int w) override {
    FlushDenormals();
    Phase phase(profile_, 0, "avgpool ", h, "x", w, " and relu backward");
    PoolBackward<true>(y, dy, dx, planes, h, w);
    return absl::OkStatus();
  }

  absl::Status LinearForward(const float* x, const float* w, const float* bias, float* y, int batch,
                             int in, int out) override {
    FlushDenormals();
    Phase phase(profile_, GemmFlops(batch, out, in), "linear ", in, "->", out, " forward");
    for (int i = 0; i < batch; ++i) std::memcpy(y + int64_t{i} * out, bias, out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, out, in, 1.0f, x, in, w, out,
                1.0f, y, out);
    return absl::OkStatus();
  }
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                              float* dbias, int batch, int in, int out) override {
    FlushDenormals();
    // dw[I,O] = x^T dy; dbias = column sums of dy; dx[N,I] = dy w^T.
    std::optional<Phase> phase(std::in_place, profile_, GemmFlops(in, out, batch), "linear ", in, "->", out,
                               " backward-weights and bias");
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, batch, 1.0f, x, in, dy, out, 0.0f,
                dw, out);
    std::fill_n(dbias, out, 0.0f);
    for (int i = 0; i < batch; ++i) {
      for (int o = 0; o < out; ++o) dbias[o] += dy[int64_t{i} * out + o];
    }
    if (dx != nullptr) {
      phase.emplace(profile_, GemmFlops(batch, in, out), "linear ", in, "->", out, " backward-data");
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, in, out, 1.0f, dy, out, w, out,
                  0.0f, dx, in);
    }
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, float* dlogits,
                                   int batch, int classes, float* totals) override {
    FlushDenormals();
    Phase phase(profile_, 0, "softmax cross-entropy");
    double loss = 0;
    int bad = 0;
    for (int i = 0; i < batch; ++i) {
      const float* z = logits + int64_t{i} * classes;
      float* d = dlogits + int64_t{i} * classes;
      const int label = static_cast<int>(labels[i]);
      if (label < 0 || label >= classes) {
        std::fill_n(d, classes, 0.0f);
        ++bad;
        continue;
      }
      const float m = *std::max_element(z, z + classes);
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - m));
      const double lse = m + std::log(sum);
      loss += lse - z[label];
      for (int c = 0; c < classes; ++c) {
        d[c] = static_cast<float>(std::exp(z[c] - lse)) - (c == label ? 1.0f : 0.0f);
      }
    }
    totals[0] += static_cast<float>(loss);
    totals[1] += static_cast<float>(bad);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> CountCorrect(const float* logits, const float* labels, int batch,
                                       int classes) override {
    FlushDenormals();
    int64_t correct = 0;
    for (int i = 0; i < batch; ++i) {
      const float* z = logits + int64_t{i} * classes;
      correct += (std::max_element(z, z + classes) - z) == static_cast<int>(labels[i]);
    }
    return correct;
  }

  absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) override {
    FlushDenormals();
    Phase phase(profile_, 0, "axpy (summing chunks' gradients)");
    cblas_saxpy(static_cast<blasint>(n), alpha, x, 1, y, 1);
    return absl::OkStatus();
  }

 private:
  bool Winograd(const ConvShape& s) const { return fastest_ && s.kernel == winograd::kKernel; }
  bool Direct(const ConvShape& s) const { return fastest_ && direct::Handles(s); }
  // The prefix of a convolution's phase names ("conv 20->50 "); empty without a profile.
  std::string ConvName(const ConvShape& s) const {
    return profile_ ? absl::StrCat("conv ", s.in_channels, "->", s.out_channels, " ") : "";
  }

  // The direct convolution; with `pooled` (and relu), pooled in the same pass.
  absl::Status DirectForward(const ConvShape& s, const float* x, const float* w, const float* bias,
                             float* y, bool relu, float* pooled = nullptr) {
    Phase phase(profile_, GemmFlops(s.out_channels, s.batch * s.pixels(), s.kernel * s.kernel), ConvName(s),
                pooled != nullptr ? "forward, bias, relu and avgpool (direct)"
                : relu            ? "forward, bias and relu (direct)"
                                  : "forward and bias (direct)");
    if (pooled != nullptr) {
      direct::ForwardReluPool(s, x, w, bias, y, pooled);
    } else {
      direct::Forward(s, x, w, bias, y, relu);
    }
    return absl::OkStatus();
  }

  absl::Status WinogradForward(const ConvShape& s, const float* x, const float* w,
                               const float* bias, float* y, float* work, bool relu) {
    const winograd::Layout l = s.winograd();
    const int o = s.out_channels, c = s.in_channels, t = static_cast<int>(l.columns);
    const std::string conv = ConvName(s);
    {
      Phase phase(profile_, 0, conv, "Winograd input and kernel transforms");
      winograd::TransformInput(l, x, work);
      winograd::TransformKernels(l, w, work);
    }
    {
      // M[p][O][T] = U[p][O][C] V[p][C][T]
      Phase phase(profile_, winograd::kPoints * GemmFlops(o, t, c), conv, "forward GEMMs (Winograd)");
      PointProducts(false, false, o, t, c, work + l.u, int64_t{o} * c, work + l.v, int64_t{c} * t,
                    work + l.m, int64_t{o} * t);
    }
    Phase phase(profile_, 0, conv, relu ? "Winograd output transform, bias and relu"
                                        : "Winograd output transform and bias");
    winograd::TransformOutput(l, bias, work, y, relu);
    return absl::OkStatus();
  }

  absl::Status WinogradBackward(const ConvShape& s, const float* x, const float* w, const float* dy,
                                float* dx, float* dw, float* dbias, float* work,
                                bool columns_ready) {
    const winograd::Layout l = s.winograd();
    const int o = s.out_channels, c = s.in_channels, t = static_cast<int>(l.columns);
    const std::string conv = ConvName(s);
    std::optional<Phase> phase(std::in_place, profile_, 0, conv, "Winograd dy transform and bias gradient");
    const int64_t pixels = s.pixels();
    for (int oc = 0; oc < o; ++oc) dbias[oc] = 0.0f;
    for (int i = 0; i < s.batch; ++i) {
      for (int oc = 0; oc < o; ++oc) {
        dbias[oc] += Sum(dy + (int64_t{i} * o + oc) * pixels, pixels);
      }
    }
    winograd::TransformOutputGradient(l, dy, work);
    phase.emplace(profile_, 0, conv, "Winograd input and kernel transforms");
    if (!columns_ready) {
      winograd::TransformInput(l, x, work);
      if (dx != nullptr) winograd::TransformKernels(l, w, work);  // else U, from the forward pass
    }
    // dU[p][O][C] = dM[p][O][T] V[p][C][T]^T
    phase.emplace(profile_, winograd::kPoints * GemmFlops(o, c, t), conv,
                  "backward-weights GEMMs (Winograd)");
    PointProducts(false, true, o, c, t, work + l.m, int64_t{o} * t, work + l.v, int64_t{c} * t,
                  work + l.du, int64_t{o} * c);
    phase.emplace(profile_, 0, conv, "Winograd kernel gradient transform");
    winograd::TransformKernelGradient(l, work, dw);
    if (dx != nullptr) {
      // dV[p][C][T] = U[p][O][C]^T dM[p][O][T], over V (no longer needed)
      phase.emplace(profile_, winograd::kPoints * GemmFlops(c, t, o), conv,
                    "backward-data GEMMs (Winograd)");
      PointProducts(true, false, c, t, o, work + l.u, int64_t{o} * c, work + l.m, int64_t{o} * t,
                    work + l.v, int64_t{c} * t);
      phase.emplace(profile_, 0, conv, "Winograd input gradient transform");
      winograd::TransformInputGradient(l, work, dx);
    }
    return absl::OkStatus();
  }

  CpuProfile* const profile_;  // Not owned; null: no profiling
  const bool fastest_;         // each convolution its fastest way (else all by im2col)
};

}  // namespace

std::unique_ptr<Backend> NewCpuBackend(int threads, CpuProfile* profile, ConvMethod conv) {
  return std::make_unique<CpuBackend>(threads, profile, conv);
}

}  // namespace summa::worker
