// AllReduceHub: the seed's allreduce as a service. Callers of one named collective each
// contribute a float32 tensor; when the round's group is complete every one of them receives
// the elementwise sum, and the collective moves to its next round. The sum is kept in a buffer of
// the collective's pool, summed in place, and handed to every caller's reply as it is (no copy);
// the next round takes another buffer of the pool. A round that does not fill before the barrier
// deadline is abandoned: all its callers get DEADLINE_EXCEEDED naming the missing ranks.
//
// Each collective has a lock of its own: collectives (a big tensor cut into chunks by the client
// is one collective a chunk) sum in parallel; the hub's lock only finds or adds a collective.
//
// Two kinds of group: a fixed one (`group_size` ranks, numbered 0..group_size-1), or the job's
// members (`members`): a round then completes when every member still in the group has
// contributed, so a member dropped under `shrink` is left out and a lapsed one under `wait` is
// waited for as a step is; rounds are named explicitly, a late contribution to the round just
// completed (a member that rejoined after it) is answered with its sum, and the job's end aborts
// the round. A member collective that is idle follows a caller to a later round (after a server
// restart, or an abandoned round). Thread-safe; lock order: a collective's lock, then
// Membership's; the hub's lock is never held with another.
#ifndef SUMMA_SERVER_ALL_REDUCE_H_
#define SUMMA_SERVER_ALL_REDUCE_H_

#include <atomic>
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
#include "server/snapshot.h"
#include "server/step_barrier.h"

namespace summa::server {

struct AllReduceContribution {
  std::string name;
  int group_size = 0;  // fixed groups
  int rank = 0;        // in the fixed group, or the member rank
  bool members = false;
  uint64_t round = 0;  // member collectives: the round meant
  uint64_t session = 0;  // member collectives: the rank's session
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

  uint64_t rounds_completed() const { return rounds_completed_.load(std::memory_order_relaxed); }

 private:
  struct Collective {
    Collective(int group_size, bool members) : members(members), barrier(group_size) {}
    const bool members;
    absl::Mutex mu;
    StepBarrier barrier ABSL_GUARDED_BY(mu);
    TensorSpec spec ABSL_GUARDED_BY(mu);      // this round's shape (set by its first member)
    SnapshotPool pool ABSL_GUARDED_BY(mu);    // the sums' buffers, reused across rounds
    Snapshot sum ABSL_GUARDED_BY(mu);         // this round's, while it fills
    float* sum_data ABSL_GUARDED_BY(mu) = nullptr;
    Snapshot last ABSL_GUARDED_BY(mu);        // member collectives: the last round's, for late members
    std::vector<int64_t> last_shape ABSL_GUARDED_BY(mu);  // ... and its shape
    bool has_last ABSL_GUARDED_BY(mu) = false;  // whether `last` is the sum of round `round - 1`
    uint64_t round ABSL_GUARDED_BY(mu) = 0;   // rounds completed
    ParkingLot parked ABSL_GUARDED_BY(mu);
  };

  // The collective of that name, added (as `c` describes it) when new. Never null.
  Collective* Find(const AllReduceContribution& c);
  // Every collective, for sweeps; collectives are never removed, so the pointers stay valid.
  std::vector<std::pair<const std::string*, Collective*>> All() const;

  absl::Status Admit(Collective& col, const AllReduceContribution& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);
  // Completes the round when its group is whole.
  void MaybeComplete(Collective& col, CallsToFinish& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);
  // Forgets the round in progress (its calls were failed).
  static void Reset(Collective& col) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);

  const absl::Duration deadline_;
  const Clock* const clock_;          // Not owned.
  const Membership* const members_;   // Not owned; may be null.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Collective>> collectives_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> rounds_completed_{0};
  std::atomic<bool> shut_down_{false};
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_ALL_REDUCE_H_
