// AllReduceHub: the seed's allreduce as a service. Callers of one named collective each
// contribute a float32 tensor; when the round's group is complete every one of them receives
// the elementwise sum, and the collective moves to its next round. The sum is kept in one buffer
// per collective, reused across rounds. A round that does not fill before the barrier deadline
// is abandoned: all its callers get DEADLINE_EXCEEDED naming the missing ranks.
//
// Two kinds of group: a fixed one (`group_size` ranks, numbered 0..group_size-1), or the job's
// members (`members`): a round then completes when every member still in the group has
// contributed, so a member dropped under `shrink` is left out and a lapsed one under `wait` is
// waited for as a step is; rounds are named explicitly, a late contribution to the round just
// completed (a member that rejoined after it) is answered with its sum, and the job's end aborts
// the round. A member collective that is idle follows a caller to a later round (after a server
// restart, or an abandoned round). Thread-safe; lock order: the hub's lock, then Membership's.
#ifndef SUMMA_SERVER_ALL_REDUCE_H_
#define SUMMA_SERVER_ALL_REDUCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/tensor.h"
#include "server/membership.h"
#include "server/parked_call.h"
#include "server/step_barrier.h"

namespace summa::server {

struct AllReduceContribution {
  std::string name;
  int group_size = 0;  // fixed groups
  int rank = 0;        // in the fixed group, or the member rank
  bool members = false;
  uint64_t round = 0;  // member collectives: the round meant
  TensorSpec spec;
  absl::string_view data;  // raw little-endian float32
};

class AllReduceHub {
 public:
  // Neither pointer is owned; both outlive the hub. Without `members`, member collectives are
  // refused. The hub does not observe `members` by itself: call OnMembershipChange when told.
  AllReduceHub(absl::Duration deadline, const Clock* clock = Clock::Real(),
               const Membership* members = nullptr)
      : deadline_(deadline), clock_(clock), members_(members) {}

  // Adds the caller's tensor to the current round and parks `call` until the round completes.
  // Refused at once, changing nothing: INVALID_ARGUMENT for an empty name, a group size below 1
  // or unlike the collective's, a rank outside the group, a bad shape or byte length, or a shape
  // unlike the round's; ALREADY_EXISTS for a rank that already contributed to this round;
  // member collectives also FAILED_PRECONDITION (a rank out of the group, a round long past),
  // OUT_OF_RANGE (a future round) and ABORTED (the job has ended).
  void Contribute(const AllReduceContribution& c, std::shared_ptr<ParkedCall> call);

  // Member collectives: completes the rounds that members leaving completes, and aborts every
  // round once the job has ended.
  void OnMembershipChange();

  // Abandons every round whose first member arrived a deadline ago or more. Returns the next
  // time to check.
  absl::Time ExpireRounds(absl::Time now);

  void Shutdown();

  uint64_t rounds_completed() const;

 private:
  struct Collective {
    Collective(int group_size, bool members) : barrier(group_size), members(members) {}
    StepBarrier barrier;
    const bool members;
    TensorSpec spec;           // this round's shape (set by its first member)
    std::vector<float> sum;    // reused across rounds of the same size
    std::vector<float> last;   // member collectives: the last round's sum, for late members
    bool has_last = false;     // whether `last` is the sum of round `round - 1`
    uint64_t round = 0;        // rounds completed
    ParkingLot parked;
  };

  absl::Status Admit(Collective& col, const AllReduceContribution& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the round when its group is whole.
  void MaybeComplete(Collective& col, CallsToFinish& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration deadline_;
  const Clock* const clock_;          // Not owned.
  const Membership* const members_;   // Not owned; may be null.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Collective>> collectives_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_ALL_REDUCE_H_
