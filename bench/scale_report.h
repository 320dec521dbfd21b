// What the scaling benchmark (summa-bench-scale) computes and prints: the exact first weight
// that synthetic workers must end with, the parameter-server model it compares step times with,
// the per-configuration row and the markdown table. Plain functions on values; thread-compatible.
#ifndef SUMMA_BENCH_SCALE_REPORT_H_
#define SUMMA_BENCH_SCALE_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/synthetic.h"

namespace summa::bench {

// The first weight every synthetic worker must hold after `steps` synchronous steps of plain SGD
// at `lr` with `world` workers (worker/synthetic.h): SyntheticInitialValue(0) minus
// SyntheticShift, exactly. INVALID_ARGUMENT, saying what to change, unless every value that
// computation passes through, for every initial value of the pattern, is a float32 (so that any
// server doing the arithmetic in float32 lands on it exactly): lr must be a power of two, and
// steps x world small enough to stay within 24 bits.
absl::StatusOr<float> ExpectedFirstWeight(int world, int64_t steps, double lr);

// The parameter-server model of BytePS (Jiang et al., OSDI 2020, section 3): with N workers,
// k server shards and full-duplex links of B bytes/s each way, one step moves M bytes up and M
// down at every worker and N*M/k each way at every server, so it takes max(M/B, N*M/(k*B)).
double PsModelSeconds(int64_t model_bytes, int workers, int shards, double bandwidth_bytes_per_s);
// B fitted to a one-worker step of `seconds`: the model says M/B there, so B = M / seconds (each
// way; 2M / seconds counting both directions through one pipe, which predicts the same times).
double FitBandwidth(int64_t model_bytes, double one_worker_step_seconds);

// One configuration: `workers` synthetic workers against one summa-server.
struct ScaleRow {
  int workers = 0;
  int shards = 1;
  int64_t model_bytes = 0;
  std::optional<double> step_ms;          // median over steps 1.. of the slowest worker's step
  std::optional<double> model_ms;         // PsModelSeconds with B fitted to the 1-worker row
  std::optional<double> reference_ms;     // PsModelSeconds with the --reference_gbps B
  std::optional<double> server_in_mib;    // gradient bytes the server received per step
  std::optional<double> server_out_mib;   // weight bytes the server sent per step
  std::optional<double> server_cpu_s;     // server CPU (user + system) per step
  std::optional<double> workers_cpu_s;    // all workers' CPU (user + system) per step, summed
  std::optional<double> server_peak_rss_mib;
  std::optional<double> load_average;     // the machine's 1-minute load as the configuration began
  bool correct = false;
  std::string note;  // in the correct column when not correct: "FAILED [1]", "no [2]"
};
// `reference` adds the column of the model at the reference bandwidth.
std::string ScaleTableHeader(bool reference);
std::string FormatScaleRow(const ScaleRow& row, bool reference);

// The median, over steps 1..S-1 (step 0 also waits for every worker to join), of the slowest
// worker's step time, in microseconds. Every worker must report the same S >= 2 steps.
absl::StatusOr<double> MedianSlowestStepUs(const std::vector<worker::SyntheticResult>& workers);

// Why `result` is not what worker `rank` of `world` must report after `steps` steps of a model of
// `model_bytes` ending at `expected` (wrong step count, size, first weight, or weights that moved
// unlike the first); "" when it is.
std::string CheckSyntheticResult(const worker::SyntheticResult& result, int rank, int world,
                                 int64_t steps, int64_t model_bytes, float expected);

// The tab-separated table the plot script reads (bench/scale_plot.py): a header line, then per
// row workers, shards, model_bytes, step_ms, model_ms, reference_ms ("" where unknown).
std::string PlotData(const std::vector<ScaleRow>& rows);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_SCALE_REPORT_H_
