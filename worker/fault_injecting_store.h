// FaultInjectingStore: a ParameterStore that forwards to another and kills the process the way a
// worker killed between its push and the reply would die, for the fault tests
// (summa-worker --fault_exit_after_push). From step `exit_from_step` on, each PushPull becomes a
// Push (which replies at once) and, when that push left its step waiting for other workers, the
// process exits at once with status 137; when the push completed the step, the next weights are
// pulled and training goes on. The live group is not updated on that path. A negative
// `exit_from_step` never exits.
//
// Owns nothing: the inner store and `out` are borrowed. Thread safety as the inner store's.
#ifndef SUMMA_WORKER_FAULT_INJECTING_STORE_H_
#define SUMMA_WORKER_FAULT_INJECTING_STORE_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "worker/parameter_store.h"

namespace summa::worker {

class FaultInjectingStore final : public ParameterStore {
 public:
  // `inner` and `out` (where the exit is announced) must outlive this store.
  FaultInjectingStore(ParameterStore* inner, int64_t exit_from_step, std::FILE* out)
      : inner_(inner), exit_from_step_(exit_from_step), out_(out) {}

  absl::StatusOr<JoinInfo> Join(int rank, int world, const std::vector<TensorSpec>& specs,
                                const float* initial, const std::string& status_address) override;
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, float* weights) override {
    return inner_->PullAll(min_version, weights);
  }
  absl::Status PushPull(uint64_t step, int64_t num_examples, const float* gradients, float* weights,
                        std::vector<int>* live_ranks) override;
  absl::StatusOr<bool> Push(uint64_t step, int64_t num_examples, const float* gradients) override {
    return inner_->Push(step, num_examples, gradients);
  }
  absl::Status Heartbeat(int rank) const override { return inner_->Heartbeat(rank); }
  absl::Status Leave(int rank) override { return inner_->Leave(rank); }
  absl::StatusOr<std::vector<float>> AllReduce(const Collective& group,
                                               const std::vector<float>& values) override {
    return inner_->AllReduce(group, values);
  }
  std::string address() const override { return inner_->address(); }

 private:
  ParameterStore* const inner_;  // Not owned.
  const int64_t exit_from_step_;
  std::FILE* const out_;  // Not owned.
  int rank_ = -1;         // from the last Join, for the message
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_FAULT_INJECTING_STORE_H_
