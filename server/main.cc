// summa-server: parses flags and runs the parameter-server daemon until SIGINT or SIGTERM.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "server/service.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "host:port to listen on; port 0 lets the OS choose (see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the port actually bound to this file once listening");
ABSL_FLAG(int, workers, 1, "number of workers in the job (the sync barrier waits for all of them)");
ABSL_FLAG(std::string, mode, "sync",
          "consistency mode: sync (bulk-synchronous: a step completes when every worker pushed)");
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
                         "summa-server: the Summa parameter server. Holds the master weights, sums "
                         "the gradients workers push, applies the optimizer and serves the new "
                         "parameters; also serves AllReduce.\n\n  summa-server --workers=2 --lr=0.2");
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "sync") {
    std::fprintf(stderr, "summa-server: --mode=%s is not supported; use --mode=sync\n", mode.c_str());
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

  summa::BlockTerminationSignals();
  auto server = summa::server::SummaServer::Start(absl::GetFlag(FLAGS_address), options);
  if (!server.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const int port = (*server)->port();
  std::printf("summa-server listening on port %d: %d workers, %s, %s, partitions of %lld bytes\n",
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
  const int sig = summa::WaitForTerminationSignal();
  std::printf("summa-server: signal %d, shutting down\n", sig);
  (*server)->Shutdown();
  return 0;
}
