// Membership: the job's ranks, their leases, the live set and the job's end. A member is absent
// until it joins, alive while its lease is current, lapsed once it runs out; under `shrink` a
// lapsed member is dropped (left out of every later step), under `wait` it is waited for until
// the rejoin deadline, when the job ends. Leave takes a member out for good.
//
// Elastic jobs (summa-server --workers=MIN:MAX): ranks 0..MIN-1 are the group from step 0;
// ranks MIN..MAX-1 (and, in an elastic job, a rank that left or was dropped) join a running job
// as growth, admitted from a step the caller chooses (the next step boundary no worker has
// passed: server/core/parameter_server.cc), so that every partition's step and every worker's
// split of the batch agree on the group of each step (GroupAt).
//
// Sessions fence stale processes: every Admit gives the rank a new random session id, which
// that member's later calls carry; a call with another id (an older process that held the rank,
// or none) is refused, so a push can never be counted for a rank by a process that does not
// hold its session.
//
// The push path only reads atomics: Touch() on an alive member stores its last-seen time and
// counts its push, without a lock. The lock (mu_) is taken for joins, revivals, leaves, Tick and
// snapshots. Observers registered before use are told, outside the lock, when ranks are excluded
// or the job ends. Thread-safe.
#ifndef SUMMA_SERVER_CORE_MEMBERSHIP_H_
#define SUMMA_SERVER_CORE_MEMBERSHIP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/random/random.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/core/group_view.h"
#include "server/core/job_options.h"

namespace summa::server {

enum class MemberState { kAbsent, kAlive, kLapsed, kLeft, kDropped };
const char* MemberStateName(MemberState state);

struct MemberInfo {
  int rank = 0;
  MemberState state = MemberState::kAbsent;
  std::string peer;
  std::string status_address;
  uint64_t pushes = 0;
  uint64_t examples = 0;
  absl::Time last_seen = absl::InfinitePast();
  absl::Time lease_expiry = absl::InfinitePast();
  absl::Time lapsed_at = absl::InfinitePast();
  int joins = 0;
  uint64_t from_step = 0;  // the first step it takes part in
};

struct Admitted {
  int rank = 0;
  uint64_t session = 0;  // never 0
  uint64_t from_step = 0;  // the first step it takes part in
  bool grew = false;       // it joined the group now (not a member before)
};

class Membership {
 public:
  // `clock` is not owned and outlives the membership. Without `require_sessions`, a call that
  // carries no session (a client from before sessions) is taken as the rank's; one that carries
  // an older session is refused all the same.
  // `world_size` is the most ranks the job may hold (MAX); ranks below `initial_size` (MIN; 0:
  // all of them) are the group from step 0.
  Membership(int world_size, OnWorkerLoss on_loss, absl::Duration lease,
             absl::Duration rejoin_deadline, const Clock* clock, bool require_sessions = true,
             int initial_size = 0);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Called with no lock held after ranks were excluded or the job ended. Register before use.
  void AddObserver(std::function<void()> on_change);

  // A shard other than 0 of a job with a coordinator: a lapsed lease drops no one and ends
  // nothing here; shard 0 decides, and Follow applies its view. Off: this shard decides by its
  // own leases again (while shard 0 cannot be reached).
  void set_follower(bool on) { follower_.store(on, std::memory_order_release); }
  bool follower() const { return follower_.load(std::memory_order_acquire); }

  // The membership view: it moves on each time a rank is excluded or the job ends (not when one
  // is admitted: an admission changes the group of later steps only, and pushes of the earlier
  // ones, stamped with the view, still count) (on a
  // follower, it is the newest view of shard 0's that Follow applied). Lock-free.
  uint64_t view() const { return view_.load(std::memory_order_acquire); }
  // The group as of a view: its number and the ranks admitted (from any step, the ones still to
  // come included) and not excluded. Lock-free (it may already lack a rank whose exclusion the
  // next view makes).
  GroupView group() const;
  // The group of step `step`: the ranks admitted from that step or before and not excluded.
  // `until` (when given) is set to the first later step from which an admission made so far
  // changes it (UINT64_MAX when none). Lock-free, as group().
  GroupView GroupAt(uint64_t step, uint64_t* until = nullptr) const;
  // Moves on each time a rank is excluded or admitted to the group here, whatever the view's number does (on a follower
  // the number is shard 0's and may stay, or go back when shard 0 restarts): what holders of a
  // GroupView compare to know theirs is old. Lock-free; read it before group().
  uint64_t group_epoch() const { return group_epoch_.load(std::memory_order_acquire); }
  // What a checkpoint keeps of the group: the ranks not dropped (a rank that left, as every rank
  // does at a job's end, may join again after a restart), at the current view.
  GroupView CheckpointGroup() const;
  // Takes a checkpoint's group back after a restart: the ranks it lacks are dropped, the ones it
  // holds are in the group from the start (grown ranks too), and the view goes on from its
  // number. Before any member joins.
  void Restore(const GroupView& group);
  // The ranks excluded (dropped or departed), ascending.
  std::vector<int> ExcludedRanks() const;
  // Applies shard 0's view: its excluded ranks are dropped here too, and its job error ends the
  // job here. An older view of the same `incarnation` (shard 0's process) than one applied
  // changes nothing; a new incarnation's is taken whatever its number.
  void Follow(uint64_t incarnation, uint64_t view, const std::vector<int>& excluded, const std::string& job_error);
  // Shard 0's process whose view Follow applied last; 0 before the first.
  uint64_t followed_incarnation() const;
  // This process's: random, never 0.
  uint64_t incarnation() const { return incarnation_; }

