#include "client/lease_keeper.h"

#include <algorithm>

namespace summa::worker {

void LeaseKeeper::Start(int rank, absl::Duration lease) {
  {
    absl::MutexLock lock(&mu_);
    rank_ = rank;
    stop_ = false;
  }
  if (thread_.joinable()) return;
  const absl::Duration every = std::max(lease / 3, absl::Milliseconds(50));
  thread_ = std::thread([this, every] {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), every)) {
      const int rank = rank_;
      mu_.Unlock();
      store_->Heartbeat(rank).IgnoreError();
      mu_.Lock();
    }
  });
}

void LeaseKeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace summa::worker
