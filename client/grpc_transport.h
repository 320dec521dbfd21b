// GrpcTransport: the data path's calls on gRPC (a DataTransport): generic unary calls on each
// shard's channels, their replies collected from one completion queue by the calling thread.
// Each shard's calls take its channels in turn. Call records are kept per tag across steps (a
// step allocates no record). Not thread-safe.
#ifndef SUMMA_CLIENT_GRPC_TRANSPORT_H_
#define SUMMA_CLIENT_GRPC_TRANSPORT_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "client/data_transport.h"
#include "common/rpc/tokens.h"

namespace summa::worker {

class GrpcTransport final : public DataTransport {
 public:
  // `channels[s]`: shard s's generic stubs, one per channel (not owned; they outlive this).
  // `token` goes with every call (its current value: none when empty).
  GrpcTransport(std::vector<std::vector<grpc::GenericStub*>> channels, ClientToken token);
  // Waits for every call in flight to end (they all have deadlines).
  ~GrpcTransport() override;

  void Start(size_t tag, int shard, DataMethod method, const grpc::ByteBuffer* request, grpc::ByteBuffer* reply,
             absl::Time deadline) override;
  bool Next(size_t* tag, absl::Status* status) override;
  void Wake() override;
  bool socket_plane() const override { return false; }

 private:
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
    grpc::Status status;
  };

  const std::vector<std::vector<grpc::GenericStub*>> channels_;
  const ClientToken token_;
  grpc::CompletionQueue queue_;
  // By tag. A deque: growing it keeps the records of calls in flight where gRPC writes their
  // statuses.
  std::deque<Call> calls_;
  std::vector<size_t> next_channel_;  // per shard
  size_t in_flight_ = 0;
  // Wake sets the alarm to fire on queue_ at once, unless it is set already.
  grpc::Alarm wake_;
  std::atomic<bool> wake_set_{false};
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_GRPC_TRANSPORT_H_
