#include "worker/fault_injecting_store.h"

#include <cstdlib>

#include "common/status_macros.h"

namespace summa::worker {

absl::StatusOr<JoinInfo> FaultInjectingStore::Join(int rank, int world,
                                                   const std::vector<TensorSpec>& specs,
                                                   const float* initial,
                                                   const std::string& status_address) {
  absl::StatusOr<JoinInfo> joined = inner_->Join(rank, world, specs, initial, status_address);
  if (joined.ok()) rank_ = joined->rank;
  return joined;
}

absl::Status FaultInjectingStore::PushPull(uint64_t step, int64_t num_examples,
                                           const float* gradients, float* weights,
                                           std::vector<int>* live_ranks) {
  if (exit_from_step_ < 0 || static_cast<int64_t>(step) < exit_from_step_) {
    return inner_->PushPull(step, num_examples, gradients, weights, live_ranks);
  }
  SUMMA_ASSIGN_OR_RETURN(bool completed, inner_->Push(step, num_examples, gradients));
  if (!completed) {
    std::fprintf(out_, "rank %d: fault injection: exiting after the push of step %llu\n", rank_,
                 static_cast<unsigned long long>(step));
    std::fflush(out_);
    std::_Exit(137);
  }
  return inner_->PullAll(step + 1, weights).status();
}

}  // namespace summa::worker
