#include "worker/worker.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/idx.h"
#include "common/logging.h"
#include "common/server_builder.h"
#include "common/status_macros.h"
#include "worker/devices.h"
#include "worker/ps_client.h"
#include "worker/worker_service.h"

namespace summa::worker {
namespace {

void Truncate(Dataset& set, int64_t limit) {
  if (limit <= 0 || limit >= set.count) return;
  set.count = limit;
  set.images.resize(limit * set.rows * set.cols);
  set.labels.resize(limit);
}

}  // namespace

absl::Status RunWorker(const WorkerOptions& options) {
  if (options.trainer.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size must be at least 1, got ",
                                                   options.trainer.world_size));
  }
  if (options.trainer.rank < -1 || options.trainer.rank >= options.trainer.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", options.trainer.rank, " is outside 0..",
                                                   options.trainer.world_size - 1));
  }
  if (options.trainer.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--epochs must be at least 1, got ", options.trainer.epochs));
  }
  SUMMA_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Backend>> backends,
                         MakeBackends(options.device, options.threads));
  std::vector<Backend*> devices;
  for (auto& b : backends) devices.push_back(b.get());
  SUMMA_ASSIGN_OR_RETURN(Dataset train, LoadDataset(options.data_dir, "train"));
  SUMMA_ASSIGN_OR_RETURN(Dataset test, LoadDataset(options.data_dir, "t10k"));
  Truncate(train, options.train_limit);
  Truncate(test, options.test_limit);

  StatusBoard board;
  WorkerService service(&board);
  SUMMA_ASSIGN_OR_RETURN(RunningServer status_server,
                         StartGrpcServer(options.status_address, {&service}, {"summa.v1.Worker"}));
  if (!options.status_port_file.empty()) {
    SUMMA_RETURN_IF_ERROR(WriteFileAtomically(options.status_port_file,
                                              absl::StrCat(status_server.port, "\n")));
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  TrainerOptions trainer_options = options.trainer;
  trainer_options.status_address = absl::StrCat(host, ":", status_server.port);
  SUMMA_LOG(INFO) << "worker (rank " << options.trainer.rank << " of " << options.trainer.world_size
 << ") on " << devices[0]->name()
                  << (devices.size() > 1 ? absl::StrCat(" and ", devices.size() - 1, " more devices") : "")
                  << ", status on port " << status_server.port
                  << ", server " << options.server;

  ParameterClient client(options.server, options.call_deadline, options.join_deadline);
  Trainer trainer(trainer_options, &train, &test, devices, &client, &board, stdout);
  absl::Status result = trainer.Run();
  if (!result.ok()) board.Update([](WorkerState& s) { s.state = "failed"; });
  status_server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  return result;
}

}  // namespace summa::worker
