// The pipeline benchmark (issue 14 part 3): LeNet split across two CPU backends
// (worker/models/pipeline.h) at several micro-batch counts, against the whole model on one backend. For
// each count: the step's wall time, each stage's busy time, their sum (what one device would
// spend on the same passes), and the bubble, the share of the two stages' time spent waiting:
// 1 - (stage 0 + stage 1) / (2 x step). It checks what it times: every split run's gradient
// equals the one-device gradient to 1e-5 of its largest value.
#ifndef SUMMA_BENCH_PIPELINE_PROFILE_H_
#define SUMMA_BENCH_PIPELINE_PROFILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace summa::bench {

struct PipelineProfileOptions {
  int batch = 256;
  std::vector<int> micro_batches = {1, 2, 4, 8};
  int steps = 20;  // timed, after `warmup` untimed ones
  int warmup = 3;
  std::string command_line;
};

struct PipelineRow {
  int micro_batches = 0;
  double step_ms = 0;
  double stage_ms[2] = {0, 0};
  double max_error = 0;  // largest |gradient - one device's| over the largest |gradient|
};

struct PipelineProfile {
  double one_device_ms = 0;  // LeNet on one backend, at the CPU backend's chunk
  std::vector<PipelineRow> rows;
};

absl::Status ValidatePipelineProfileOptions(const PipelineProfileOptions& o);
absl::StatusOr<PipelineProfile> ProfilePipeline(const PipelineProfileOptions& o);
// The report (markdown); `ok` says whether every check passed.
std::string FormatPipelineProfile(const PipelineProfileOptions& o, const PipelineProfile& p, bool* ok);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_PIPELINE_PROFILE_H_
