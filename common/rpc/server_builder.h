// Starts a gRPC server with Summa's defaults: server reflection, the health service for the
// given services, message limits that fit a partition, and the port chosen by the OS when the
// address ends in ":0". Also a health-only listener that follows such a server.
#ifndef SUMMA_COMMON_RPC_SERVER_BUILDER_H_
#define SUMMA_COMMON_RPC_SERVER_BUILDER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/message_size.h"  // kMaxMessageBytes
#include "common/rpc/health_service.h"

namespace summa {

struct RunningServer {
  std::unique_ptr<HealthService> health;
  // For the async API's calls, as many as asked for; destroyed after the server.
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// How long a connection to any of these servers has to finish its TLS handshake and send
// HTTP/2's preface and SETTINGS before gRPC closes it (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
// whose default, 120 s, let anyone who reaches the port hold a connection that long without a
// byte). A gRPC client does all that in one round trip after it connects, TLS in two or three.
inline constexpr int kServerHandshakeTimeoutMs = 2000;

// `services` are not owned and must outlive the server. Messages over `max_message_bytes` are
// refused by gRPC's transport (RESOURCE_EXHAUSTED). `completion_queues`: queues for services
// with async methods (RunningServer::queues), which the caller must poll. Fails with
// UNAVAILABLE naming the address when it cannot be bound.
absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const std::vector<std::string>& service_names,
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials(),
    int max_message_bytes = kMaxMessageBytes, int completion_queues = 0);

// A plaintext listener that serves grpc.health.v1.Health and nothing else (no reflection, no
// data), answering as `leader` does: for probes that cannot speak TLS (kubelet's grpc probes)
// beside an endpoint that does. It takes messages of up to kHealthMaxMessageBytes. `leader` is
// not owned and must outlive the server. Fails like StartGrpcServer.
inline constexpr int kHealthMaxMessageBytes = 1 << 10;
absl::StatusOr<RunningServer> StartHealthOnlyServer(const std::string& address, const HealthService* leader);

// gRPC reads a socket into buffers of a size it adapts from call to call (by default from 256
// bytes to 4 MiB). The reads' sizes are bounded on both sides: at most 1 MiB, so a big message
// is read into buffers that the next call can reuse (KeepFreedMemoryForReuse keeps them), and
// at least a page. Not one fixed size: a fixed 1 MiB buffer for every read made a 4 KiB
// two-rank AllReduce take 443-474 µs against 230-253 µs with these bounds, with the same times
// and server peak RSS from 1 MiB to 64 MiB (summa-bench-allreduce, alternating, twice).
inline constexpr int kMinReadChunkBytes = 4 << 10;
inline constexpr int kMaxReadChunkBytes = 1 << 20;
std::vector<std::pair<std::string, int>> DataPathArguments();

// Channel arguments that match the server's limits.
grpc::ChannelArguments DefaultChannelArguments();

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_SERVER_BUILDER_H_
