#include "server/core/consistency.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_reason.h"

namespace summa::server {
namespace {

class SyncPolicy final : public ConsistencyPolicy {
 public:
  explicit SyncPolicy(PolicyContext c) : ConsistencyPolicy(std::move(c)) {}
  Mode mode() const override { return Mode::kSync; }
  bool CheckpointNeedsOneVersion() const override { return true; }

  absl::StatusOr<bool> Push(Partition& p, const PushRequestView& r, absl::Span<const float> gradient,
                            PushValues values, absl::Time now, CallsToFinish& out) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    if (r.step < p.version) {
      // A retry whose first reply was lost after the step completed: counted once already.
      if (p.next_step[r.rank] > r.step) return Duplicate(r);
      if (ctx_.backup_workers > 0) return Late(p, r, now);
      return absl::FailedPreconditionError(absl::StrCat("step ", r.step, " of partition ", r.partition,
                                                        " is finished (the partition is at version ",
                                                        p.version, ")"));
    }
    if (r.step > p.version) {
      return absl::OutOfRangeError(absl::StrCat("step ", r.step, " is in the future: partition ",
                                                r.partition, " is at step ", p.version));
    }
    if (p.barrier.has_arrived(r.rank)) return Duplicate(r);
    if (const GroupView& group = SyncGroup(p, out); !group.Contains(r.rank)) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", r.rank, " is not in the group of step ", r.step,
                                                        " (view ", group.view, "): it takes part from a later step"));
    }
    if (!p.barrier.Arrive(r.rank, now).ok()) return absl::InternalError("barrier refused a checked arrival");
    if (ctx_.backup_workers > 0) Time(p.lateness[r.rank], now - p.barrier.first_arrival(), 0);
    if (values == PushValues::kSkip) {
      p.skip_step = true;
    } else {
      p.aggregator.Add(r.rank, gradient, 0, values == PushValues::kZeroNonFinite);
    }
    p.aggregator.AddExamples(r.num_examples);
    p.next_step[r.rank] = r.step + 1;
    const uint64_t before = p.version;
    MaybeComplete(p, now, out);
    return p.version != before;
  }

  void OnExcluded(Partition& p, absl::Time now, CallsToFinish& out) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    SyncGroup(p, out);
    MaybeComplete(p, now, out);
  }

  void OnAdmitted(Partition& p, int rank, uint64_t from_step) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    // A partition already past `from_step` (an empty group's joiner is admitted from the
    // lowest version) takes the push of a step it finished as a duplicate: it only pulls.
    p.next_step[rank] = std::max(from_step, p.version);
  }

  void AnswerPushPull(Partition& p, int rank, uint64_t step, std::shared_ptr<ParkedCall> call,
                      absl::Time deadline, CallsToFinish& out) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    if (p.version == step && !p.barrier.has_arrived(rank)) {
      // Its push was dropped between Push and now: the step started again under a new group.
      if (call->Claim()) out.Add(std::move(call), StepRestarted(p));
      return;
    }
    if (p.version >= step + 1) {
      if (!call->Claim()) return;
      call->Fill(p.version, p.Published());
      out.Add(std::move(call), absl::OkStatus());
    } else {
      p.parked.Park(std::move(call), step + 1, deadline, /*after_push=*/true);
    }
  }

  absl::Status CheckPull(const Partition& p, uint64_t min_version) const override
      ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    // Two: a joiner admitted from the step after the next (parameter_server.cc) waits for it.
    if (min_version > p.version + 2) {
      return absl::OutOfRangeError(absl::StrCat("version ", min_version, " of partition ", p.range.id,
                                                " is more than two steps ahead of the current version ",
                                                p.version));
    }
    return absl::OkStatus();
  }

  uint64_t NextStep(const Partition& p, int rank) const override ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    return p.version;
  }

  std::string WaitingFor(const Partition& p) const override ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    std::vector<int> missing;
    for (int r : p.step_group.ranks) {
      if (!p.barrier.has_arrived(r)) missing.push_back(r);
    }
    const std::string more =
        ctx_.backup_workers == 0
            ? ""
            : absl::StrCat(" (", Needed(p.step_group) - (p.step_group.size() - static_cast<int>(missing.size())),
                           " more of them: --backup_workers=", ctx_.backup_workers, ")");
    return absl::StrCat("partition ", p.range.id, " is at version ", p.version, "; step ", p.version,
                        " still waits for pushes from rank", missing.size() == 1 ? " " : "s ",
                        absl::StrJoin(missing, ", "), more);
  }

 private:
  // Applies the step once every rank of its group has pushed; the next step runs under the
  // group as it is then.
  void MaybeComplete(Partition& p, absl::Time now, CallsToFinish& out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    if (p.barrier.arrived() == 0) return;  // nothing pushed: an exclusion completes nothing
    if (ctx_.backup_workers > 0) {
      const GroupView& group = SyncGroup(p, out);
      int pushed = 0;
      for (int r : group.ranks) pushed += p.barrier.has_arrived(r);
      if (pushed < Needed(group)) return;
      // Where a late push of this step measures its delay from.
      const int slot = static_cast<int>(p.version % Partition::kRecentSteps);
      p.began_step[slot] = p.version;
      p.step_began[slot] = p.barrier.first_arrival();
    } else {
      for (int r : SyncGroup(p, out).ranks) {
        if (!p.barrier.has_arrived(r)) return;
      }
    }
    const bool skip = p.skip_step || p.aggregator.contributions() == 0;
    p.aggregator.Finish();
    p.examples_applied += p.aggregator.num_examples();
    Advance(p, p.aggregator.sum(), p.aggregator.num_examples(), skip, now, out);
    p.aggregator.Reset();
    p.barrier.Reset();
    p.skip_step = false;
    SyncGroup(p, out);  // the next step's group (nothing pushed to it yet: nothing restarts)
  }

  // The group of the step under way, read again when the membership moved. A step whose group
  // lost a rank while it held pushes starts again under the group left: the shares the others
  // computed split the batch over a group that no longer holds (a lost rank that had not pushed
  // leaves its examples unseen; one that had leaves them summed while the others recompute
  // theirs over the new group, some twice). Its sums are dropped, its push-pulls told ABORTED
  // (stale view), and every member computes its new share of the same batch, so each example
  // of the step is summed once. Checked wherever the group is read (a push stamped with the
  // new view may reach this partition before the exclusion's notice does).
  const GroupView& SyncGroup(Partition& p, CallsToFinish& out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    if (p.step_group_epoch == ctx_.members->group_epoch() && p.version < p.step_group_until) return p.step_group;
    const std::vector<int> before = p.step_group.ranks;  // rare: the membership moved
    const GroupView& group = StepGroup(p);
    bool lost = false;
    for (int r : before) lost |= !group.Contains(r);
    if (lost && p.barrier.arrived() > 0) Restart(p, group, out);
    return group;
  }

  static absl::Status StepRestarted(const Partition& p) ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    return WithReason(absl::AbortedError(absl::StrCat(
        "stale membership view: step ", p.version, " of partition ", p.range.id, " starts again under view ",
        p.step_group.view, " (ranks ", absl::StrJoin(p.step_group.ranks, ", "), "): a member left the group "
        "during it; compute this worker's share of the step over the new group and push again")),
        StatusReason::kStaleView);
  }

  // Backup workers: the pushes a step of `group` completes with.
  int Needed(const GroupView& group) const { return std::max(1, group.size() - ctx_.backup_workers); }

  // Records one push's delay from its step's first push, and the steps it trails by.
  static void Time(RankLateness& l, absl::Duration delay, uint64_t behind) {
    ++l.timed_pushes;
    l.total_delay += delay;
    l.last_delay = delay;
    l.steps_behind = behind;
  }

  // A push of step `r.step`, which the partition completed without it (backup workers): dropped,
  // and counted late once (a retry of it is answered alike, not counted again).
  absl::Status Late(Partition& p, const PushRequestView& r, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    RankLateness& l = p.lateness[r.rank];
    if (l.last_late_step != r.step) {
      l.last_late_step = r.step;
      ++l.late_pushes;
      const int slot = static_cast<int>(r.step % Partition::kRecentSteps);
      const uint64_t behind = p.version - r.step;
      if (p.began_step[slot] == r.step) {
        Time(l, now - p.step_began[slot], behind);
      } else {
        l.steps_behind = behind;  // too old a step to know when it began
      }
    }
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
        "late push: step ", r.step, " of partition ", r.partition, " completed without rank ", r.rank,
        "'s push (--backup_workers=", ctx_.backup_workers, ": a step is summed from the first group size - ",
        ctx_.backup_workers, " pushes), which was dropped; the partition is at version ", p.version,
        ": pull it and go on from there")), StatusReason::kLatePush);
  }

  // Drops the step's pushes and fails their push-pulls (parked ones; AnswerPushPull fails one
  // that comes after) so that they compute it again under `group`.
  void Restart(Partition& p, const GroupView& group, CallsToFinish& out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    for (int r = 0; r < p.barrier.group_size(); ++r) {
      if (p.barrier.has_arrived(r)) p.next_step[r] = p.version;
    }
    p.aggregator.Reset();
    p.barrier.Reset();
    p.skip_step = false;
    ++p.restarts;
    p.parked.FailPushesUpTo(p.version + 1, StepRestarted(p), out);
  }
};

