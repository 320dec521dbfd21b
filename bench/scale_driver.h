// The scaling benchmark's driver (summa-bench-scale): for each shard count k and worker count N
// it starts k summa-server shards and N synthetic workers (summa-worker --synthetic) on
// 127.0.0.1, lets them run the steps, and measures per configuration the step time (median over
// steps of the slowest worker), the bytes through a shard per step, a shard's CPU time per step
// (both the mean over shards) and the largest shard's peak RSS, and checks every worker's final
// weights against their exact expected value. It prints a
// markdown table next to the parameter-server model (scale_report.h) and can plot it. Every
// child is killed by its PID on every path out, SIGINT and SIGTERM to the driver included.
// Not thread-safe.
#ifndef SUMMA_BENCH_SCALE_DRIVER_H_
#define SUMMA_BENCH_SCALE_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace summa::bench {

struct ScaleOptions {
  std::vector<int> workers;      // worker counts, run in this order
  int64_t model_bytes = 64 << 20;
  int64_t steps = 20;            // at least 3: step 0 is not timed
  std::vector<int> shards = {1};  // k, the server shards, run in this order (each with every N)
  double lr = 1.0 / 1024;        // a power of two, so the final weight is exact
  int64_t partition_bytes = 4 << 20;
  bool deterministic = false;  // the server's --deterministic
  std::string data_plane = "socket";  // the workers' --data_plane (the servers serve both)
  double reference_gbps = 0;     // a second model line at this B (GB/s each way); 0: none
  std::string reference_source;  // where that B comes from, for the report
  absl::Duration timeout = absl::Minutes(20);  // per configuration
  std::string server;            // summa-server
  std::string worker;            // summa-worker
  std::string python;            // runs plot_script
  std::string plot_script;       // scale_plot.py
  std::string plot_path;         // write the PNG here, when set
  std::string out_path;          // also write the report here, when set
  std::string command_line;      // printed first
};

// INVALID_ARGUMENT naming the first option that cannot work (including a shard count the model's
// partitions cannot cover, and an lr, step and worker count whose final weight has no exact
// expected value).
absl::Status ValidateScaleOptions(const ScaleOptions& options);

// Runs every configuration, then prints the report (progress to stderr) and writes the plot.
// A configuration that fails becomes a FAILED row, explained under the table, and the others
// still run. Returns whether every row ran and is correct; fails only for what stops the whole
// run (a stop signal: CANCELLED; no temporary directory; the --out file not written).
absl::StatusOr<bool> RunScaleBenchmark(const ScaleOptions& options);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_SCALE_DRIVER_H_
