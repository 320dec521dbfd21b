#include "worker/compute/cpu_kernels.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <mutex>

#include "worker/compute/winograd.h"

namespace summa::worker {

void Im2Col(const ConvShape& s, const float* x, float* col) {
  const int ho = s.out_height(), wo = s.out_width(), k = s.kernel;
  const int64_t plane = int64_t{s.height} * s.width, image = s.in_channels * plane;
  float* out = col;
  for (int c = 0; c < s.in_channels; ++c) {
    for (int ki = 0; ki < k; ++ki) {
      for (int kj = 0; kj < k; ++kj) {
        for (int i = 0; i < s.batch; ++i) {
          const float* in = x + i * image + c * plane + ki * s.width + kj;
          for (int oh = 0; oh < ho; ++oh, out += wo) CopyRow(in + oh * s.width, out, wo);
        }
      }
    }
  }
}

void Col2Im(const ConvShape& s, const float* col, float* dx) {
  const int ho = s.out_height(), wo = s.out_width(), k = s.kernel;
  const int64_t plane = int64_t{s.height} * s.width, image = s.in_channels * plane;
  std::fill_n(dx, s.batch * image, 0.0f);
  const float* in = col;
  for (int c = 0; c < s.in_channels; ++c) {
    for (int ki = 0; ki < k; ++ki) {
      for (int kj = 0; kj < k; ++kj) {
        for (int i = 0; i < s.batch; ++i) {
          float* to = dx + i * image + c * plane + ki * s.width + kj;
          for (int oh = 0; oh < ho; ++oh, in += wo) AddRow(in, to + oh * s.width, wo);
        }
      }
    }
  }
}

void PointProducts(bool ta, bool tb, int m, int n, int k, const float* a, int64_t a_step,
                   const float* b, int64_t b_step, float* c, int64_t c_step) {
  for (int p = 0; p < winograd::kPoints; ++p) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, 1.0f, a + p * a_step, ta ? m : k, b + p * b_step, tb ? k : n, 0.0f,
                c + p * c_step, n);
  }
}

void RestartBlasThreadsWithFlushToZero() {
  static std::once_flag once;
  std::call_once(once, [] {
    using Hook = int (*)();
    auto shutdown = reinterpret_cast<Hook>(::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
    auto init = reinterpret_cast<Hook>(::dlsym(RTLD_DEFAULT, "blas_thread_init"));
    if (shutdown == nullptr || init == nullptr) return;
    FlushDenormals();
    shutdown();
    init();
  });
}

}  // namespace summa::worker
