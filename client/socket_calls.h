// SocketCalls: the client's end of the socket data plane (common/rpc/socket_frame.h), a
// DataTransport (client/data_transport.h). It keeps
// connections to each shard's plane, opened as calls need them (at most
// kMaxConnectionsPerShard; later calls wait for one to come free) and kept across calls. Every
// call started is in flight at once, each on a connection of its own (their requests sent one
// after another per shard, in the order they started: kSendsPerShard), and the calling thread
// drives them all (poll) in Next, which hands them back in the order they end: no thread of
// gRPC's, no hand-over between threads. A call past its deadline has its connection closed
// (which cancels it on the server). Not thread-safe.
//
// The same class is the client of the shared-memory plane, for a shard on this host (an
// Endpoint with a shm_socket): Unix connections, each with a request segment of its own that a
// call's request is copied into (the server sums straight out of it) and the server's reply
// segment, mapped read-only, that a reply is read from in place (the caller's parse is the one
// copy out). A reply stays in its connection's segment until its tag starts again; a connection
// holding one is taken for another call only when no other is free, its reply then copied aside.
#ifndef SUMMA_CLIENT_SOCKET_CALLS_H_
#define SUMMA_CLIENT_SOCKET_CALLS_H_

#include <poll.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/data_transport.h"
#include "common/rpc/socket_frame.h"
#include "common/rpc/socket_tls.h"
#include "common/rpc/wire.h"
#include "common/shared_segment.h"
#include "grpcpp/support/byte_buffer.h"

namespace summa::worker {

class SocketCalls final : public DataTransport {
 public:
  static constexpr int kMaxConnectionsPerShard = 32;
  // The longest reply it takes.
  static constexpr uint64_t kMaxReplyBytes = uint64_t{4} << 30;

  struct Endpoint {
    Endpoint() = default;
    Endpoint(std::string host, int port, std::string shm_socket = "", uint64_t shm_instance = 0)
        : host(std::move(host)), port(port), shm_socket(std::move(shm_socket)), shm_instance(shm_instance) {}
    std::string host;
    int port = 0;
    // The shared-memory plane's socket (DataPlaneResponse.shm_socket) and the instance its
    // attach must answer with; empty: the socket data plane at host:port.
    std::string shm_socket;
    uint64_t shm_instance = 0;
  };
  // `authorization`: the hello's value ("Bearer <token>", or empty). `tls`: the context TLS
  // connections start from (the shards' planes speak TLS), or null for plaintext; not owned, it
  // outlives this object. `segment_bytes`: the shared-memory plane's segments, each way, per
  // connection (a request or reply longer goes on the socket).
  SocketCalls(std::vector<Endpoint> shards, std::string authorization, socket_plane::TlsContext* tls = nullptr,
              uint64_t segment_bytes = kDefaultSegmentBytes);
  static constexpr uint64_t kDefaultSegmentBytes = (4 << 20) + (64 << 10);
  ~SocketCalls() override;

  // Opens a connection to `shard` now (a probe that the plane is reachable); it stays for calls.
  // One that the server closes before its hello is answered is opened again, up to
  // kHelloAttempts in all, kFirstHelloBackoff apart and doubling, within `deadline`.
  absl::Status Open(int shard, absl::Time deadline);
  static constexpr int kHelloAttempts = 5;
  static constexpr absl::Duration kFirstHelloBackoff = absl::Milliseconds(10);

  // Starts call `tag` (below the number of calls this object has been given at once so far:
  // replies are kept per tag) to `shard`. `request` stays alive and unchanged until the call
  // ends; `reply` then holds the reply message, in memory of this object's that stays valid
  // until call `tag` starts again.
  void Start(size_t tag, int shard, DataMethod method, const grpc::ByteBuffer* request, grpc::ByteBuffer* reply,
             absl::Time deadline) override;
  // Waits for the next call to end; false when none is in flight.
  bool Next(size_t* tag, absl::Status* status) override;
  void Wake() override;
  bool socket_plane() const override { return true; }
  // Whether its connections are the shared-memory plane's (every shard's endpoint has a socket).
  bool shm() const override;
  // `shard`'s calls go to the socket data plane at its host:port from now on (its shared-memory
  // plane could not be opened); call before any connection to it is open.
  void UseSocketPlane(int shard) { shards_[shard].shm_socket.clear(); }
  const Endpoint& endpoint(int shard) const { return shards_[shard]; }
  // Each shared-memory connection sends `values` (read-only) before its first call after this;
  // a server that refuses it gets its requests' values copied, as before.
  void ShareValues(const SharedSegment* values) override { values_ = values; }

  // True once a connection could not be opened (the plane moved or went away, as when its
  // server restarted on another port): the caller should ask where it is again.
  bool lost() const override { return lost_; }

