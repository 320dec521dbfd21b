#include "worker/worker.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/flags.h"
#include "common/idx.h"
#include "common/logging.h"
#include "common/rpc/metrics.h"
#include "common/rpc/server_builder.h"
#include "common/status_macros.h"
#include "worker/compute/devices.h"
#include "worker/models/model.h"
#include "client/ps_client.h"
#include "worker/worker_service.h"
#if SUMMA_FAULT_INJECTION
#include "worker/fault_injecting_store.h"
#endif

namespace summa::worker {
namespace {

// The signal thread of --after_training=wait (see RunWorker).
class TerminationWaiter {
 public:
  TerminationWaiter() {
    BlockTerminationSignals();
    thread_ = std::thread([this] {
      int sig = 0;
      while (sig == 0 && !stopping_.load()) sig = WaitForTerminationSignal(absl::Milliseconds(200));
      if (sig == 0) return;
      if (!training_done_.load()) {
        std::fprintf(stderr, "summa-worker: stopped by signal %d while training\n", sig);
        std::_Exit(128 + sig);
      }
      signalled_.Notify();
    });
  }
  ~TerminationWaiter() {
    stopping_.store(true);
    thread_.join();
  }
  void WaitAfterTraining() {
    training_done_.store(true);
    signalled_.WaitForNotification();
  }

