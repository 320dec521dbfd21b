#include "worker/compute/devices.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include <dlfcn.h>
#include <unistd.h>

#include "worker/compute/cuda/cuda_backend.h"

namespace summa::worker {
namespace {

// libsumma_cuda.so, loaded once on first use; null (with the reason) when it cannot be.
struct CudaPlugin {
  decltype(&SummaCudaDeviceCount) device_count = nullptr;
  decltype(&SummaCudaNewBackend) new_backend = nullptr;
  decltype(&SummaCudaProbe) probe = nullptr;
  std::string error;
};

const CudaPlugin& Plugin() {
  static const CudaPlugin plugin = [] {
    CudaPlugin p;
#ifdef SUMMA_HAVE_CUDA
    // Beside the executable (a bundle), in the build tree, or on the library path.
    std::vector<std::string> candidates;
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      const std::string dir = std::string(exe, n).substr(0, std::string(exe, n).rfind('/'));
      candidates.push_back(dir + "/cuda/libsumma_cuda.so");
      candidates.push_back(dir + "/libsumma_cuda.so");
    }
    candidates.push_back(SUMMA_CUDA_PLUGIN);
    candidates.push_back("libsumma_cuda.so");
    void* handle = nullptr;
    std::string errors;
    for (const std::string& path : candidates) {
      handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", ::dlerror());
    }
    if (handle == nullptr) {
      p.error = absl::StrCat("the CUDA backend (libsumma_cuda.so) cannot be loaded: ", errors);
      return p;
    }
    p.device_count = reinterpret_cast<decltype(p.device_count)>(::dlsym(handle, "SummaCudaDeviceCount"));
    p.new_backend = reinterpret_cast<decltype(p.new_backend)>(::dlsym(handle, "SummaCudaNewBackend"));
    p.probe = reinterpret_cast<decltype(p.probe)>(::dlsym(handle, "SummaCudaProbe"));
    if (p.device_count == nullptr || p.new_backend == nullptr || p.probe == nullptr) {
      p.error = "libsumma_cuda.so lacks its entry points (a plugin from another build?)";
      p.device_count = nullptr;
      p.new_backend = nullptr;
      p.probe = nullptr;
    }
#else
    p.error = "this build has no CUDA backend (nvcc was not found at configure time)";
#endif
    return p;
  }();
  return plugin;
}

}  // namespace

bool BuiltWithCuda() {
#ifdef SUMMA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int UsableCudaDevices(std::string* why) {
  const CudaPlugin& plugin = Plugin();
  if (plugin.device_count == nullptr) {
    *why = plugin.error;
    return 0;
  }
  char reason[512] = "";
  const int count = plugin.device_count(reason, sizeof(reason));
  *why = reason;
  return count;
}

CudaProbe ProbeCuda() {
  CudaProbe result;
  const CudaPlugin& plugin = Plugin();
  if (plugin.probe == nullptr) {
    result.why = plugin.error;
    return result;
  }
  result.plugin_loaded = true;
  char error[128] = "", why[512] = "";
  result.devices = plugin.probe(error, sizeof(error), why, sizeof(why));
  result.error = error;
  result.why = why;
  return result;
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
    const CudaPlugin& plugin = Plugin();
    if (plugin.new_backend == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("--device=", device, ": ", plugin.error));
    }
    char error[512] = "";
    Backend* backend = plugin.new_backend(index, error, sizeof(error));
    if (backend == nullptr) return absl::FailedPreconditionError(error);
    return std::unique_ptr<Backend>(backend);
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
  // --threads=T on the CPU: T backends of one OpenBLAS thread each, the shard split across them
  // and each computing on a thread of its own (Trainer, DeviceThreads), rather than one OpenBLAS
  // call spread over T threads, which LeNet's small products do not fill.
  if (backends.size() == 1 && backends[0]->name() == "cpu" && cpu_threads > 1) {
    backends.clear();
    for (int t = 0; t < cpu_threads; ++t) backends.push_back(NewCpuBackend(1));
  }
  return backends;
}

}  // namespace summa::worker
