// The CUDA backend's entry points, in plain C++ so that no file outside this folder includes a
// CUDA header. Built (target summa_cuda) only where nvcc exists.
#ifndef SUMMA_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_
#define SUMMA_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace summa::worker {

// The number of usable CUDA devices. No driver (cudaErrorInsufficientDriver) or no device is
// not an error: it returns 0 and says why in `*why`; `*error_name` (when not null) is the name of
// the CUDA error cudaGetDeviceCount returned ("cudaErrorNoDevice"), empty when it succeeded.
int CudaDeviceCount(std::string* why, std::string* error_name = nullptr);

// A backend on CUDA device `device`: cuBLAS for matrix products, kernels for the rest, its own
// stream; fails with the CUDA error string when the device cannot be used.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device);

}  // namespace summa::worker

// The plugin's entry points: summa_cuda is a module (libsumma_cuda.so) that summa-worker loads
// with dlopen only when a GPU is asked for, so that a CPU worker never loads cuBLAS (its start-up
// cost, and its thread-local storage, which leaves too little room in small thread stacks).
extern "C" {
// CudaDeviceCount; `why` (a buffer of why_size bytes) says why there is none.
int SummaCudaDeviceCount(char* why, int why_size);
// The same, and the CUDA error's name (empty on success) in `error_name`, so that a caller can
// tell a machine with no GPU (cudaErrorNoDevice) from a broken one (any other error).
int SummaCudaProbe(char* error_name, int error_name_size, char* why, int why_size);
// NewCudaBackend; null on failure, with the reason in `error`. The caller owns the result.
summa::worker::Backend* SummaCudaNewBackend(int device, char* error, int error_size);
}

#endif  // SUMMA_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_
