#include "server/core/membership.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace summa::server {
namespace {

std::string RankRange(int world_size) {
  return absl::StrCat("the group of ", world_size, " (ranks 0..", world_size - 1, ")");
}

}  // namespace

const char* MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kAbsent: return "absent";
    case MemberState::kAlive: return "alive";
    case MemberState::kLapsed: return "lapsed";
    case MemberState::kLeft: return "left";
    case MemberState::kDropped: return "dropped";
  }
  return "?";
}

Membership::Membership(int world_size, OnWorkerLoss on_loss, absl::Duration lease,
                       absl::Duration rejoin_deadline, const Clock* clock, bool require_sessions,
                       int initial_size)
    : world_size_(world_size),
      initial_size_(initial_size > 0 && initial_size < world_size ? initial_size : world_size),
      require_sessions_(require_sessions),
      on_loss_(on_loss),
      lease_(lease),
      rejoin_deadline_(rejoin_deadline),
      clock_(clock),
      slots_(new Slot[world_size]),
      details_(world_size) {
  for (int r = initial_size_; r < world_size_; ++r) slots_[r].from_step.store(UINT64_MAX, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  do {
    incarnation_ = absl::Uniform<uint64_t>(session_bits_);
  } while (incarnation_ == 0);
}

void Membership::AddObserver(std::function<void()> on_change) { observers_.push_back(std::move(on_change)); }

void Membership::Notify() {
  for (const auto& observer : observers_) observer();
}

void Membership::SetState(int rank, MemberState s) {
  slots_[rank].state.store(static_cast<int>(s), std::memory_order_release);
  if (s == MemberState::kDropped || s == MemberState::kLeft) {
    const bool was = slots_[rank].excluded.exchange(true, std::memory_order_acq_rel);
    if (!was) group_epoch_.fetch_add(1, std::memory_order_acq_rel);
    if (!was && !follower()) view_.fetch_add(1, std::memory_order_acq_rel);
  }
}

std::vector<int> Membership::ExcludedRanks() const {
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r) {
    if (excluded(r)) out.push_back(r);
  }
  return out;
}

uint64_t Membership::followed_incarnation() const {
  absl::MutexLock lock(&mu_);
  return followed_incarnation_;
}

void Membership::Follow(uint64_t incarnation, uint64_t view, const std::vector<int>& excluded,
                        const std::string& job_error) {
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (incarnation == followed_incarnation_ && view <= followed_view_) return;
    if (followed_incarnation_ != 0 && incarnation != followed_incarnation_) {
      SUMMA_LOG(WARNING) << "shard 0 restarted: following its views from view " << view;
    }
    followed_incarnation_ = incarnation;
    followed_view_ = view;
    for (int r : excluded) {
      if (r < 0 || r >= world_size_ || this->excluded(r)) continue;
      SUMMA_LOG(WARNING) << "rank " << r << " is out of the group in shard 0's view " << view
                         << "; dropping it here too (it left, or was dropped there)";
      SetState(r, MemberState::kDropped);
      changed = true;
    }
    // After the exclusions: whoever reads this view finds them made.
    view_.store(view, std::memory_order_release);
  }
  if (!job_error.empty()) {
    EndJob(absl::StrCat("shard 0 ended the job: ", job_error));  // notifies
  } else if (changed) {
    Notify();
  }
}

int Membership::RankToAssign() const {
  // The initial group's first: the job waits for them.
  for (int r = 0; r < world_size_; ++r) {
    if (state(r) == MemberState::kAbsent) return r;
  }
  if (elastic()) {
    for (int r = 0; r < world_size_; ++r) {
      if (excluded(r)) return r;
    }
  }
  return world_size_;
}

