#include "worker/devices.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace summa::worker {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads) {
  if (cpu_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be at least 1, got ", cpu_threads));
  }
  if (device == "cpu") return NewCpuBackend(cpu_threads);
  if (device == "auto") {
    SUMMA_LOG(INFO) << "--device=auto: this build has no CUDA backend; running on the CPU";
    return NewCpuBackend(cpu_threads);
  }
  if (absl::StartsWith(device, "cuda:")) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=", device, ": this build has no CUDA backend (use --device=cpu)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --device '", device, "' (cpu, cuda:N or auto)"));
}

}  // namespace summa::worker
