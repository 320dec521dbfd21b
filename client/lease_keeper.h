// LeaseKeeper: renews a member's lease at the server from a thread of its own, so that a worker
// busy computing, or waiting in a long step, is not taken for lost. It calls
// ParameterStore::Heartbeat every lease/3 (at least 50 ms apart) and ignores its failures: a lost
// server shows in the worker's own calls. Borrows the store. Start and Stop are called from the
// owner's thread only.
#ifndef SUMMA_CLIENT_LEASE_KEEPER_H_
#define SUMMA_CLIENT_LEASE_KEEPER_H_

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/parameter_store.h"

namespace summa::worker {

class LeaseKeeper {
 public:
  // `store` must outlive the keeper; its Heartbeat is called from the keeper's thread.
  explicit LeaseKeeper(const ParameterStore* store) : store_(store) {}
  ~LeaseKeeper() { Stop(); }
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Starts renewing `rank`'s lease of length `lease`; a keeper already running only takes the
  // new rank (a rejoin may be given another).
  void Start(int rank, absl::Duration lease);
  // Stops and joins the thread; Start may run it again.
  void Stop();

 private:
  const ParameterStore* const store_;  // Not owned.
  absl::Mutex mu_;
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started and joined by the owner's thread only
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_LEASE_KEEPER_H_