 private:
  std::atomic<bool> stopping_{false};
  std::atomic<bool> training_done_{false};
  absl::Notification signalled_;
  std::thread thread_;
};

// Mirrors the status board into Prometheus metrics every half second, on its own thread.
class WorkerMetrics {
 public:
  WorkerMetrics(MetricsEndpoint* endpoint, const StatusBoard* board) : board_(board) {
    steps_ = &endpoint->Counter("summa_worker_steps_total", "Steps this worker completed");
    step_seconds_ = &endpoint->StepHistogram("summa_worker_step_seconds",
                                             "Wall time of a step: compute, push and pull");
    epoch_ = &endpoint->Gauge("summa_worker_epoch", "Epoch in progress or last finished");
    examples_per_second_ = &endpoint->Gauge("summa_worker_examples_per_second", "Global examples/s this epoch");
    loss_ = &endpoint->Gauge("summa_worker_loss", "Mean training loss of the last epoch");
    accuracy_ = &endpoint->Gauge("summa_worker_test_accuracy", "Test accuracy after the last epoch");
    thread_ = std::thread([this] { Loop(); });
  }
  ~WorkerMetrics() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    Update();
  }
  prometheus::Histogram* step_seconds() { return step_seconds_; }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(500))) Update();
  }
  void Update() {
    const WorkerState s = board_->Get();
    AdvanceCounter(*steps_, static_cast<double>(s.step));
    epoch_->Set(s.epoch);
    examples_per_second_->Set(s.examples_per_second);
    loss_->Set(s.last_loss);
    accuracy_->Set(s.last_test_accuracy);
  }

  const StatusBoard* const board_;  // Not owned.
  prometheus::Counter* steps_;
  prometheus::Histogram* step_seconds_;
  prometheus::Gauge *epoch_, *examples_per_second_, *loss_, *accuracy_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

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
  // A rank at or above --world_size is an elastic job's grower: the server checks it.
  if (options.trainer.rank < -1) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", options.trainer.rank, " is negative (-1: the server "
                                                   "assigns one)"));
  }
  // --after_training=wait: SIGTERM and SIGINT go to a thread of ours from the start (blocked
  // before any other thread exists). While training, one ends the process as the default
  // action would; once training is done, it ends the wait.
  std::optional<TerminationWaiter> waiter;
  if (options.after_training_wait) waiter.emplace();
  if (options.trainer.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--epochs must be at least 1, got ", options.trainer.epochs));
  }
  SUMMA_RETURN_IF_ERROR(ValidateTls(options.tls, /*server=*/false));
  SUMMA_RETURN_IF_ERROR(CheckMetricsAddress(options.metrics_address, options.tls));
  ClientToken token;  // its file read again when it changes: a rotated secret needs no restart
  if (!options.token_file.empty()) {
    SUMMA_ASSIGN_OR_RETURN(token, ClientToken::FromFile(options.token_file));
  }
  if (options.channels < 1 || options.channels > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--channels must be in [1, 64], got ", options.channels));
  }
  SUMMA_RETURN_IF_ERROR(ModelSpecs(options.trainer.model).status());
  // Metrics first: a bad address fails before the data is loaded.
  std::unique_ptr<MetricsEndpoint> metrics;
  if (!options.metrics_address.empty()) {
    SUMMA_ASSIGN_OR_RETURN(metrics, MetricsEndpoint::Start(options.metrics_address));
    if (!options.metrics_port_file.empty()) {
      SUMMA_RETURN_IF_ERROR(WriteFileAtomically(options.metrics_port_file, absl::StrCat(metrics->port(), "\n")));
    }
    SUMMA_LOG(INFO) << "metrics on port " << metrics->port() << " (/metrics)";
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
                         StartGrpcServer(options.status_address, {&service}, {"summa.v1.Worker"},
                                         ServerCredentialsFor(TlsFiles{options.tls.cert, options.tls.key, ""})));
  if (!options.status_port_file.empty()) {
    SUMMA_RETURN_IF_ERROR(WriteFileAtomically(options.status_port_file,
                                              absl::StrCat(status_server.port, "\n")));
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  TrainerOptions trainer_options = options.trainer;
  trainer_options.status_address = absl::StrCat(host, ":", status_server.port);
  SUMMA_LOG(INFO) << options.trainer.model << " worker (rank " << options.trainer.rank << " of " << options.trainer.world_size
 << ") on " << devices[0]->name()
                  << (devices.size() > 1 ? absl::StrCat(" and ", devices.size() - 1, " more devices") : "")
                  << (options.trainer.model_parallel == 2
                          ? absl::StrCat(" (the model split across them, ", options.trainer.micro_batches, " micro-batches)")
                          : "")
                  << ", status on port " << status_server.port
                  << ", server " << options.server;

  std::unique_ptr<WorkerMetrics> worker_metrics;
  if (metrics != nullptr) {
    worker_metrics = std::make_unique<WorkerMetrics>(metrics.get(), &board);
    prometheus::Histogram* steps = worker_metrics->step_seconds();
    trainer_options.step_observer = [steps](absl::Duration d) { steps->Observe(absl::ToDoubleSeconds(d)); };
  }
  std::unique_ptr<Tracer> tracer;
  if (!options.trace_file.empty()) {
    SUMMA_ASSIGN_OR_RETURN(tracer, Tracer::Open(options.trace_file,
                                                absl::StrCat("summa-worker rank ", options.trainer.rank)));
    trainer_options.tracer = tracer.get();
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> example_log(nullptr, &std::fclose);
  if (!options.example_log.empty()) {
    example_log.reset(std::fopen(options.example_log.c_str(), "a"));
    if (example_log == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--example_log=", options.example_log, ": cannot open it for "
                                                     "appending: ", std::strerror(errno)));
    }
    trainer_options.example_log = example_log.get();
  }
  ParameterClient client(options.server, options.call_deadline, options.join_deadline, options.channels,
                         ClientSecurity{options.tls, token});
  client.set_tracer(tracer.get());
  // A step the group changed under is computed again over the new group (every example once).
  client.set_recompute_on_stale_view(true);
  client.set_takes_local_steps(true);  // the trainer runs a DiLoCo job's local steps
  client.set_data_plane(options.data_plane);
  ParameterStore* store = &client;
#if SUMMA_FAULT_INJECTION
  std::unique_ptr<FaultInjectingStore> faulty;
  if (options.faults.any()) {
    faulty = std::make_unique<FaultInjectingStore>(&client, options.faults, stdout);
    store = faulty.get();
  }
#endif
  Trainer trainer(trainer_options, &train, &test, devices, store, &board, stdout);
  absl::Status result = trainer.Run();
  worker_metrics.reset();
  if (!result.ok()) board.Update([](WorkerState& s) { s.state = "failed"; });
  if (result.ok() && waiter.has_value()) {
    // A controller that restarts a pod that exits (a StatefulSet's, a Deployment's) would start
    // it again: it stays, its status saying "done", until it is stopped.
    std::printf("training done; waiting for SIGTERM (--after_training=wait)\n");
    std::fflush(stdout);
    waiter->WaitAfterTraining();
  }
  status_server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (tracer != nullptr) {
    absl::Status written = tracer->Close();
    if (result.ok()) result = written;
  }
  return result;
}

}  // namespace summa::worker
