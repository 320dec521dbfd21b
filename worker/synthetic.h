// The synthetic worker (summa-worker --synthetic=SIZE): a stand-in for a training worker that
// computes nothing and loads no data, so that dozens fit on one small machine and the parameter
// server's data path can be measured alone (bench/scale). It joins with a model of SIZE bytes of
// float32 parameters, runs `steps` synchronous steps that push a fixed gradient and pull the new
// weights (PushPull), and reports its step times and final weights on one line.
//
// What every synthetic worker of a job agrees on, so that the result is known exactly:
//   - the model: tensors "synthetic.0", "synthetic.1", ... of at most kSyntheticTensorFloats
//     floats each, one dimension, in that order (SyntheticSpecs);
//   - the initial values: element i is (i % 251) / 16 (SyntheticInitialValue); rank 0 (or a
//     worker the server assigns a rank) sends them, partition by partition;
//   - the gradient: every element of rank r's is r + 1; the examples pushed per step add up to
//     the power of two P >= N (rank 0 pushes P - (N - 1), every other rank 1), so that the
//     server's 1 / examples scale is exact;
// so after S steps of plain SGD at learning rate L every element has moved by exactly
// S * L * N(N+1)/2 / P (SyntheticShift), when L is a power of two and the values stay within
// float32's 24 bits.
#ifndef SUMMA_WORKER_SYNTHETIC_H_
#define SUMMA_WORKER_SYNTHETIC_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "client/parameter_store.h"
#include "client/ps_client.h"

namespace summa::worker {

inline constexpr int64_t kSyntheticTensorFloats = int64_t{1} << 26;  // 256 MiB per tensor

struct SyntheticOptions {
  int64_t model_bytes = 0;  // a positive multiple of 4
  int64_t steps = 10;       // at least 1
  int rank = -1;            // -1: the server assigns one
  int world_size = 1;
  // For RunSyntheticWorker: the server, its client's deadlines and connections.
  std::string server = "127.0.0.1:50051";
  absl::Duration call_deadline = absl::Minutes(11);
  absl::Duration join_deadline = absl::Minutes(2);
  int channels = 1;
  DataPlane data_plane = DataPlane::kAuto;
};

// INVALID_ARGUMENT naming the flag (--synthetic, --steps, --world_size, --rank) that cannot work.
absl::Status ValidateSyntheticOptions(const SyntheticOptions& options);

std::vector<TensorSpec> SyntheticSpecs(int64_t model_bytes);
float SyntheticInitialValue(int64_t i);
// The examples rank `rank` of `world` pushes per step.
int64_t SyntheticExamples(int rank, int world);
// How far every weight moves over `steps` steps of SGD at `lr` with `world` workers, in exact
// arithmetic: steps * lr * world(world+1)/2 / P.
double SyntheticShift(int world, int64_t steps, double lr);

// What a synthetic worker reports, on one stdout line (FormatSyntheticResult):
//   synthetic_result rank=0 world=2 params=262144 steps=3 median_step_us=812.5
//     push_bytes_per_step=1048576 pull_bytes_per_step=1048576 first_weight=-0.0029296875
//     uniform=yes step_us=900.1,812.5,790.0
// (one line). Before it, one line per step as each completes: "synthetic_step rank=0 step=0 us=900.1".
struct SyntheticResult {
  int rank = 0;
  int world = 0;
  int64_t params = 0;
  int64_t steps = 0;
  // Over the steps after the first (the first also waits for every worker to join), or the
  // first when it is the only one.
  double median_step_us = 0;
  int64_t push_bytes_per_step = 0;  // parameter values pushed (message headers not counted)
  int64_t pull_bytes_per_step = 0;  // parameter values pulled
  float first_weight = 0;
  // Every weight moved by exactly as much as the first: w[i] - init(i) == w[0] - init(0).
  bool uniform = false;
  std::vector<double> step_us;  // each step's PushPull wall time, in order
};
std::string FormatSyntheticResult(const SyntheticResult& result);
// The result on the "synthetic_result" line of `output` (other lines ignored); NOT_FOUND when
// there is none, INVALID_ARGUMENT when it is malformed.
absl::StatusOr<SyntheticResult> ParseSyntheticResult(absl::string_view output);
// The step line: "synthetic_step rank=R step=K us=T".
std::string FormatSyntheticStep(int rank, int64_t step, double us);

// Joins through `store` (borrowed), runs the steps, prints a step line per step to `out`
// (flushed), leaves, and returns the result. The weight and gradient buffers are allocated once.
// FAILED_PRECONDITION when the server's job is past step 0 (a synthetic run needs a fresh server).
absl::StatusOr<SyntheticResult> RunSynthetic(const SyntheticOptions& options, ParameterStore* store,
                                             std::FILE* out);

// RunSynthetic through a ParameterClient to options.server; prints the result line to stdout.
absl::Status RunSyntheticWorker(const SyntheticOptions& options);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_SYNTHETIC_H_
