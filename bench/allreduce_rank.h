// One rank of the AllReduce benchmark, whatever carries the exchange: it fills its tensor,
// times each exchange (the wall time of the call at this rank), and checks every element of every
// result against the exact sum. The fill is small integers, so every float sum is exact:
//   element i of rank r's tensor at iteration k = (r + 1) * ((i + k) % 97 + 1),
// and the sum over n ranks is n(n+1)/2 * ((i + k) % 97 + 1). It changes with k, so a sum left
// over from the previous round is caught. allreduce_gloo.py fills and checks the same way.
#ifndef SUMMA_BENCH_ALLREDUCE_RANK_H_
#define SUMMA_BENCH_ALLREDUCE_RANK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/allreduce_report.h"
#include "common/rpc/transport.h"

namespace summa::bench {

struct RankOptions {
  std::string target;  // host:port of the server (summa-server or the raw server)
  int rank = 0;
  int group_size = 1;
  int64_t bytes = 0;   // a multiple of 4: float32 elements
  int warmup = 0;      // calls not timed
  int iters = 1;       // calls timed
  absl::Duration timeout = absl::Minutes(10);  // bounds each call
  int channels = 1;    // summa: TCP connections of the client
  std::string data_plane = "auto";  // summa: the client's transport (worker::ParseDataPlane)
  TlsFiles tls;                     // summa: the client's TLS files (none: plaintext)
  int server_pid = 0;  // when set, this rank counts the server's minor page faults over the timed calls
};

void FillContribution(int rank, int iteration, absl::Span<float> values);
// The index of the first element that is not the exact sum over `group_size` ranks, or -1.
int64_t FirstWrongElement(int group_size, int iteration, absl::Span<const float> sum);

// One AllReduce of `in`, the sum written to `out` (already sized as `in`).
// The minor page faults `pid` has taken so far (field 10 of /proc/PID/stat).
absl::StatusOr<int64_t> MinorFaults(int pid);

using Exchange = std::function<absl::Status(const std::vector<float>& in, std::vector<float>& out)>;

// Runs warmup + iters exchanges. Fails only when an exchange fails; a wrong sum is reported in
// the RankReport (correct = false and the first wrong element) and timing goes on.
absl::StatusOr<RankReport> RunRank(const RankOptions& options, const Exchange& exchange);

// The ranks of each implementation: connect, RunRank, and return the report.
absl::StatusOr<RankReport> RunSummaRank(const RankOptions& options);
absl::StatusOr<RankReport> RunRawRank(const RankOptions& options);
absl::StatusOr<RankReport> RunGrpcRank(const RankOptions& options);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_ALLREDUCE_RANK_H_
