// The layer benchmark: where a CPU worker's step goes, phase by phase (each layer's forward,
// backward-data and backward-weights products, im2col and col2im, bias and layout passes,
// pooling, ReLU, the loss, copies), in milliseconds per step and in GFLOP/s against the core's
// own sgemm rate, measured by the same run. It trains a model on the CPU backend exactly as the
// trainer computes (NewModel at the backend's chunk, a batch gathered from a resident table),
// without a server: the arithmetic only.
#ifndef SUMMA_BENCH_LAYER_PROFILE_H_
#define SUMMA_BENCH_LAYER_PROFILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace summa::bench {

struct LayerProfileOptions {
  std::string model = "lenet";
  int batch = 256;   // one worker's examples per step
  int chunk = 0;     // examples per pass (0: the CPU backend's preferred chunk)
  int steps = 20;    // timed steps, after `warmup` untimed ones
  int warmup = 3;
  int threads = 1;   // OpenBLAS threads
  worker::ConvMethod conv = worker::ConvMethod::kFastest;  // how the convolutions are computed
  std::string command_line;
};

struct LayerProfile {
  int chunk = 0;               // examples per pass, as run
  worker::CpuProfile phases;         // summed over the timed steps
  double step_seconds = 0;     // mean wall time of a step (weights in, gradients, gradient out)
  double square_gflops = 0;    // cblas_sgemm on 2048x2048x2048 on this core
  double conv2_gflops = 0;     // cblas_sgemm on conv2's product at this chunk
  double loss = 0;             // the timed steps' summed loss (finite, positive)
};

absl::Status ValidateLayerProfileOptions(const LayerProfileOptions& o);
absl::StatusOr<LayerProfile> ProfileLayers(const LayerProfileOptions& o);

// The report: the command, the environment, the table and the checks. `*ok` is false when a check
// fails: the phases cover 80% to 102% of the step's wall time, LeNet's matrix products add up to
// its 13.26 MFLOP per example (by im2col; Winograd's conv2 counted as its 49 products per tile),
// the loss is finite and positive.
std::string FormatLayerProfile(const LayerProfileOptions& o, const LayerProfile& p, bool* ok);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_LAYER_PROFILE_H_
