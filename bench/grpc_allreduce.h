// The raw reference's exchange (bench/raw_allreduce.h) over bare gRPC, with nothing of Summa's:
// what gRPC itself costs on this machine. One generic unary method carries the tensor's bytes as
// the whole message (no protobuf); the server is gRPC's async API polled by one thread of its own,
// the fewest thread hand-offs gRPC offers (its callback API, which summa-server uses, adds one).
// Each round the server copies every rank's tensor out of gRPC's receive slices, sums them, and
// once all are in answers every rank with one copy of the sum.
#ifndef SUMMA_BENCH_GRPC_ALLREDUCE_H_
#define SUMMA_BENCH_GRPC_ALLREDUCE_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/raw_allreduce.h"

namespace summa::bench {

// Listens on 127.0.0.1 (port chosen by the OS, written to options.port_file) and serves rounds
// of options.group_size calls of options.bytes until the process is stopped (the driver reads
// its peak RSS first) or options.timeout passes.
absl::Status RunGrpcServer(const RawServerOptions& options);

// One rank's channel to that server. Not thread-safe.
class GrpcAllReduceClient {
 public:
  // `address` is 127.0.0.1:PORT; `timeout` bounds the connect and every call.
  static absl::StatusOr<std::unique_ptr<GrpcAllReduceClient>> Connect(const std::string& address,
                                                                      absl::Duration timeout);
  GrpcAllReduceClient(const GrpcAllReduceClient&) = delete;
  GrpcAllReduceClient& operator=(const GrpcAllReduceClient&) = delete;

  // Sends `in` (without copying it) and writes the sum into `out` (the same size).
  absl::Status AllReduce(const std::vector<float>& in, std::vector<float>& out);

 private:
  GrpcAllReduceClient(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout);

  const absl::Duration timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
  grpc::CompletionQueue queue_;
  std::vector<grpc::Slice> slices_;  // the reply's, reused
};

}  // namespace summa::bench

#endif  // SUMMA_BENCH_GRPC_ALLREDUCE_H_
