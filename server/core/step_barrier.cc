#include "server/core/step_barrier.h"

#include "absl/strings/str_cat.h"

namespace summa::server {

StepBarrier::StepBarrier(int group_size) : arrived_(group_size, false) {}

absl::StatusOr<bool> StepBarrier::Arrive(int rank, absl::Time now) {
  if (rank < 0 || rank >= group_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside the group of ",
                                                   group_size(), " (ranks 0..", group_size() - 1,
                                                   ")"));
  }
  if (arrived_[rank]) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " already arrived for this step"));
  }
  if (count_ == 0) first_arrival_ = now;
  arrived_[rank] = true;
  ++count_;
  return count_ == group_size();
}

std::vector<int> StepBarrier::Missing() const {
  std::vector<int> missing;
  for (int r = 0; r < group_size(); ++r) {
    if (!arrived_[r]) missing.push_back(r);
  }
  return missing;
}

void StepBarrier::Reset() {
  arrived_.assign(arrived_.size(), false);
  count_ = 0;
  first_arrival_ = absl::InfiniteFuture();
}

}  // namespace summa::server