// Async and ssp: each push is applied alone; ssp bounds how far ahead a push-pull may run.
class AsyncPolicy final : public ConsistencyPolicy {
 public:
  AsyncPolicy(PolicyContext c, bool bounded) : ConsistencyPolicy(std::move(c)), bounded_(bounded) {}
  Mode mode() const override { return bounded_ ? Mode::kSsp : Mode::kAsync; }
  bool CheckpointNeedsOneVersion() const override { return false; }

  absl::StatusOr<bool> Push(Partition& p, const PushRequestView& r, absl::Span<const float> gradient,
                            PushValues values, absl::Time now, CallsToFinish& out) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    uint64_t& next = p.next_step[r.rank];
    if (r.step < next) return Duplicate(r);
    if (r.step > next) {
      return absl::OutOfRangeError(absl::StrCat("rank ", r.rank, " pushed step ", r.step, " of partition ",
                                                r.partition, " but its next step is ", next));
    }
    ++next;
    // A DiLoCo pseudo-gradient moves the outer weights by its share of what the group's together
    // would (the sync average's), not by a whole step's each.
    const int64_t examples =
        ctx_.sync_every > 0 ? r.num_examples * static_cast<int64_t>(std::max<size_t>(1, StepGroup(p).ranks.size()))
                            : r.num_examples;
    if (values == PushValues::kZeroNonFinite) {
      p.aggregator.Add(r.rank, gradient, r.num_examples, /*zero_nonfinite=*/true);
      p.aggregator.Finish();
      Advance(p, p.aggregator.sum(), examples, false, now, out);
      p.aggregator.Reset();
    } else {
      Advance(p, gradient, examples, values == PushValues::kSkip, now, out);
    }
    p.Release(p.clock_parked, Slowest(p), out);
    return true;
  }

  void OnExcluded(Partition& p, absl::Time now, CallsToFinish& out) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    p.Release(p.clock_parked, Slowest(p), out);
  }

  void OnAdmitted(Partition& p, int rank, uint64_t) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    // Where the slowest member is: a joiner holds no one back under ssp, and its data position
    // (its own step count) starts where the group's slowest is.
    uint64_t slowest = UINT64_MAX;
    for (int r : StepGroup(p).ranks) {
      if (r != rank) slowest = std::min(slowest, p.next_step[r]);
    }
    // A rank that was out and comes back never goes back in the data.
    p.next_step[rank] = std::max(p.next_step[rank], slowest == UINT64_MAX ? 0 : slowest);
  }

  void AnswerPushPull(Partition& p, int, uint64_t step, std::shared_ptr<ParkedCall> call,
                      absl::Time deadline, CallsToFinish& out) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    // ssp: wait until the slowest member has pushed step `step - staleness`; async never waits.
    const uint64_t staleness = static_cast<uint64_t>(ctx_.staleness);
    const uint64_t need = bounded_ && step + 1 > staleness ? step + 1 - staleness : 0;
    if (Slowest(p) >= need) {
      if (!call->Claim()) return;
      call->Fill(p.version, p.Published());
      out.Add(std::move(call), absl::OkStatus());
    } else {
      p.clock_parked.Park(std::move(call), need, deadline);
    }
  }

  absl::Status CheckPull(const Partition&, uint64_t) const override { return absl::OkStatus(); }

  uint64_t NextStep(const Partition& p, int rank) const override ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    return p.next_step[rank];
  }

  std::string WaitingFor(const Partition& p) const override ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    uint64_t slowest = UINT64_MAX;
    for (int r : p.step_group.ranks) slowest = std::min(slowest, p.next_step[r]);
    return absl::StrCat("the slowest member of partition ", p.range.id, " is at step ", slowest);
  }

 private:
  // The lowest next step over the ranks of the group.
  uint64_t Slowest(Partition& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
    uint64_t slowest = UINT64_MAX;
    for (int r : StepGroup(p).ranks) slowest = std::min(slowest, p.next_step[r]);
    return slowest;
  }

  const bool bounded_;
};

}  // namespace

