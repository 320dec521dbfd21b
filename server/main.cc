// summa-server: parses flags and runs the parameter-server daemon until SIGINT or SIGTERM.
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "server/service.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "host:port to listen on; port 0 lets the OS choose (see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the port actually bound to this file once listening");
ABSL_FLAG(std::string, metrics_address, "",
          "host:port for Prometheus metrics at /metrics (e.g. 0.0.0.0:9464; port 0: any free "
          "port); empty: no metrics");
ABSL_FLAG(std::string, metrics_port_file, "", "if set, write the bound metrics port to this file");
ABSL_FLAG(int, workers, 1, "number of workers in the job (the sync barrier waits for all of them)");
ABSL_FLAG(std::string, mode, "sync",
          "consistency mode: sync (a step completes when every worker pushed, as the seed), async "
          "(each push applied on arrival), or ssp (async, but a worker more than --staleness steps "
          "ahead of the slowest waits)");
ABSL_FLAG(int, staleness, 2, "ssp: how many steps a worker may run ahead of the slowest");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(10),
          "a worker that makes no call (workers heartbeat) for this long is lost");
ABSL_FLAG(std::string, on_worker_loss, "wait",
          "sync mode, when a worker is lost: wait (for it to rejoin, up to --rejoin_deadline) or "
          "shrink (go on without it, re-sharding the data over the rest)");
ABSL_FLAG(absl::Duration, rejoin_deadline, absl::Minutes(5),
          "with --on_worker_loss=wait: how long a lost worker may take to rejoin before the job "
          "ends with an error");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory for checkpoints (weights, optimizer state, version); the newest whole one is "
          "restored at start; empty: no checkpoints");
ABSL_FLAG(int64_t, checkpoint_every, 100,
          "write a checkpoint every this many steps (and on SIGTERM); 0: only on SIGTERM");
ABSL_FLAG(std::string, optimizer, "sgd",
          "optimizer applied to the summed gradient: sgd (divides by the examples pushed)");
ABSL_FLAG(double, lr, 0.1, "SGD learning rate");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum in [0, 1); 0 is the seed's plain SGD");
ABSL_FLAG(double, weight_decay, 0.0, "L2 weight decay added to the mean gradient");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20,
          "largest slice of the flat parameter buffer that one push or pull carries, in bytes");
ABSL_FLAG(absl::Duration, barrier_deadline, absl::Minutes(10),
          "how long a pull or an AllReduce waits for the rest of its group before it fails with "
          "DEADLINE_EXCEEDED (e.g. 30s, 10m)");

int main(int argc, char** argv) {
  summa::ParseFlagsOrDie(argc, argv,
                         "the Summa parameter server. Holds the master weights, sums "
                         "the gradients workers push, applies the optimizer and serves the new "
                         "parameters; also serves AllReduce.\n\n  summa-server --workers=2 --lr=0.2");
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "sync" && mode != "async" && mode != "ssp") {
    std::fprintf(stderr, "summa-server: --mode=%s: use sync, async or ssp\n", mode.c_str());
    return 2;
  }
  const std::string loss = absl::GetFlag(FLAGS_on_worker_loss);
  if (loss != "wait" && loss != "shrink") {
    std::fprintf(stderr, "summa-server: --on_worker_loss=%s: use wait or shrink\n", loss.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_optimizer) != "sgd") {
    std::fprintf(stderr, "summa-server: --optimizer=%s is not supported; use --optimizer=sgd\n",
                 absl::GetFlag(FLAGS_optimizer).c_str());
    return 2;
  }
  summa::server::ServerOptions options;
  options.world_size = absl::GetFlag(FLAGS_workers);
  options.sgd.learning_rate = absl::GetFlag(FLAGS_lr);
  options.sgd.momentum = absl::GetFlag(FLAGS_momentum);
  options.sgd.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  options.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  options.barrier_deadline = absl::GetFlag(FLAGS_barrier_deadline);
  options.mode = mode == "sync"    ? summa::server::Mode::kSync
                 : mode == "async" ? summa::server::Mode::kAsync
                                   : summa::server::Mode::kSsp;
  options.staleness = absl::GetFlag(FLAGS_staleness);
  options.lease = absl::GetFlag(FLAGS_lease);
  options.on_worker_loss =
      loss == "shrink" ? summa::server::OnWorkerLoss::kShrink : summa::server::OnWorkerLoss::kWait;
  options.rejoin_deadline = absl::GetFlag(FLAGS_rejoin_deadline);
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);

  summa::BlockTerminationSignals();
  auto server = summa::server::SummaServer::Start(absl::GetFlag(FLAGS_address), options,
                                                  absl::GetFlag(FLAGS_metrics_address));
  if (!server.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const int port = (*server)->port();
  std::printf("summa-server listening on port %d: %d workers, %s mode, %s, partitions of %lld bytes\n",
              port, options.world_size, mode.c_str(),
              (*server)->core().Status().optimizer.c_str(),
              static_cast<long long>(options.partition_bytes));
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    absl::Status written = summa::WriteFileAtomically(absl::GetFlag(FLAGS_port_file), absl::StrCat(port, "\n"));
    if (!written.ok()) {
      std::fprintf(stderr, "summa-server: %s\n", std::string(written.message()).c_str());
      return 1;
    }
  }
  if ((*server)->metrics_port() != 0) {
    std::printf("summa-server: metrics on port %d (/metrics)\n", (*server)->metrics_port());
    std::fflush(stdout);
    if (!absl::GetFlag(FLAGS_metrics_port_file).empty()) {
      absl::Status written = summa::WriteFileAtomically(absl::GetFlag(FLAGS_metrics_port_file),
                                                        absl::StrCat((*server)->metrics_port(), "\n"));
      if (!written.ok()) {
        std::fprintf(stderr, "summa-server: %s\n", std::string(written.message()).c_str());
        return 1;
      }
    }
  }
  summa::server::SummaServer* running = server->get();
  std::thread signals([running] {
    const int sig = summa::WaitForTerminationSignal();
    std::printf("summa-server: signal %d, shutting down\n", sig);
    std::fflush(stdout);
    running->Shutdown();
  });
  signals.detach();
  const std::string job_error = running->Wait();
  running->Shutdown();
  if (!job_error.empty()) {
    std::fprintf(stderr, "summa-server: the job ended: %s\n", job_error.c_str());
    return 1;
  }
  return 0;
}
