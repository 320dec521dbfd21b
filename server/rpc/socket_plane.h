// SocketPlane: the server's end of the socket data plane (common/rpc/socket_frame.h). One thread
// accepts connections; each connection has a thread of its own, which reads a call into one of
// the plane's few request buffers (kept across calls), hands it to the service's data-path
// handler (the handlers gRPC's data path calls, server/rpc/data_path.h), waits for the answer (at
// once, or when a
// round or a step completes on another thread) and writes it from the core's snapshot without a
// copy. A connection that closes while its call waits cancels the call, as a gRPC client's
// cancellation does. A connection's first exchange, its hello, proves its token; connections
// still in it are bounded, and past a bound an older one is evicted rather than the newcomer
// refused (SocketPlaneOptions), so that connections without a token cannot shut members out.
// Thread-safe.
// The same class serves the shared-memory plane (SocketPlaneOptions::shm_socket): a Unix socket
// instead of TCP, never TLS, each connection with two segments (common/shared_segment.h): the
// client's, whose requests the handlers read in place (they sum straight out of it), and the
// connection's reply segment, which the client maps read-only and reads its replies out of.
// socket_plane.cc stays one file of about 720 lines: the acceptor and its connections share the
// plane's private state (limits, buffers, the connection list) and each other's life cycle;
// apart, each would read the other's internals. Which connection an eviction takes is a rule of
// its own (server/rpc/hello_evictions.h), and a shared-memory connection's segments are a class
// of their own (server/rpc/shm_segments.h).
#ifndef SUMMA_SERVER_RPC_SOCKET_PLANE_H_
#define SUMMA_SERVER_RPC_SOCKET_PLANE_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/socket_frame.h"
#include "common/rpc/socket_tls.h"
#include "common/rpc/transport.h"
#include "common/trace.h"
#include "server/core/limits.h"
#include "server/rpc/reply_turns.h"
#include "server/rpc/service.h"

namespace summa::server {

struct SocketPlaneOptions {
  // A request longer than this is refused and its connection closed (--max_message_bytes).
  int64_t max_message_bytes = LimitOptions().max_message_bytes;
  // At most this many connections at once: one past it is refused (RESOURCE_EXHAUSTED, naming
  // the flag) as it is accepted. Each holds a thread.
  int64_t max_connections = LimitOptions().max_data_plane_connections;
  // Connections still in their hello (accepted, their token not yet checked), in all and per
  // source address (host, any port). A peer without a token holds no more; but one past either
  // bound is taken, and an older connection in its hello closed in its place (an eviction): the
  // source's own, or for the total the source holding the most; those that have sent no byte yet
  // first (a client sends its hello as it connects), then the oldest. A flood from a member's own
  // address (a NAT) churns its own idle connections, and the member's, which say their hello at
  // once, get through. A connection past its hello is never evicted.
  int64_t max_connections_in_hello = LimitOptions().max_data_plane_connections_in_hello;
  int64_t max_connections_in_hello_per_source = LimitOptions().max_data_plane_connections_in_hello_per_source;
  // From its accept, how long a connection has to send its hello; one that has not is closed then.
  absl::Duration hello_timeout = LimitOptions().data_plane_hello_timeout;
  // The gRPC port's TLS files: when set, the plane speaks TLS 1.3 with them (the same
  // certificate, and with a CA the same client certificates required), its hello inside.
  TlsFiles tls;
  // When set: the shared-memory plane, on a Unix socket at this path (made with mode 0666: the
  // hello's token admits, as on TCP; the segments no other user can open), instead of TCP; `tls`
  // does not apply. `shm_instance` is the number attach answers carry.
  std::string shm_socket;
  uint64_t shm_instance = 0;
  // The largest values segment a worker may attach (kAttachValues): its flat buffers.
  uint64_t max_values_segment_bytes = uint64_t{4} * LimitOptions().max_model_bytes;
  // Where each reply of values to a worker is traced ("reply", with its partition: the order of
  // ReplyTurns). Not owned; may be null.
  Tracer* tracer = nullptr;
};

class SocketPlane {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a port), or on options.shm_socket when set (then
  // `address` is ignored). `service` and `tokens` are not owned and outlive the plane.
  static absl::StatusOr<std::unique_ptr<SocketPlane>> Start(const std::string& address,
                                                            ParameterServerService* service,
                                                            const TokenCheck* tokens,
                                                            const SocketPlaneOptions& options);
  ~SocketPlane();

  int port() const { return port_; }
  bool shm() const { return !options_.shm_socket.empty(); }
  // Closes the listener and every connection and joins their threads. Calls still waiting must
  // have been answered first (the core's and the hub's Shutdown answer them all). Idempotent.
  void Stop();

  // Connections open now.
  int connections() const;
  // Since the plane started: connections whose hello passed (a member's), whose hello failed
  // (timed out, not a hello, or a token refused), and closed in their hello to make room for a
  // newer one (SocketPlaneOptions' bounds).
  uint64_t hellos_passed() const { return hellos_passed_.load(std::memory_order_relaxed); }
  uint64_t hellos_failed() const;
  uint64_t hello_evictions() const;
  // The shared-memory plane's: calls whose request was read from a segment, and replies written
  // into one.
  uint64_t requests_in_segments() const { return requests_in_segments_.load(std::memory_order_relaxed); }
  uint64_t replies_in_segments() const { return replies_in_segments_.load(std::memory_order_relaxed); }
  // ... and requests whose values were read in the worker's values segment (kValuesElsewhere).
  uint64_t values_in_place() const { return values_in_place_.load(std::memory_order_relaxed); }
  // Replies of values waiting for their worker's turn (ReplyTurns) now.
  int64_t replies_waiting_turn() const { return turns_.waiting(); }

  class Connection;
  class BodyBuffers;
  class Tally;
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
  // Evicts connections in their hello until a new one from `source` is within both bounds.
  void MakeRoomInHello(const std::string& source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterServerService* const service_;
  const TokenCheck* const tokens_;
  const SocketPlaneOptions options_;
  const std::unique_ptr<BodyBuffers> bodies_;
  std::unique_ptr<socket_plane::TlsContext> tls_;  // none: plaintext
  std::atomic<bool> tls_noted_{false};
  socket_plane::OwnedFd listener_;
  int port_ = 0;
  std::pair<dev_t, ino_t> socket_inode_ = {0, 0};  // the shared-memory plane's socket, as bound
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> hellos_passed_{0};
  std::atomic<uint64_t> requests_in_segments_{0};
  std::atomic<uint64_t> replies_in_segments_{0};
  std::atomic<uint64_t> values_in_place_{0};
  ReplyTurns turns_;  // a worker's replies of values, the earliest partition first
  const std::unique_ptr<Tally> hellos_failed_;
  const std::unique_ptr<Tally> evictions_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_SOCKET_PLANE_H_