absl::StatusOr<Admitted> Membership::Admit(int rank, const std::string& peer,
                                           const std::string& status_address, uint64_t grow_from) {
  absl::MutexLock lock(&mu_);
  if (rank == -1) {
    rank = RankToAssign();
    if (rank == world_size_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", world_size_, " ranks have joined already", elastic() ? " (the MAX of summa-server --workers=MIN:MAX)" : "",
          "; pass --rank to rejoin"));
    }
  }
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside ", RankRange(world_size_)));
  }
  const MemberState before = state(rank);
  const bool out = before == MemberState::kDropped || before == MemberState::kLeft;
  if (out && !elastic()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " ", before == MemberState::kDropped ? "was dropped from" : "left",
        " the group; the job goes on without it"));
  }
  const absl::Time now = clock_->Now();
  Details& d = details_[rank];
  Slot& slot = slots_[rank];
  const bool grows = out || slot.from_step.load(std::memory_order_acquire) == UINT64_MAX;
  if (before == MemberState::kAlive) {
    SUMMA_LOG(WARNING) << "rank " << rank << " joined again from " << peer
                       << " while its lease was still valid (a restart?)";
  } else if (before == MemberState::kLapsed) {
    SUMMA_LOG(INFO) << "rank " << rank << " rejoined from " << peer << " after "
                    << absl::FormatDuration(now - d.lapsed_at);
  }
  d.peer = peer;
  d.status_address = status_address;
  ++d.joins;
  uint64_t session = 0;
  while (session == 0) session = absl::Uniform<uint64_t>(session_bits_);
  const uint64_t fenced = slot.session.exchange(session, std::memory_order_acq_rel);
  if (fenced != 0 && !out) {
    SUMMA_LOG(WARNING) << "rank " << rank << ": the join from " << peer << " fences the rank's earlier "
                       << "session; calls from the process that held it are refused from now on";
  }
  slot.last_seen_ns.store(absl::ToUnixNanos(now), std::memory_order_relaxed);
  if (grows) {
    // From its step on, and not before: the steps under way keep the group they started with.
    slot.from_step.store(grow_from, std::memory_order_release);
    if (out) slot.excluded.store(false, std::memory_order_release);
    slot.state.store(static_cast<int>(MemberState::kAlive), std::memory_order_release);
    // The view's number stays: pushes of the steps before `grow_from`, stamped with it, still
    // count; the joiner's own are of later steps.
    group_epoch_.fetch_add(1, std::memory_order_acq_rel);
    SUMMA_LOG(INFO) << "rank " << rank << " joins the group from step " << grow_from << " (from " << peer << ")";
  } else {
    SetState(rank, MemberState::kAlive);
  }
  return Admitted{rank, session, slot.from_step.load(std::memory_order_acquire), grows};
}

absl::Status Membership::CheckSession(int rank, uint64_t session) const {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside ", RankRange(world_size_)));
  }
  const uint64_t current = slots_[rank].session.load(std::memory_order_acquire);
  if (current != 0 && (current == session || (session == 0 && !require_sessions_))) {
    return absl::OkStatus();
  }
  if (current == 0) {
    return absl::NotFoundError(absl::StrCat(
        "rank ", rank, " is not a member (never joined, or the server restarted or rolled back); Join again"));
  }
  if (session == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, ": the call carries no session; Join, then send the session it returns with "
        "every call"));
  }
  std::string peer;
  {
    absl::MutexLock lock(&mu_);
    peer = details_[rank].peer;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank, " is held by a newer process: a later Join from ", peer,
      " fenced this session; two processes were started as rank ", rank,
      ": stop this one (or give it another --rank)"));
}

absl::Status Membership::Touch(int rank, uint64_t session) {
  if (absl::Status s = CheckSession(rank, session); !s.ok()) return s;
  Slot& slot = slots_[rank];
  if (state(rank) != MemberState::kAlive) {
    absl::MutexLock lock(&mu_);
    switch (state(rank)) {
      case MemberState::kAbsent:
        return absl::NotFoundError(absl::StrCat(
            "rank ", rank, " is not a member (never joined, or the server restarted or rolled back); Join again"));
      case MemberState::kDropped:
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank, " was dropped from the group when its lease lapsed; its pushes are refused"));
      case MemberState::kLeft:
        return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " left the group"));
      case MemberState::kLapsed:
        SUMMA_LOG(INFO) << "rank " << rank << " is back after its lease lapsed";
        SetState(rank, MemberState::kAlive);
        break;
      case MemberState::kAlive:
        break;
    }
  }
  slot.last_seen_ns.store(absl::ToUnixNanos(clock_->Now()), std::memory_order_relaxed);
  return absl::OkStatus();
}

void Membership::Forget() {
  absl::MutexLock lock(&mu_);
  // Their states and lease clocks stand: one that does not join again lapses (and is dropped, or
  // waited for) as if it had gone silent.
  for (int r = 0; r < world_size_; ++r) slots_[r].session.store(0, std::memory_order_release);
}

void Membership::CountPush(int rank, int64_t examples) {
  slots_[rank].pushes.fetch_add(1, std::memory_order_relaxed);
  slots_[rank].examples.fetch_add(examples, std::memory_order_relaxed);
}

absl::Status Membership::Leave(int rank, uint64_t session) {
  if (absl::Status s = Touch(rank, session); !s.ok()) {
    // Out already, its own session asking: shard 0's view (which a follower hears of at once)
    // came before the rank's Leave to this shard. Leaving changes nothing; it is not an error.
    if (CheckSession(rank, session).ok() && excluded(rank)) return absl::OkStatus();
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    SetState(rank, MemberState::kLeft);
  }
  SUMMA_LOG(INFO) << "rank " << rank << " left the group";
  Notify();
  return absl::OkStatus();
}

