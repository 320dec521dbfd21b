// The CUDA backend against the CPU backend on the same inputs (the checks of backend_checks.h):
// every operation forward and backward, LeNet steps compared tensor by tensor, the same with
// another device made current before every operation, and gradient summing across devices.
//
// When a case skips, and when it fails instead:
// - SUMMA_REQUIRE_GPU=1 in the environment (scripts/gpu-check.sh sets it): never skips; anything
//   short of a working cuda:0 fails.
// - Otherwise a case skips only where this machine has no GPU: the system shows none (no
//   /dev/nvidia<N> device node, and `nvidia-smi -L` lists no GPU or is not installed) and CUDA
//   agrees: the build has no CUDA backend, or cudaGetDeviceCount answers cudaErrorNoDevice,
//   cudaErrorInsufficientDriver (no driver installed) or zero devices.
// - Everything else fails: a CUDA build whose libsumma_cuda.so does not load, any other CUDA
//   error, and a GPU the system shows that CUDA cannot use (a driver older than the runtime,
//   CUDA_VISIBLE_DEVICES hiding it).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/backend_checks.h"
#include "tests/split_check.h"
#include "worker/compute/backend.h"
#include "worker/compute/devices.h"

namespace summa::worker {
namespace {

// The NVIDIA GPUs the operating system shows, in words; empty when it shows none.
std::string GpusTheSystemShows() {
  std::string seen;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, std::regex("nvidia[0-9]+"))) absl::StrAppend(&seen, "/dev/", name, " ");
  }
  if (FILE* smi = ::popen("nvidia-smi -L 2>/dev/null", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), smi) != nullptr) {
      std::string text(line);
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
      if (text.rfind("GPU ", 0) == 0) absl::StrAppend(&seen, "nvidia-smi: ", text, " ");
    }
    ::pclose(smi);
  }
  return seen;
}

// Empty when the CUDA tests should run; else why they must skip (`*skip`) or fail.
std::string WhyNot(bool* skip) {
  const char* require = std::getenv("SUMMA_REQUIRE_GPU");
  const bool required = require != nullptr && std::string(require) == "1";
  const std::string shown = GpusTheSystemShows();
  std::string problem;
  bool no_gpu_per_cuda = false;
  if (!BuiltWithCuda()) {
    problem = "this build has no CUDA backend (nvcc was not found at configure time)";
    no_gpu_per_cuda = true;
  } else {
    const CudaProbe probe = ProbeCuda();
    if (!probe.plugin_loaded) {
      problem = probe.why;  // a broken build: fails on every machine
    } else if (probe.devices == 0) {
      problem = absl::StrCat("CUDA sees no device: ", probe.why);
      no_gpu_per_cuda = probe.error.empty() || probe.error == "cudaErrorNoDevice" ||
                        probe.error == "cudaErrorInsufficientDriver";
    }
  }
  if (problem.empty()) return "";
  *skip = no_gpu_per_cuda && shown.empty() && !required;
  if (required) absl::StrAppend(&problem, " (SUMMA_REQUIRE_GPU=1: a skip is a failure)");
  if (!shown.empty()) absl::StrAppend(&problem, "; yet the system shows a GPU: ", shown);
  return problem;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static bool skip = false;
    static const std::string why = WhyNot(&skip);
    if (!why.empty()) {
      if (skip) GTEST_SKIP() << "no GPU on this machine: " << why;
      FAIL() << "the CUDA backend cannot be tested: " << why;
    }
    auto gpu = MakeBackend("cuda:0", 1);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
    cpu_ = NewCpuBackend(1);
  }

  // cuda:1 where there is one, else a second backend on cuda:0.
  std::unique_ptr<Backend> Second() {
    std::string why;
    auto second = MakeBackend(UsableCudaDevices(&why) > 1 ? "cuda:1" : "cuda:0", 1);
    EXPECT_TRUE(second.ok()) << second.status();
    return second.ok() ? *std::move(second) : nullptr;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

// Model parallelism on GPUs: LeNet split across cuda:0 and cuda:1 (or two backends on cuda:0
// where there is one GPU) gives the gradient of LeNet whole on cuda:0, for several micro-batch
// counts.
TEST_F(CudaBackendTest, LeNetSplitAcrossTwoDevicesMatchesOneDevice) {
  using namespace testing_split;  // NOLINT: the shared check's helpers
  const int kBatch = 13;
  const std::vector<float> w = Weights();
  const Batch batch = RandomBatch(kBatch, 11);
  auto whole = LeNet::Create(gpu_.get(), kBatch);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const Result want = Step(**whole, w, batch, kBatch);
  auto first = MakeBackend("cuda:0", 1);
  ASSERT_TRUE(first.ok()) << first.status();
  std::unique_ptr<Backend> second = Second();
  ASSERT_NE(second, nullptr);
  for (int micro : {1, 3, 13}) {
    auto split = PipelinedLeNet::Create(first->get(), second.get(), kBatch, micro);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_TRUE(SameStep(want, Step(**split, w, batch, kBatch))) << micro << " micro-batches";
  }
}

TEST_F(CudaBackendTest, GemmInAllTranspositions) { EXPECT_TRUE(checks::CheckGemm(*cpu_, *gpu_)); }

TEST_F(CudaBackendTest, ConvolutionForwardAndBackward) {
  EXPECT_TRUE(checks::CheckConvolution(*cpu_, *gpu_));
}

TEST_F(CudaBackendTest, PoolingAndRelu) { EXPECT_TRUE(checks::CheckPoolingAndRelu(*cpu_, *gpu_)); }

TEST_F(CudaBackendTest, Linear) { EXPECT_TRUE(checks::CheckLinear(*cpu_, *gpu_)); }

TEST_F(CudaBackendTest, SoftmaxCrossEntropy) {
  EXPECT_TRUE(checks::CheckSoftmaxCrossEntropy(*cpu_, *gpu_));
}

TEST_F(CudaBackendTest, Gather) { EXPECT_TRUE(checks::CheckGather(*cpu_, *gpu_)); }

TEST_F(CudaBackendTest, CountCorrect) { EXPECT_TRUE(checks::CheckCountCorrect(*cpu_, *gpu_)); }

TEST_F(CudaBackendTest, LeNetStepsMatchTheCpu) { EXPECT_TRUE(checks::CheckLeNetSteps(*cpu_, *gpu_)); }

// The second device's backend with the first device made current before each of its operations:
// an operation that does not select its own device launches on the wrong one (with two GPUs).
TEST_F(CudaBackendTest, EveryOperationSelectsItsDevice) {
  std::unique_ptr<Backend> second = Second();
  ASSERT_NE(second, nullptr);
  auto one = gpu_->Alloc(1);
  ASSERT_TRUE(one.ok()) << one.status();
  checks::DeviceHoppingBackend hopping(second.get(), gpu_.get(), (*one)->data());
  EXPECT_TRUE(checks::CheckOperations(*cpu_, hopping));
  EXPECT_TRUE(checks::CheckLeNetSteps(*cpu_, hopping, 2));
  EXPECT_TRUE(hopping.ok()) << hopping.status();
}

TEST_F(CudaBackendTest, GradientsSumAcrossDevices) {
  std::unique_ptr<Backend> second = Second();
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(checks::CheckPeerSum(*gpu_, *second));
  const std::vector<float> values = {10, 20, 30};
  auto staging = gpu_->Alloc(3);
  ASSERT_TRUE(staging.ok());
  EXPECT_EQ(gpu_->CopyFromPeer(*cpu_, values.data(), 3, (*staging)->data()).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace summa::worker
