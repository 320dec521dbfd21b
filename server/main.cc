// summa-server: parses flags and runs the parameter-server daemon until SIGINT or SIGTERM.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/flags.h"
#include "common/trace.h"
#include "server/daemon.h"
#include "server/flags.h"

int main(int argc, char** argv) {
  summa::KeepFreedMemoryForReuse();
  summa::ParseFlagsOrDie(argc, argv,
                         "the Summa parameter server. Holds the master weights, sums "
                         "the gradients workers push, applies the optimizer and serves the new "
                         "parameters; also serves AllReduce.\n\n  summa-server --workers=2 --lr=0.2");
  absl::StatusOr<summa::server::ServerOptions> parsed = summa::server::ServerOptionsFromFlags();
  if (!parsed.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  summa::server::ServerOptions& options = *parsed;
  std::unique_ptr<summa::Tracer> tracer;
  if (!absl::GetFlag(FLAGS_trace_file).empty()) {
    absl::StatusOr<std::unique_ptr<summa::Tracer>> opened =
        summa::Tracer::Open(absl::GetFlag(FLAGS_trace_file), "summa-server");
    if (!opened.ok()) {
      std::fprintf(stderr, "summa-server: %s\n", std::string(opened.status().message()).c_str());
      return 2;
    }
    tracer = *std::move(opened);
    options.tracer = tracer.get();
  }
  absl::StatusOr<summa::EndpointSecurity> security = summa::server::SecurityFromFlags();
  if (!security.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<summa::server::Coordinator> coordinator = summa::server::CoordinatorFromFlags();
  if (!coordinator.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(coordinator.status().message()).c_str());
    return 2;
  }
  const bool tls = security->tls.enabled();
  summa::BlockTerminationSignals();
  auto server = summa::server::SummaServer::Start(absl::GetFlag(FLAGS_address), options,
                                                  absl::GetFlag(FLAGS_metrics_address), *std::move(security),
                                                  absl::GetFlag(FLAGS_health_address), *std::move(coordinator),
                                                  absl::GetFlag(FLAGS_data_address),
                                                  absl::GetFlag(FLAGS_shm_socket));
  if (!server.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const int port = (*server)->port();
  std::string mode = absl::StrCat(summa::server::JobModeName(options), " mode");
  if (options.sync_every > 0) absl::StrAppend(&mode, " (", options.sync_every, " local steps between exchanges)");
  if (options.backup_workers > 0) {
    absl::StrAppend(&mode, " (", options.backup_workers, " backup worker", options.backup_workers == 1 ? "" : "s", ")");
  }
  std::printf("summa-server listening on port %d: %d workers, %s, %s, partitions of %lld bytes%s\n",
              port, options.world_size, mode.c_str(),
              (*server)->core().Status().optimizer.c_str(), static_cast<long long>(options.partition_bytes),
              options.shards > 1 ? absl::StrCat(", shard ", options.shard, " of ", options.shards).c_str() : "");
  std::fflush(stdout);
  // Writes a bound port to its --*_port_file, when one is given.
  auto write_port = [](const std::string& file, int bound) {
    if (file.empty()) return true;
    absl::Status written = summa::WriteFileAtomically(file, absl::StrCat(bound, "\n"));
    if (!written.ok()) std::fprintf(stderr, "summa-server: %s\n", std::string(written.message()).c_str());
    return written.ok();
  };
  if (!write_port(absl::GetFlag(FLAGS_port_file), port)) return 1;
  if ((*server)->metrics_port() != 0) {
    std::printf("summa-server: metrics on port %d (/metrics)\n", (*server)->metrics_port());
    std::fflush(stdout);
    if (!write_port(absl::GetFlag(FLAGS_metrics_port_file), (*server)->metrics_port())) return 1;
  }
  if ((*server)->health_port() != 0) {
    std::printf("summa-server: health (plaintext, grpc.health.v1.Health only) on port %d\n",
                (*server)->health_port());
    std::fflush(stdout);
    if (!write_port(absl::GetFlag(FLAGS_health_port_file), (*server)->health_port())) return 1;
  }
  if ((*server)->data_port() != 0) {
    std::printf("summa-server: socket data plane (%s) on port %d\n", tls ? "TLS 1.3" : "plaintext",
                (*server)->data_port());
    std::fflush(stdout);
    if (!write_port(absl::GetFlag(FLAGS_data_port_file), (*server)->data_port())) return 1;
  }
  summa::server::SummaServer& running = **server;
  running.StopOnTerminationSignals();
  const std::string job_error = running.Wait();
  running.Shutdown();
  if (tracer != nullptr) {
    if (absl::Status s = tracer->Close(); !s.ok()) {
      std::fprintf(stderr, "summa-server: %s\n", std::string(s.message()).c_str());
    }
  }
  if (absl::Status exported = running.final_export(); !exported.ok()) {
    std::fprintf(stderr, "summa-server: --export=%s: %s\n", options.export_path.c_str(),
                 std::string(exported.message()).c_str());
    return 1;
  }
  if (!job_error.empty()) {
    std::fprintf(stderr, "summa-server: the job ended: %s\n", job_error.c_str());
    return 1;
  }
  return 0;
}
