// StepBarrier: which ranks of a group have arrived for the current step. Arrive() refuses a rank
// outside the group and a rank that already arrived, so a retried push is never counted twice.
// Not thread-safe: its owner holds the partition's (or collective's) lock.
#ifndef SUMMA_SERVER_CORE_STEP_BARRIER_H_
#define SUMMA_SERVER_CORE_STEP_BARRIER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace summa::server {

class StepBarrier {
 public:
  explicit StepBarrier(int group_size);

  // Records `rank`'s arrival at `now`; true when it was the last one missing. INVALID_ARGUMENT
  // for a rank outside [0, group_size), ALREADY_EXISTS for a second arrival: both change nothing.
  absl::StatusOr<bool> Arrive(int rank, absl::Time now);

  int group_size() const { return static_cast<int>(arrived_.size()); }
  int arrived() const { return count_; }
  bool has_arrived(int rank) const { return arrived_[rank]; }
  // The ranks that have not arrived, ascending.
  std::vector<int> Missing() const;
  // When the step's first rank arrived (InfiniteFuture when none has).
  absl::Time first_arrival() const { return first_arrival_; }

  void Reset();

 private:
  std::vector<bool> arrived_;
  int count_ = 0;
  absl::Time first_arrival_ = absl::InfiniteFuture();
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_STEP_BARRIER_H_
