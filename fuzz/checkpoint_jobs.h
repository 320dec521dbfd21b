// The jobs checkpoint_fuzzer restores checkpoints into, and write_seeds writes one valid
// checkpoint of each.
#ifndef SUMMA_FUZZ_CHECKPOINT_JOBS_H_
#define SUMMA_FUZZ_CHECKPOINT_JOBS_H_

#include "server/core/job_options.h"

namespace summa::server {

inline constexpr int kCheckpointFuzzJobs = 3;

inline ServerOptions CheckpointFuzzJob(int index) {
  ServerOptions o;
  switch (index % kCheckpointFuzzJobs) {
    case 0:  // the shape of checkpoint_codec_test's snapshot: async, Adam (two slots)
      o.world_size = 2;
      o.mode = Mode::kAsync;
      o.partition_bytes = 16;
      o.optimizer.name = "adam";
      break;
    case 1:  // sync, plain SGD (no slots)
      o.world_size = 2;
      o.mode = Mode::kSync;
      o.partition_bytes = 16;
      break;
    default:  // ssp, SGD with momentum (one slot)
      o.world_size = 3;
      o.mode = Mode::kSsp;
      o.staleness = 1;
      o.partition_bytes = 8;
      o.optimizer.momentum = 0.9;
      break;
  }
  return o;
}

}  // namespace summa::server

#endif  // SUMMA_FUZZ_CHECKPOINT_JOBS_H_
