// AllReduceHub: the seed's allreduce as a service. Callers of one named collective with group
// size N each contribute a float32 tensor; when N distinct ranks have contributed, every one of
// them receives the elementwise sum, and the collective moves to its next round. The sum is kept
// in one buffer per collective, reused across rounds. A round that does not fill before the
// barrier deadline is abandoned: all its callers get DEADLINE_EXCEEDED naming the missing ranks.
// Thread-safe.
#ifndef SUMMA_SERVER_ALL_REDUCE_H_
#define SUMMA_SERVER_ALL_REDUCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "server/parked_call.h"
#include "server/step_barrier.h"

namespace summa::server {

struct AllReduceContribution {
  std::string name;
  int group_size = 0;
  int rank = 0;
  TensorSpec spec;
  absl::string_view data;  // raw little-endian float32
};

class AllReduceHub {
 public:
  explicit AllReduceHub(absl::Duration deadline) : deadline_(deadline) {}

  // Adds the caller's tensor to the current round and parks `call` until the round completes.
  // Refused at once, changing nothing: INVALID_ARGUMENT for an empty name, a group size below 1
  // or unlike the collective's, a rank outside the group, a bad shape or byte length, or a shape
  // unlike the round's; ALREADY_EXISTS for a rank that already contributed to this round.
  void Contribute(const AllReduceContribution& c, std::shared_ptr<ParkedCall> call);

  // Abandons every round whose first member arrived a deadline ago or more. Returns the next
  // time to check.
  absl::Time ExpireRounds(absl::Time now);

  void Shutdown();

  uint64_t rounds_completed() const;

 private:
  struct Collective {
    explicit Collective(int group_size) : barrier(group_size) {}
    StepBarrier barrier;
    TensorSpec spec;           // this round's shape (set by its first member)
    std::vector<float> sum;    // reused across rounds of the same size
    uint64_t round = 0;        // rounds completed
    ParkingLot parked;
  };

  const absl::Duration deadline_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Collective>> collectives_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_ALL_REDUCE_H_
