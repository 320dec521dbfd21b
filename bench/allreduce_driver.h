// The AllReduce benchmark's driver: for each implementation and rank count it starts the
// processes it needs (a fresh server per size for summa and raw, so that the server's peak RSS
// belongs to that size alone; one job per rank count for gloo, and for each of mpi's transports), collects every rank's timings
// and correctness, and prints an nccl-tests-style markdown table. Every child is killed by its PID
// on every path out, SIGINT and SIGTERM to the driver included. Not thread-safe.
#ifndef SUMMA_BENCH_ALLREDUCE_DRIVER_H_
#define SUMMA_BENCH_ALLREDUCE_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace summa::bench {

// The implementations --impls may name; they run in the order named.
inline constexpr const char* kImplementations[] = {"summa", "summa-grpc", "summa-shm", "summa-tls", "summa-tls-grpc",
                                                   "raw",   "grpc",       "gloo",      "mpi",       "memcpy"};

struct DriverOptions {
  std::vector<std::string> impls;
  std::vector<int> ranks;
  std::vector<int> shards = {1};  // summa: summa-server shards per configuration (the others: 1)
  std::vector<int64_t> sizes;  // bytes, multiples of 4
  int iters = 20;
  int warmup = 10;
  int channels = 1;  // summa ranks' TCP connections
  absl::Duration timeout = absl::Minutes(10);  // per configuration (gloo: per size)
  std::string self;         // this binary, started again as each rank and as the raw server
  std::string server;       // summa-server
  std::string python;       // runs gloo_script
  std::string gloo_script;  // allreduce_gloo.py
  std::string mpi_script;   // allreduce_mpi.py
  std::string make_certs;   // scripts/make-certs.sh, for the summa-tls rows
  std::string mpirun;       // Open MPI's launcher; empty: the mpi rows say it is missing
  std::string out_path;     // also write the report here, when set
  std::string command_line; // printed first, as the command that produced the report
};

// Fails with INVALID_ARGUMENT naming the first option that cannot work.
absl::Status ValidateDriverOptions(const DriverOptions& options);

// Runs the whole matrix and prints the report to stdout (progress to stderr). A configuration
// that fails becomes a FAILED row, explained under the table, and the others still run.
// Returns whether every row ran and is correct; fails only for what stops the whole run (a
// stop signal: CANCELLED; no temporary directory; the --out file not written).
absl::StatusOr<bool> RunAllReduceBenchmark(const DriverOptions& options);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_ALLREDUCE_DRIVER_H_