 private:
  struct Call {
    int shard = 0;
    socket_plane::DataMethod method{};
    const grpc::ByteBuffer* request = nullptr;
    grpc::ByteBuffer* reply = nullptr;
    absl::Time deadline;
  };
  struct Connection;
  // One try of Open; `connected` is set once the TCP connection is made.
  absl::Status OpenOnce(int shard, absl::Time deadline, bool* connected);
  // The shared-memory plane's attach on a connection whose hello passed.
  absl::Status Attach(const Endpoint& e, Connection& c, absl::Time deadline);
  // Sends values_ on `c` (idle) and reads the answer. A refusal turns the sharing off for c's
  // shard (logged). False when `c` cannot go on (refused: an older server closes it; or it
  // failed): the caller closes it.
  bool AttachValues(Connection& c, absl::Time deadline);
  // Where a request's values (`iov`'s last piece, after the header and the fields) lie in values_:
  // their offset and length into `place`; false when they are not all in it, on a float's boundary.
  bool PlaceOfValues(const std::vector<iovec>& iov, uint64_t place[2]) const;
  // Copies the reply that `c`'s segment holds for its tag aside, into that tag's own memory, so
  // that `c` can take another call.
  void MoveReplyAside(Connection& c);
  // Makes `c`'s reply from the pieces it listed (the reply segment's and published segments'),
  // mapping a published segment the first time it comes.
  absl::Status AssemblePieces(Connection& c);
  // Unmaps `shard`'s published segments that no reply held now names.
  void ForgetPublished(int shard);
  // Published segments mapped per shard past which the unused ones are unmapped.
  static constexpr size_t kMaxPublished = 1024;
  // Starts call `tag` on `c`: its request goes out now, or on the socket data plane after those
  // of its shard's calls started earlier (kSendsPerShard at a time).
  void Begin(Connection& c, size_t tag);
  // A request on the socket data plane goes out while at most this many others of its shard's
  // do: the calls' requests leave in the order the calls started (the partitions' order), so
  // that the first is whole at the server, summed and its reply on the way down while later
  // ones still go up. All at once, a link's streams share it and every request arrives at
  // the end: a link carries the pushes, then the pulls (bench/results-cluster.md).
  // A request counts as sent once its peer has all but kMaxUnackedBytes of it (SIOCOUTQ: what
  // the socket still holds, unsent or unacknowledged): neither the send buffer, which TCP
  // autotuning grows to megabytes, nor the bytes in flight, a bandwidth-delay product and a
  // queue's worth, are allowed to hold several requests of a shard at once.
  static constexpr int kSendsPerShard = 1;
  static constexpr int kMaxUnackedBytes = 128 << 10;
  // `c` has sent its request (or stops sending it): the next queued may go.
  void LeaveSend(Connection& c);
  // Sends the queued requests that may go now.
  void SendQueued();
  // Moves `c`'s call on as far as its socket allows; ends it when done or failed.
  void Advance(Connection& c);
  // Ends `c`'s call with `status`; a failed call's connection is closed.
  void End(Connection& c, absl::Status status);
  // A free connection to `shard`, opened now if there is room (nullptr when none);
  // UNAVAILABLE or DEADLINE_EXCEEDED when one could not be opened.
  absl::Status Acquire(int shard, absl::Time deadline, Connection** c);

  std::vector<Endpoint> shards_;
  const std::string authorization_;
  socket_plane::TlsContext* const tls_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Call> calls_;     // by tag
  std::vector<Scratch> bodies_;  // each tag's reply bytes
  const uint64_t segment_bytes_;
  // The shared-memory plane: the connection whose reply segment holds each tag's reply, if any.
  std::vector<Connection*> reply_home_;
  // The shared-memory plane: per shard, the server's published segments mapped, by number.
  std::vector<std::map<uint64_t, SharedSegment>> published_;
  // The caller's values segment (ShareValues), and per shard whether its server refused it.
  const SharedSegment* values_ = nullptr;
  std::vector<char> values_refused_;
  std::deque<size_t> waiting_;  // tags started while their shard had no connection free
  // Per shard: connections whose request is going out (at most kSendsPerShard), and those
  // whose request waits its turn, in the order their calls started.
  std::vector<int> sending_;
  std::vector<std::deque<Connection*>> send_queue_;
  std::deque<std::pair<size_t, absl::Status>> ended_;
  std::vector<pollfd> pollfds_;  // Next's, kept across calls
  std::vector<Connection*> polled_;
  // Per shard, the connections it may have: kMaxConnectionsPerShard, or as many as it had when
  // the server refused one more (until one of them closes).
  std::vector<int> caps_;
  size_t in_flight_ = 0;
  bool lost_ = false;
  // An eventfd Next polls beside the connections: Wake writes it.
  socket_plane::OwnedFd wake_;
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_SOCKET_CALLS_H_
