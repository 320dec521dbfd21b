// SocketPlane: the server's end of the socket data plane (common/rpc/socket_frame.h). One thread
// accepts connections; each connection has a thread of its own, which reads a call into one of
// the plane's few request buffers (kept across calls), hands it to the service's data-path
// handler (the handlers gRPC's data path calls, server/rpc/data_path.h), waits for the answer (at
// once, or when a
// round or a step completes on another thread) and writes it from the core's snapshot without a
// copy. A connection that closes while its call waits cancels the call, as a gRPC client's
// cancellation does. Thread-safe.
// socket_plane.cc stays one file of about 470 lines: the acceptor and its connections share the
// plane's private state (limits, buffers, the connection list) and each other's life cycle;
// apart, each would read the other's internals.
#ifndef SUMMA_SERVER_RPC_SOCKET_PLANE_H_
#define SUMMA_SERVER_RPC_SOCKET_PLANE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/socket_frame.h"
#include "common/rpc/socket_tls.h"
#include "common/rpc/transport.h"
#include "server/core/limits.h"
#include "server/rpc/service.h"

namespace summa::server {

struct SocketPlaneOptions {
  // A request longer than this is refused and its connection closed (--max_message_bytes).
  int64_t max_message_bytes = LimitOptions().max_message_bytes;
  // At most this many connections at once, and of them at most `max_connections_in_hello` that
  // have not yet passed their hello (a peer without a token holds no more); a connection past
  // either is refused (RESOURCE_EXHAUSTED, naming the limit) as it is accepted. Each holds a
  // thread.
  int max_connections = 4096;
  int max_connections_in_hello = 64;
  // The gRPC port's TLS files: when set, the plane speaks TLS 1.3 with them (the same
  // certificate, and with a CA the same client certificates required), its hello inside.
  TlsFiles tls;
};

class SocketPlane {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a port). `service` and `tokens` are not owned and
  // outlive the plane.
  static absl::StatusOr<std::unique_ptr<SocketPlane>> Start(const std::string& address,
                                                            ParameterServerService* service,
                                                            const TokenCheck* tokens,
                                                            const SocketPlaneOptions& options);
  ~SocketPlane();

  int port() const { return port_; }
  // Closes the listener and every connection and joins their threads. Calls still waiting must
  // have been answered first (the core's and the hub's Shutdown answer them all). Idempotent.
  void Stop();

  // Connections open now.
  int connections() const;

  class Connection;
  class BodyBuffers;
  // Requests are read into buffers of the plane's, two per core and from kMinBodyBuffers to
  // kMaxBodyBuffers of them: what the server holds of requests at once (a request waits for one
  // while all are in use).
  static constexpr int kMinBodyBuffers = 4;
  static constexpr int kMaxBodyBuffers = 16;

 private:
  SocketPlane(ParameterServerService* service, const TokenCheck* tokens, const SocketPlaneOptions& options);
  void AcceptLoop();
  // Logs, once, how the plane's TLS runs (its suite, and whether the kernel does the crypto).
  void NoteTls(const socket_plane::Link& link);
  // Joins and drops the connections whose threads have ended.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterServerService* const service_;
  const TokenCheck* const tokens_;
  const SocketPlaneOptions options_;
  const std::unique_ptr<BodyBuffers> bodies_;
  std::unique_ptr<socket_plane::TlsContext> tls_;  // none: plaintext
  std::atomic<bool> tls_noted_{false};
  socket_plane::OwnedFd listener_;
  int port_ = 0;
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> in_hello_{0};  // connections accepted whose hello is not yet done
  std::vector<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_SOCKET_PLANE_H_
