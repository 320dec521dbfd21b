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
// restart, or an abandoned round).
//
// Limits (server/core/limits.h): the hub keeps at most max_collectives collectives and
// max_allreduce_bytes of buffers; to make room it forgets idle ones (no round in progress),
// least recently used first (a member that rejoins late to a forgotten collective's round gets
// no sum: it starts the next round). A peer (the contribution's `peer`) may have opened at most
// max_open_collectives_per_peer rounds still in progress. Past a limit, a contribution is
// refused with RESOURCE_EXHAUSTED naming the flag.
//
// Thread-safe; lock order: the hub's lock, then a collective's (only to forget idle ones), then
// Membership's.
#ifndef SUMMA_SERVER_CORE_ALL_REDUCE_H_
#define SUMMA_SERVER_CORE_ALL_REDUCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/tensor.h"
#include "server/core/group_view.h"
#include "server/core/limits.h"
#include "server/core/membership.h"
#include "server/core/parked_call.h"
#include "server/core/snapshot.h"
#include "server/core/step_barrier.h"

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
  std::string peer;        // whom the limits count it against (server/core/limits.h)
};

class AllReduceHub {
 public:
  // Neither pointer is owned; both outlive the hub. Without `members`, member collectives are
  // refused. The hub does not observe `members` by itself: call OnMembershipChange when told.
  AllReduceHub(absl::Duration deadline, const Clock* clock = Clock::Real(),
               const Membership* members = nullptr, const LimitOptions& limits = {})
      : deadline_(deadline),
        clock_(clock),
        members_(members),
        max_collectives_(limits.max_collectives),
        max_bytes_(limits.max_allreduce_bytes),
        opened_("open collectives", INT64_MAX, "", limits.max_open_collectives_per_peer,
                "max_open_collectives_per_peer") {}

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
  // What the limits count: collectives kept, and the bytes of their buffers.
  size_t collectives() const;
  int64_t buffer_bytes() const { return buffer_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Collective {
    Collective(int group_size, bool members)
        : members(members), barrier(group_size), group(GroupView::Whole(group_size)) {}
    const bool members;
    absl::Mutex mu;
    StepBarrier barrier ABSL_GUARDED_BY(mu);
    // A members' collective: the group its round runs under (server/core/group_view.h), narrowed
    // by exclusions during the round and taken anew at its end (RoundGroup). A fixed group's
    // never changes.
    GroupView group ABSL_GUARDED_BY(mu);
    // Membership::group_epoch() it was read at; none yet (a members' collective reads it first).
    uint64_t group_epoch ABSL_GUARDED_BY(mu) = UINT64_MAX;
    TensorSpec spec ABSL_GUARDED_BY(mu);      // this round's shape (set by its first member)
    SnapshotPool pool ABSL_GUARDED_BY(mu);    // the sums' buffers, reused across rounds
    Snapshot sum ABSL_GUARDED_BY(mu);         // this round's, while it fills
    float* sum_data ABSL_GUARDED_BY(mu) = nullptr;
    Snapshot last ABSL_GUARDED_BY(mu);        // member collectives: the last round's, for late members
    std::vector<int64_t> last_shape ABSL_GUARDED_BY(mu);  // ... and its shape
    bool has_last ABSL_GUARDED_BY(mu) = false;  // whether `last` is the sum of round `round - 1`
    uint64_t round ABSL_GUARDED_BY(mu) = 0;   // rounds completed
    ParkingLot parked ABSL_GUARDED_BY(mu);
    PeerBudget::Hold opened ABSL_GUARDED_BY(mu);  // the round in progress, held by its opener
    int64_t bytes ABSL_GUARDED_BY(mu) = 0;        // what `pool` holds, counted in buffer_bytes_
    absl::Time last_used ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    bool forgotten ABSL_GUARDED_BY(mu) = false;   // no longer the hub's: find it again
  };
  using CollectivePtr = std::shared_ptr<Collective>;

  // The collective of that name, added (as `c` describes it) when new, idle ones forgotten to
  // make room for it and for `c`'s bytes; RESOURCE_EXHAUSTED when the room cannot be made.
  absl::StatusOr<CollectivePtr> Find(const AllReduceContribution& c);
  // `col.group`, brought up to the membership's view when it moved (members' collectives).
  const GroupView& RoundGroup(Collective& col) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);
  // Forgets the least recently used idle collective other than `keep`; false when none is idle.
  bool ForgetOneIdle(const Collective* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every collective, for sweeps.
  std::vector<std::pair<std::string, CollectivePtr>> All() const;

  absl::Status Admit(Collective& col, const AllReduceContribution& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);
  // Opens a round with `c`'s values: its opener's share of the limits, and a buffer.
  absl::Status Open(Collective& col, const AllReduceContribution& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);
  // Completes the round when its group is whole.
  void MaybeComplete(Collective& col, CallsToFinish& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);
  // Forgets the round in progress (its calls were failed).
  static void Reset(Collective& col) ABSL_EXCLUSIVE_LOCKS_REQUIRED(col.mu);

  const absl::Duration deadline_;
  const Clock* const clock_;          // Not owned.
  const Membership* const members_;   // Not owned; may be null.
  const int64_t max_collectives_;
  const int64_t max_bytes_;
  PeerBudget opened_;
  std::atomic<int64_t> buffer_bytes_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, CollectivePtr> collectives_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> rounds_completed_{0};
  std::atomic<bool> shut_down_{false};
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_ALL_REDUCE_H_
