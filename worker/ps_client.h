// ParameterClient: the worker's side of summa.v1.ParameterServer, the ParameterStore the trainer
// uses outside tests. Joins (retrying while the
// server is not up or the model not yet defined), pulls, and push-pulls the flat gradient and
// weight buffers partition by partition, all partitions in flight at once. Messages are
// allocated once and reused every step. Every call carries a deadline. Not thread-safe, except
// Heartbeat, which a second thread may call at any time.
#ifndef SUMMA_WORKER_PS_CLIENT_H_
#define SUMMA_WORKER_PS_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/partition_map.h"
#include "common/tensor.h"
#include "summa/v1/summa.grpc.pb.h"
#include "worker/parameter_store.h"

namespace summa::worker {

class ParameterClient final : public ParameterStore {
 public:
  // `call_deadline` bounds each RPC (a push-pull waits for the slowest worker, so keep it longer
  // than the server's barrier deadline); `join_deadline` bounds the whole join with retries.
  ParameterClient(const std::string& address, absl::Duration call_deadline,
                  absl::Duration join_deadline);

  // ParameterStore:
  absl::StatusOr<JoinInfo> Join(int rank, int world, const std::vector<TensorSpec>& specs,
                                const float* initial, const std::string& status_address) override;
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, float* weights) override;
  absl::Status PushPull(uint64_t step, int64_t num_examples, const float* gradients, float* weights,
                        std::vector<int>* live_ranks) override;
  absl::StatusOr<bool> Push(uint64_t step, int64_t num_examples, const float* gradients) override;
  absl::Status Heartbeat(int rank) const override;
  absl::Status Leave(int rank) override;
  absl::StatusOr<std::vector<float>> AllReduce(const Collective& group,
                                               const std::vector<float>& values) override;
  std::string address() const override { return address_; }

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // Runs `start(i, context, done)` for each partition at once and waits for all.
  template <typename Start>
  absl::Status ForEachPartition(Start start);
  absl::Status CopyOut(const summa::v1::PullResponse& r, const PartitionRange& p, float* weights);
  // Partition i's reused request, filled with its slice of `gradients`.
  const summa::v1::PushRequest& PushRequestFor(size_t i, uint64_t step, int64_t num_examples,
                                               const float* gradients);

  const std::string address_;
  const absl::Duration call_deadline_;
  const absl::Duration join_deadline_;
  std::unique_ptr<summa::v1::ParameterServer::Stub> stub_;
  int rank_ = -1;
  summa::v1::Mode mode_ = summa::v1::MODE_SYNC;
  std::vector<PartitionRange> partitions_;
  // One request and response per partition, reused across steps.
  std::vector<summa::v1::PushRequest> push_requests_;
  std::vector<summa::v1::PullRequest> pull_requests_;
  std::vector<summa::v1::PullResponse> responses_;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_PS_CLIENT_H_
