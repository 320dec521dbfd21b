// DataTransport: how the data path's calls (Initialize, Push, Pull, PushPull, AllReduce) travel
// from ParameterClient to the shards. Every call started is in flight at once; the calling
// thread collects them in Next, in the order they end, so that no other thread hands a reply
// over. Two implementations: GrpcTransport (client/grpc_transport.h: generic stubs on a
// completion queue) and SocketCalls (client/socket_calls.h: the socket data plane). Not
// thread-safe.
#ifndef SUMMA_CLIENT_DATA_TRANSPORT_H_
#define SUMMA_CLIENT_DATA_TRANSPORT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/data_method.h"
#include "common/shared_segment.h"
#include "grpcpp/support/byte_buffer.h"

namespace summa::worker {

class DataTransport {
 public:
  virtual ~DataTransport() = default;

  // Starts call `tag` of `method` to `shard`, ended by `deadline` at the latest. `request` stays
  // alive and unchanged until the call ends; `reply` then holds the reply message, valid until
  // call `tag` starts again. A tag is started again only after it ended. The `reply` object
  // itself outlives the transport or the tag's next start, whichever comes first: the
  // shared-memory plane may rewrite it (the same message, moved out of a segment) meanwhile.
  virtual void Start(size_t tag, int shard, DataMethod method, const grpc::ByteBuffer* request,
                     grpc::ByteBuffer* reply, absl::Time deadline) = 0;
  // Waits for the next call to end: its tag and status. False when none is in flight. True
  // with *tag == kWoken when Wake was called since the last Next returned (the caller has other
  // work: calls to start); a caller that never wakes it skips such a tag.
  virtual bool Next(size_t* tag, absl::Status* status) = 0;
  static constexpr size_t kWoken = ~size_t{0};
  // Makes a Next in progress, or the next one, return kWoken. Thread-safe: the one method
  // another thread may call.
  virtual void Wake() = 0;

  // Whether it is the socket data plane (the shared-memory plane is one too).
  virtual bool socket_plane() const = 0;
  // Whether it is the shared-memory plane, to every shard.
  virtual bool shm() const { return false; }
  // The shared-memory plane: a request whose values lie in `values` (a segment of the caller's,
  // alive until this transport goes) names them there instead of copying them. Others ignore it.
  virtual void ShareValues(const SharedSegment* values) {}
  // True once a connection could not be opened (the plane moved or went away, as when its
  // server restarted on another port): the client should ask where it is again.
  virtual bool lost() const { return false; }
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_DATA_TRANSPORT_H_
