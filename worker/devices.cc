#include "worker/devices.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#ifdef SUMMA_HAVE_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

namespace summa::worker {

bool BuiltWithCuda() {
#ifdef SUMMA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int UsableCudaDevices(std::string* why) {
#ifdef SUMMA_HAVE_CUDA
  return CudaDeviceCount(why);
#else
  *why = "this build has no CUDA backend (nvcc was not found at configure time)";
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads) {
  if (cpu_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be at least 1, got ", cpu_threads));
  }
  if (device == "cpu") return NewCpuBackend(cpu_threads);
  if (device == "auto") {
    std::string why;
    if (UsableCudaDevices(&why) > 0) return MakeBackend("cuda:0", cpu_threads);
    SUMMA_LOG(INFO) << "--device=auto: no usable GPU (" << why << "); running on the CPU";
    return NewCpuBackend(cpu_threads);
  }
  int index = -1;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) && index >= 0) {
#ifdef SUMMA_HAVE_CUDA
    return NewCudaBackend(index);
#else
    std::string why;
    UsableCudaDevices(&why);
    return absl::FailedPreconditionError(absl::StrCat("--device=", device, ": ", why));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", device, "' (cpu, cuda:N or auto)"));
}

absl::StatusOr<std::vector<std::unique_ptr<Backend>>> MakeBackends(const std::string& devices,
                                                                   int cpu_threads) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (absl::string_view d : absl::StrSplit(devices, ',')) {
    if (d.empty()) return absl::InvalidArgumentError(absl::StrCat("empty device in '", devices, "'"));
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, MakeBackend(std::string(d), cpu_threads));
    for (const auto& other : backends) {
      if (other->name() == b->name() && b->name() != "cpu") {
        return absl::InvalidArgumentError(absl::StrCat(b->name(), " appears twice in '", devices, "'"));
      }
    }
    backends.push_back(std::move(b));
  }
  return backends;
}

}  // namespace summa::worker