std::unique_ptr<const ConsistencyPolicy> ConsistencyPolicy::Create(Mode mode, PolicyContext context) {
  if (mode == Mode::kSync) return std::make_unique<SyncPolicy>(std::move(context));
  return std::make_unique<AsyncPolicy>(std::move(context), mode == Mode::kSsp);
}

void ConsistencyPolicy::Advance(Partition& p, absl::Span<const float> grad_sum, int64_t examples,
                                bool skip, absl::Time now, CallsToFinish& out) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // the callers hold p.mu
  if (!skip && examples > 0) {
    TraceSpan span(ctx_.tracer, "optimizer", "server", p.range.id);
    ctx_.optimizer->Apply(p.updates, ctx_.optimizer->LearningRate(p.version), absl::MakeSpan(p.weights),
                          p.slot_views, grad_sum, examples);
    ++p.updates;
  }
  ++p.version;
  p.last_step = now - p.last_completion;
  p.last_completion = now;
  if (p.reports && ctx_.step_observer) ctx_.step_observer(p.last_step);
  p.Release(p.parked, p.version, out);
}

const GroupView& ConsistencyPolicy::StepGroup(Partition& p) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // the callers hold p.mu
  // The epoch, not the view's number: on a follower the number is shard 0's and may stay put (or
  // go back) while ranks are excluded here. An admission is always of a step no partition has
  // reached (server/core/parameter_server.cc), so the group of a step under way only narrows.
  if (const uint64_t epoch = ctx_.members->group_epoch();
      p.step_group_epoch != epoch || p.version >= p.step_group_until) {
    p.step_group = ctx_.members->GroupAt(p.version, &p.step_group_until);  // after the epoch: at least its changes
    p.step_group_epoch = epoch;
  }
  return p.step_group;
}

absl::Status ConsistencyPolicy::Duplicate(const PushRequestView& r) const {
  return absl::AlreadyExistsError(absl::StrCat("rank ", r.rank, " already pushed partition ", r.partition,
                                               " for step ", r.step, "; the duplicate was not counted"));
}

}  // namespace summa::server
