// The CUDA backend's entry points, in plain C++ so that no file outside this folder includes a
// CUDA header. Built (target summa_cuda) only where nvcc exists.
#ifndef SUMMA_WORKER_CUDA_CUDA_BACKEND_H_
#define SUMMA_WORKER_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend.h"

namespace summa::worker {

// The number of usable CUDA devices. No driver (cudaErrorInsufficientDriver) or no device is
// not an error: it returns 0 and says why in `*why`.
int CudaDeviceCount(std::string* why);

// A backend on CUDA device `device`: cuBLAS for matrix products, kernels for the rest, its own
// stream; fails with the CUDA error string when the device cannot be used.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_CUDA_CUDA_BACKEND_H_
