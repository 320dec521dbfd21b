// summa-worker's flags, defined in flags.cc so that summa-worker and the test of their defaults
// (tests/worker_flags_test.cc) link the same definitions. A flag that fills an option takes its
// default from a default-constructed options struct, so the two cannot disagree; the functions
// below read the flags (after absl::ParseCommandLine) into the worker's options.
#ifndef SUMMA_WORKER_FLAGS_H_
#define SUMMA_WORKER_FLAGS_H_

#include "absl/status/statusor.h"
#include "worker/synthetic.h"
#include "worker/worker.h"

namespace summa::worker {

// Whether --synthetic=SIZE was given: a synthetic worker (RunSyntheticWorker), not a trainer.
bool SyntheticRequested();
// The flags as options for RunWorker, or INVALID_ARGUMENT naming the first flag that cannot work
// (--steps without --synthetic, say). RunWorker checks the rest.
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags();
// The flags as options for RunSyntheticWorker (validated), or INVALID_ARGUMENT naming the first
// flag that cannot work, a training flag given with --synthetic among them.
absl::StatusOr<SyntheticOptions> SyntheticOptionsFromFlags();

}  // namespace summa::worker

#endif  // SUMMA_WORKER_FLAGS_H_
