// summa-bench-pipeline: parses flags and runs the pipeline benchmark (bench/pipeline_profile.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/invocation.h"
#include "bench/pipeline_profile.h"
#include "common/flags.h"

ABSL_FLAG(int, batch, 256, "examples per step (one worker's shard of the global batch)");
ABSL_FLAG(std::string, micro_batches, "1,2,4,8", "the micro-batch counts to run, comma-separated");
ABSL_FLAG(int, steps, 20, "timed steps per count");
ABSL_FLAG(int, warmup, 3, "untimed steps first");

namespace {

constexpr char kUsage[] =
    "the pipeline benchmark: LeNet split across two CPU backends (summa-worker --model_parallel=2) "
    "at each micro-batch count, against the whole model on one; prints each stage's busy time, "
    "their sum against the step's wall time, and the bubble; exits 1 if a split gradient differs "
    "from the one-device gradient.\n\n"
    "  OPENBLAS_NUM_THREADS=1 summa-bench-pipeline --batch=256 --micro_batches=1,2,4,8";

}  // namespace

int main(int argc, char** argv) {
  summa::ParseFlagsOrDie(argc, argv, kUsage);
  summa::bench::PipelineProfileOptions o;
  o.batch = absl::GetFlag(FLAGS_batch);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.command_line = summa::bench::CommandLine(argc, argv);
  o.micro_batches.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_micro_batches), ',')) {
    int m = 0;
    if (!absl::SimpleAtoi(part, &m)) {
      std::fprintf(stderr, "summa-bench-pipeline: --micro_batches: '%s' is not a number\n", std::string(part).c_str());
      return 2;
    }
    o.micro_batches.push_back(m);
  }
  if (absl::Status valid = summa::bench::ValidatePipelineProfileOptions(o); !valid.ok()) {
    std::fprintf(stderr, "summa-bench-pipeline: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  absl::StatusOr<summa::bench::PipelineProfile> profile = summa::bench::ProfilePipeline(o);
  if (!profile.ok()) {
    std::fprintf(stderr, "summa-bench-pipeline: %s\n", profile.status().ToString().c_str());
    return 1;
  }
  bool ok = false;
  std::fputs(summa::bench::FormatPipelineProfile(o, *profile, &ok).c_str(), stdout);
  return ok ? 0 : 1;
}
