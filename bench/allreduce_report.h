// What the AllReduce benchmark measures and prints: the line each rank reports its timings on,
// the statistic the table shows (median over iterations of the slowest rank's time), algbw and
// busbw as nccl-tests define them, and the markdown table.
// Plain functions on values; thread-compatible.
#ifndef SUMMA_BENCH_ALLREDUCE_REPORT_H_
#define SUMMA_BENCH_ALLREDUCE_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/byte_size.h"

namespace summa::bench {

// One rank's result for one tensor size, as it prints it on one stdout line:
//   result bytes=4096 rank=0 correct=yes times_us=12.250,11.875[ server_faults=N][ detail=<text to end>]
// `times_us` holds the wall time of each timed call (warm-up calls left out), in microseconds.
struct RankReport {
  int64_t bytes = 0;
  int rank = 0;
  bool correct = false;
  std::vector<double> times_us;
  std::string detail;  // why not correct: the first element that differed
  int64_t server_faults = -1;  // the server's minor faults over the timed calls (-1: not counted)
};
std::string FormatRankReport(const RankReport& report);
// Every "result" line of `output` (other lines are ignored).
absl::StatusOr<std::vector<RankReport>> ParseRankReports(absl::string_view output);

// The median, over iterations, of the slowest rank's time in that iteration. Every rank must have
// reported the same number of iterations.
absl::StatusOr<double> MedianOfSlowestRankUs(const std::vector<RankReport>& ranks);

// nccl-tests' definitions: algbw = bytes / time; busbw = algbw * 2(n-1)/n for allreduce, the
// factor that makes busbw comparable to the hardware's bandwidth whatever the rank count.
double AlgorithmBandwidthGBps(int64_t bytes, double time_us);
double BusBandwidthGBps(int64_t bytes, double time_us, int ranks);

// One row of the table: a configuration that ran (time set), or one that could not (note says
// why: "FAILED [1]", "not installed").
struct TableRow {
  std::string impl;
  int ranks = 0;
  int64_t bytes = 0;                        // 0: the row stands for every size
  std::optional<double> time_us;
  bool correct = false;
  std::string note;                         // shown in the correct column when not correct
  std::optional<double> server_peak_rss_mib;
  std::optional<double> server_faults_per_call;  // minor page faults per timed call, steady state
};
std::string TableHeader();
std::string FormatTableRow(const TableRow& row);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_ALLREDUCE_REPORT_H_