  int world_size() const { return world_size_; }
  // MIN of --workers=MIN:MAX: the ranks 0..MIN-1 are the group from step 0.
  int initial_size() const { return initial_size_; }
  bool elastic() const { return initial_size_ < world_size_; }

  // Admits (or readmits) `rank`, or assigns one for -1: the lowest absent rank of the initial
  // group, else (elastic) the lowest absent one above it, else one that left or was dropped.
  // A rank that is not yet in the group (growth) is admitted from step `grow_from`, and takes
  // part in the steps from it on. INVALID_ARGUMENT for a rank outside [0, world_size),
  // RESOURCE_EXHAUSTED when every rank is taken, FAILED_PRECONDITION for a dropped or departed
  // rank of a job that cannot grow. Returns the rank, its new session (which fences every
  // earlier session of the rank) and the step it takes part from.
  absl::StatusOr<Admitted> Admit(int rank, const std::string& peer, const std::string& status_address,
                                 uint64_t grow_from = 0);

  // OK when `session` is `rank`'s current session; FAILED_PRECONDITION naming the rank, the newer
  // peer and what to do when it is an older one (fenced) or none; NOT_FOUND when the rank never
  // joined; INVALID_ARGUMENT for a rank outside the group. Lock-free unless refusing.
  absl::Status CheckSession(int rank, uint64_t session) const;

  // CheckSession, then: OK for an alive member (its lease renewed) or a lapsed one (revived);
  // the status to refuse with otherwise: NOT_FOUND (never joined: Join again),
  // FAILED_PRECONDITION (dropped, left).
  absl::Status Touch(int rank, uint64_t session);
  // Counts a push accepted from `rank` (which Touch admitted).
  void CountPush(int rank, int64_t examples);

  // Takes `rank` out for good (when `session` is its current one); its observers are told.
  absl::Status Leave(int rank, uint64_t session);

  // Voids every member's session: their next calls are told NOT_FOUND (Join again). States and
  // lease clocks stand, so a member that never joins again lapses as a silent one does.
  void Forget();

  // Lapses expired leases, drops them under `shrink`, ends the job under `wait` when one has
  // been lapsed for the rejoin deadline.
  void Tick(absl::Time now);

  // Dropped or departed: left out of every step and member collective. Lock-free.
  bool excluded(int rank) const { return slots_[rank].excluded.load(std::memory_order_acquire); }
  // The ranks not excluded, ascending: group().ranks.
  std::vector<int> LiveRanks() const { return group().ranks; }

  bool job_ended() const { return job_ended_.load(std::memory_order_acquire); }
  // Empty while the job runs; why it ended otherwise.
  std::string job_error() const;
  // Ends the job (idempotent; the first reason stays).
  void EndJob(const std::string& why);

  // The members that ever joined, by rank.
  std::vector<MemberInfo> Snapshot() const;

 private:
  struct Slot {
    std::atomic<int> state{static_cast<int>(MemberState::kAbsent)};
    std::atomic<bool> excluded{false};
    std::atomic<int64_t> last_seen_ns{0};  // absl::ToUnixNanos of the last call
    std::atomic<uint64_t> pushes{0};
    std::atomic<uint64_t> examples{0};
    std::atomic<uint64_t> session{0};  // 0: never joined
    // The first step the rank takes part in; UINT64_MAX while it is not admitted (a rank above
    // the initial group that has not joined).
    std::atomic<uint64_t> from_step{0};
  };
  struct Details {
    std::string peer;
    std::string status_address;
    absl::Time lapsed_at = absl::InfinitePast();
    int joins = 0;
  };

  MemberState state(int rank) const {
    return static_cast<MemberState>(slots_[rank].state.load(std::memory_order_acquire));
  }
  void SetState(int rank, MemberState s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify();

  // Picks the rank Admit(-1) takes; world_size_ when none is left.
  int RankToAssign() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool InGroupFrom(int rank, uint64_t step) const {
    return !excluded(rank) && slots_[rank].from_step.load(std::memory_order_acquire) <= step;
  }

  const int world_size_;
  const int initial_size_;
  std::atomic<bool> follower_{false};
  std::atomic<uint64_t> view_{0};
  std::atomic<uint64_t> group_epoch_{0};
  uint64_t incarnation_ = 0;  // set once, at construction
  const bool require_sessions_;
  const OnWorkerLoss on_loss_;
  const absl::Duration lease_;
  const absl::Duration rejoin_deadline_;
  const Clock* const clock_;  // Not owned.
  std::vector<std::function<void()>> observers_;  // fixed before use
  std::unique_ptr<Slot[]> slots_;

  mutable absl::Mutex mu_;
  std::vector<Details> details_ ABSL_GUARDED_BY(mu_);
  absl::BitGen session_bits_ ABSL_GUARDED_BY(mu_);
  std::string job_error_ ABSL_GUARDED_BY(mu_);
  uint64_t followed_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // shard 0's, as last followed
  // Shard 0's view as last applied (view_ also counts this shard's own exclusions while it
  // decides alone).
  uint64_t followed_view_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> job_ended_{false};
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_MEMBERSHIP_H_
