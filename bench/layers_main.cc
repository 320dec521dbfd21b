// summa-bench-layers: parses flags and runs the layer benchmark (bench/layer_profile.h).
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/invocation.h"
#include "bench/layer_profile.h"
#include "common/flags.h"

ABSL_FLAG(std::string, model, "lenet", "the network: lenet or mlp");
ABSL_FLAG(int, batch, 256, "examples per step (one worker's shard of the global batch)");
ABSL_FLAG(int, chunk, 0, "examples per pass through the network; 0: the CPU backend's own (16)");
ABSL_FLAG(int, steps, 20, "timed steps");
ABSL_FLAG(int, warmup, 3, "untimed steps first");
ABSL_FLAG(int, threads, 1, "OpenBLAS threads");
ABSL_FLAG(std::string, out, "", "also write the report to this file");
ABSL_FLAG(std::string, conv, "fastest",
          "how the CPU backend computes convolutions: fastest (the worker's way: conv2, 5x5, by "
          "Winograd's F(3x3, 5x5); conv1, one channel 3x3, directly) or im2col (every one as one "
          "matrix product per batch, for comparison)");

namespace {

constexpr char kUsage[] =
    "the layer benchmark: trains --model on the CPU backend as a worker computes (no server) and "
    "prints where a step's time goes, phase by phase, in ms per step and GFLOP/s against this "
    "core's sgemm rate measured in the same run; exits 1 if a check fails.\n\n"
    "  OPENBLAS_NUM_THREADS=1 summa-bench-layers --batch=256 --steps=20";

}  // namespace

int main(int argc, char** argv) {
  summa::ParseFlagsOrDie(argc, argv, kUsage);
  summa::bench::LayerProfileOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.chunk = absl::GetFlag(FLAGS_chunk);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.command_line = summa::bench::CommandLine(argc, argv);
  const std::string conv = absl::GetFlag(FLAGS_conv);
  if (conv != "fastest" && conv != "im2col") {
    std::fprintf(stderr, "summa-bench-layers: --conv must be fastest or im2col, got '%s'\n",
                 conv.c_str());
    return 2;
  }
  o.conv = conv == "im2col" ? summa::worker::ConvMethod::kIm2col : summa::worker::ConvMethod::kFastest;
  if (absl::Status valid = summa::bench::ValidateLayerProfileOptions(o); !valid.ok()) {
    std::fprintf(stderr, "summa-bench-layers: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  absl::StatusOr<summa::bench::LayerProfile> profile = summa::bench::ProfileLayers(o);
  if (!profile.ok()) {
    std::fprintf(stderr, "summa-bench-layers: %s\n", profile.status().ToString().c_str());
    return 1;
  }
  bool ok = false;
  const std::string report = summa::bench::FormatLayerProfile(o, *profile, &ok);
  std::fputs(report.c_str(), stdout);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::ofstream file(out);
    file << report;
    if (!file) {
      std::fprintf(stderr, "summa-bench-layers: cannot write %s\n", out.c_str());
      return 1;
    }
  }
  return ok ? 0 : 1;
}
