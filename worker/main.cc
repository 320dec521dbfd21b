// summa-worker: parses flags and runs one worker of a training job (or a synthetic one).
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "common/allocator.h"
#include "common/flags.h"
#include "worker/flags.h"
#include "worker/synthetic.h"
#include "worker/worker.h"

namespace {

// Flags that cannot work: exit status 2, as for a flag Abseil refuses.
int FlagError(const absl::Status& status) {
  std::fprintf(stderr, "summa-worker: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  summa::KeepFreedMemoryForReuse();
  summa::ParseFlagsOrDie(argc, argv,
                         "one worker of a Summa training job. Trains the seed's LeNet (or --model) "
                         "on its shard of every global batch of Fashion-MNIST, pushing gradients to "
                         "summa-server and pulling the new weights; or, with --synthetic=SIZE, "
                         "pushes and pulls a model of SIZE bytes without computing anything.\n\n"
                         "  summa-worker --server=127.0.0.1:50051 --rank=0 --world_size=2\n"
                         "  summa-worker --server=127.0.0.1:50051 --rank=0 --world_size=2 "
                         "--synthetic=64MiB --steps=20");
  absl::Status status;
  if (summa::worker::SyntheticRequested()) {
    absl::StatusOr<summa::worker::SyntheticOptions> options = summa::worker::SyntheticOptionsFromFlags();
    if (!options.ok()) return FlagError(options.status());
    status = summa::worker::RunSyntheticWorker(*options);
  } else {
    absl::StatusOr<summa::worker::WorkerOptions> options = summa::worker::WorkerOptionsFromFlags();
    if (!options.ok()) return FlagError(options.status());
    status = summa::worker::RunWorker(*options);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "summa-worker: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
