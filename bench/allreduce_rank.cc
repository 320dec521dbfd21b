#include "bench/allreduce_rank.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/child_process.h"
#include "bench/grpc_allreduce.h"
#include "bench/raw_allreduce.h"
#include "common/status_macros.h"
#include "client/ps_client.h"

namespace summa::bench {
namespace {

constexpr int kPeriod = 97;

float ExpectedSum(int group_size, int iteration, int64_t element) {
  return static_cast<float>(group_size * (group_size + 1) / 2) *
         static_cast<float>((element + iteration) % kPeriod + 1);
}

// The bench's one call into Summa's client: when AllReduce's signature changes (an output span,
// chunked tensors), this function is the one place to adapt.
absl::Status SummaAllReduce(worker::ParameterClient& client, const worker::Collective& group,
                            const std::vector<float>& in, std::vector<float>& out) {
  return client.AllReduceInto(group, in, absl::MakeSpan(out));
}

}  // namespace

void FillContribution(int rank, int iteration, absl::Span<float> values) {
  int k = iteration % kPeriod;
  const float scale = static_cast<float>(rank + 1);
  for (float& v : values) {
    v = scale * static_cast<float>(k + 1);
    if (++k == kPeriod) k = 0;
  }
}

int64_t FirstWrongElement(int group_size, int iteration, absl::Span<const float> sum) {
  const float scale = static_cast<float>(group_size * (group_size + 1) / 2);
  int k = iteration % kPeriod;
  for (size_t i = 0; i < sum.size(); ++i) {
    if (sum[i] != scale * static_cast<float>(k + 1)) return static_cast<int64_t>(i);
    if (++k == kPeriod) k = 0;
  }
  return -1;
}

absl::StatusOr<RankReport> RunRank(const RankOptions& options, const Exchange& exchange) {
  const size_t n = static_cast<size_t>(options.bytes / 4);
  std::vector<float> in(n), out(n);
  RankReport report;
  report.bytes = options.bytes;
  report.rank = options.rank;
  report.correct = true;
  int64_t faults_before = 0;
  for (int k = 0; k < options.warmup + options.iters; ++k) {
    if (k == options.warmup && options.server_pid > 0) {
      SUMMA_ASSIGN_OR_RETURN(faults_before, MinorFaults(options.server_pid));
    }
    FillContribution(options.rank, k, absl::MakeSpan(in));
    std::fill(out.begin(), out.end(), -1.0f);  // so a call that writes nothing is caught
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = exchange(in, out);
    const auto end = std::chrono::steady_clock::now();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", options.rank, ", iteration ", k, ": ", s.message()));
    }
    if (k >= options.warmup) {
      report.times_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
    if (out.size() != n) {
      if (report.correct) {
        report.detail = absl::StrCat("iteration ", k, " returned ", out.size(), " elements, not ", n);
      }
      report.correct = false;
      out.resize(n);
      continue;
    }
    const int64_t wrong = FirstWrongElement(options.group_size, k, out);
    if (wrong >= 0 && report.correct) {
      report.correct = false;
      report.detail = absl::StrFormat("element %d of iteration %d is %g, expected %g", wrong, k,
                                      out[wrong], ExpectedSum(options.group_size, k, wrong));
    }
  }
  if (options.server_pid > 0) {
    SUMMA_ASSIGN_OR_RETURN(const int64_t faults_after, MinorFaults(options.server_pid));
    report.server_faults = faults_after - faults_before;
  }
  return report;
}

absl::StatusOr<int64_t> MinorFaults(int pid) { return ProcStatField(pid, 10); }

absl::StatusOr<RankReport> RunSummaRank(const RankOptions& options) {
  SUMMA_ASSIGN_OR_RETURN(const worker::DataPlane plane, worker::ParseDataPlane(options.data_plane));
  worker::ParameterClient client(options.target, options.timeout, options.timeout, options.channels,
                                 ClientSecurity{options.tls, ""});
  client.set_data_plane(plane);
  worker::Collective group;
  group.name = "summa-bench-allreduce";
  group.rank = options.rank;
  group.group_size = options.group_size;
  group.members = false;
  return RunRank(options, [&](const std::vector<float>& in, std::vector<float>& out) {
    return SummaAllReduce(client, group, in, out);
  });
}

absl::StatusOr<RankReport> RunRawRank(const RankOptions& options) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<RawAllReduceClient> client,
                         RawAllReduceClient::Connect(options.target, options.timeout));
  return RunRank(options, [&](const std::vector<float>& in, std::vector<float>& out) {
    return client->AllReduce(in, out);
  });
}

absl::StatusOr<RankReport> RunGrpcRank(const RankOptions& options) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<GrpcAllReduceClient> client,
                         GrpcAllReduceClient::Connect(options.target, options.timeout));
  return RunRank(options, [&](const std::vector<float>& in, std::vector<float>& out) {
    return client->AllReduce(in, out);
  });
}

}  // namespace summa::bench
