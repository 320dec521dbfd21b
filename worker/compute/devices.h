// Chooses the worker's backends from its flags: --device (one of "cpu", "cuda:N", "auto": a GPU
// when one works, else the CPU, saying so once) or --devices (a comma list such as
// "cuda:0,cuda:1", for one worker that splits its shard across several local devices).
#ifndef SUMMA_WORKER_COMPUTE_DEVICES_H_
#define SUMMA_WORKER_COMPUTE_DEVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace summa::worker {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads);

// `devices` is one device or a comma-separated list; each is made with MakeBackend. One CPU with
// cpu_threads > 1 becomes cpu_threads CPU backends of one OpenBLAS thread each (--threads).
absl::StatusOr<std::vector<std::unique_ptr<Backend>>> MakeBackends(const std::string& devices,
                                                                   int cpu_threads);

// Whether this build has the CUDA backend, and how many devices work ("why" says why not).
bool BuiltWithCuda();
int UsableCudaDevices(std::string* why);

// What the CUDA runtime says about this machine, for a caller that must tell "no GPU here" from
// "a GPU that does not work" (tests/cuda_backend_test.cc).
struct CudaProbe {
  bool plugin_loaded = false;  // false: no CUDA build, or libsumma_cuda.so did not load
  int devices = 0;
  std::string error;  // cudaGetDeviceCount's error by name ("cudaErrorNoDevice"); empty if none
  std::string why;    // why there are no devices, in words
};
CudaProbe ProbeCuda();

}  // namespace summa::worker

#endif  // SUMMA_WORKER_COMPUTE_DEVICES_H_