void Membership::Tick(absl::Time now) {
  bool dropped = false;
  std::string end_job;
  {
    absl::MutexLock lock(&mu_);
    for (int r = 0; r < world_size_; ++r) {
      Details& d = details_[r];
      const absl::Time expiry = absl::FromUnixNanos(slots_[r].last_seen_ns.load()) + lease_;
      if (state(r) == MemberState::kAlive && expiry <= now && follower()) {
        // Shard 0 decides whether it is dropped, or the job ends.
        d.lapsed_at = now;
        SUMMA_LOG(WARNING) << "rank " << r << " made no call for " << absl::FormatDuration(lease_)
                           << " (lease lapsed); shard 0 decides what follows";
        SetState(r, MemberState::kLapsed);
        continue;
      }
      if (state(r) == MemberState::kAlive && expiry <= now) {
        d.lapsed_at = now;
        SUMMA_LOG(WARNING) << "rank " << r << " lost: no call for " << absl::FormatDuration(lease_)
                           << " (lease lapsed); "
                           << (on_loss_ == OnWorkerLoss::kShrink
                                   ? "dropping it and going on without it"
                                   : absl::StrCat("waiting up to ", absl::FormatDuration(rejoin_deadline_),
                                                  " for it to rejoin"));
        SetState(r, on_loss_ == OnWorkerLoss::kShrink ? MemberState::kDropped : MemberState::kLapsed);
        dropped |= on_loss_ == OnWorkerLoss::kShrink;
      }
      if (state(r) == MemberState::kLapsed && !follower() && on_loss_ == OnWorkerLoss::kShrink) {
        // Lapsed while it followed shard 0, which it no longer reaches: dropped, as here.
        SUMMA_LOG(WARNING) << "rank " << r << " lapsed while this shard followed shard 0; dropping it";
        SetState(r, MemberState::kDropped);
        dropped = true;
        continue;
      }
      if (state(r) == MemberState::kLapsed && !follower() && end_job.empty() &&
          now - d.lapsed_at >= rejoin_deadline_) {
        end_job = absl::StrCat("rank ", r, " was lost (lease lapsed ", absl::FormatDuration(now - d.lapsed_at),
                               " ago) and did not rejoin within --rejoin_deadline=",
                               absl::FormatDuration(rejoin_deadline_));
      }
    }
  }
  if (!end_job.empty()) {
    EndJob(end_job);  // notifies
  } else if (dropped) {
    Notify();
  }
}

GroupView Membership::group() const { return GroupAt(UINT64_MAX - 1); }

GroupView Membership::GroupAt(uint64_t step, uint64_t* until) const {
  GroupView g;
  g.ranks.reserve(world_size_);
  uint64_t epoch;
  uint64_t next;
  do {
    epoch = group_epoch();
    g.view = view();
    g.ranks.clear();
    next = UINT64_MAX;
    for (int r = 0; r < world_size_; ++r) {
      if (InGroupFrom(r, step)) {
        g.ranks.push_back(r);
      } else if (!excluded(r)) {
        next = std::min(next, slots_[r].from_step.load(std::memory_order_acquire));
      }
    }
  } while (epoch != group_epoch() || g.view != view());  // moved while read: read again
  if (until != nullptr) *until = next;
  return g;
}

GroupView Membership::CheckpointGroup() const {
  GroupView g;
  g.view = view();
  for (int r = 0; r < world_size_; ++r) {
    const bool admitted = slots_[r].from_step.load(std::memory_order_acquire) != UINT64_MAX;
    // As a fixed job's: the initial group's ranks that left are waited for after a restart (at a
    // job's end every rank leaves); a grown rank that left is not.
    if (state(r) != MemberState::kDropped && admitted && !(r >= initial_size_ && excluded(r))) g.ranks.push_back(r);
  }
  return g;
}

void Membership::Restore(const GroupView& group) {
  {
    absl::MutexLock lock(&mu_);
    for (int r = 0; r < world_size_; ++r) {
      if (group.Contains(r)) {
        slots_[r].from_step.store(0, std::memory_order_release);  // a grown rank is in from the start
      } else if (r < initial_size_ && !excluded(r)) {
        SetState(r, MemberState::kDropped);
      }
    }
    group_epoch_.fetch_add(1, std::memory_order_acq_rel);
    if (!follower() && group.view > view()) view_.store(group.view, std::memory_order_release);
  }
  Notify();
}

std::string Membership::job_error() const {
  absl::MutexLock lock(&mu_);
  return job_error_;
}

void Membership::EndJob(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (!job_error_.empty()) return;
    job_error_ = why;
    job_ended_.store(true, std::memory_order_release);
    if (!follower()) view_.fetch_add(1, std::memory_order_acq_rel);
  }
  SUMMA_LOG(ERROR) << "ending the job: " << why;
  Notify();
}

std::vector<MemberInfo> Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<MemberInfo> out;
  for (int r = 0; r < world_size_; ++r) {
    if (state(r) == MemberState::kAbsent) continue;
    MemberInfo m;
    m.rank = r;
    m.state = state(r);
    m.peer = details_[r].peer;
    m.status_address = details_[r].status_address;
    m.pushes = slots_[r].pushes.load();
    m.examples = slots_[r].examples.load();
    m.last_seen = absl::FromUnixNanos(slots_[r].last_seen_ns.load());
    m.lease_expiry = m.last_seen + lease_;
    m.lapsed_at = details_[r].lapsed_at;
    m.joins = details_[r].joins;
    m.from_step = slots_[r].from_step.load();
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace summa::server
