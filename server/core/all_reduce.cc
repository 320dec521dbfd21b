#include "server/core/all_reduce.h"

#include <cstring>

#include "common/vector_ops.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace summa::server {
namespace {

// A fixed group's barrier and its deadline message are sized by the group: bound what one
// request can make the server allocate.
constexpr int kMaxGroupSize = 4096;

absl::Status Validate(const AllReduceContribution& c, int world_size) {
  if (c.name.empty()) return absl::InvalidArgumentError("the collective needs a name");
  const int group = c.members ? world_size : c.group_size;
  if (!c.members && (c.group_size < 1 || c.group_size > kMaxGroupSize)) {
    return absl::InvalidArgumentError(absl::StrCat("group size must be in [1, ", kMaxGroupSize,
                                                   "], got ", c.group_size));
  }
  if (c.rank < 0 || c.rank >= group) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", c.rank, " is outside the ",
                                                   c.members ? "job's " : "", "group of ", group,
                                                   " (ranks 0..", group - 1, ")"));
  }
  absl::Status shape = ValidateShape(c.spec.shape);
  if (!shape.ok()) return shape;
  if (static_cast<int64_t>(c.data.size()) != c.spec.num_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("a float32 tensor of shape ", ShapeString(c.spec.shape),
                                                   " needs ", c.spec.num_bytes(), " bytes, got ",
                                                   c.data.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceHub::Admit(Collective& col, const AllReduceContribution& c) {
  if (shut_down_.load()) return absl::UnavailableError("the server is shutting down");
  if (col.members != c.members) {
    return absl::InvalidArgumentError(absl::StrCat("collective '", c.name, "' is ",
                                                   col.members ? "over the job's members" : "a fixed group",
                                                   "; this caller asks for ",
                                                   c.members ? "the job's members" : "a fixed group"));
  }
  if (!col.members && col.barrier.group_size() != c.group_size) {
    return absl::InvalidArgumentError(absl::StrCat("collective '", c.name, "' has group size ",
                                                   col.barrier.group_size(), "; this caller says ",
                                                   c.group_size));
  }
  if (col.members) {
    if (members_->job_ended()) return absl::AbortedError(absl::StrCat("the job has ended: ", members_->job_error()));
    if (absl::Status s = members_->CheckSession(c.rank, c.session); !s.ok()) return s;
    if (members_->excluded(c.rank)) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", c.rank, " is no longer in the group"));
    }
    if (c.round > col.round && col.barrier.arrived() == 0) {
      // Rounds this hub never saw (it restarted, or a round was abandoned): start at the caller's.
      col.round = c.round;
      col.has_last = false;
    }
    if (c.round > col.round) {
      return absl::OutOfRangeError(absl::StrCat("collective '", c.name, "' is at round ", col.round,
                                                "; rank ", c.rank, " asked for round ", c.round));
    }
    if (c.round + 1 < col.round || (c.round + 1 == col.round && !col.has_last)) {
      return absl::FailedPreconditionError(absl::StrCat("round ", c.round, " of collective '", c.name,
                                                        "' is long past (it is at round ", col.round, ")"));
    }
    if (c.round + 1 == col.round && col.last_shape != c.spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "collective '", c.name, "' round ", c.round, " reduced shape ", ShapeString(col.last_shape),
          "; rank ", c.rank, " sent ", ShapeString(c.spec.shape)));
    }
  }
  const bool current_round = !col.members || c.round == col.round;
  if (current_round && col.barrier.arrived() > 0 && col.spec.shape != c.spec.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective '", c.name, "' round ", col.round, " reduces shape ", ShapeString(col.spec.shape),
        "; rank ", c.rank, " sent ", ShapeString(c.spec.shape)));
  }
  if (current_round && col.barrier.arrived() > 0 && col.barrier.has_arrived(c.rank)) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", c.rank, " already contributed to round ",
                                                 col.round, " of collective '", c.name, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AllReduceHub::CollectivePtr> AllReduceHub::Find(const AllReduceContribution& c) {
  absl::MutexLock lock(&mu_);
  auto it = collectives_.find(c.name);
  const Collective* keep = it == collectives_.end() ? nullptr : it->second.get();
  while (buffer_bytes_.load(std::memory_order_relaxed) + c.spec.num_bytes() > max_bytes_ &&
         ForgetOneIdle(keep)) {
  }
  if (keep != nullptr) return it->second;
  while (static_cast<int64_t>(collectives_.size()) >= max_collectives_) {
    if (!ForgetOneIdle(nullptr)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server holds ", collectives_.size(), " AllReduce collectives, each with a round in "
          "progress: no room for '", c.name, "' (summa-server --max_collectives)"));
    }
  }
  CollectivePtr& slot = collectives_[c.name];
  slot = std::make_shared<Collective>(c.members ? members_->world_size() : c.group_size, c.members);
  return slot;
}

bool AllReduceHub::ForgetOneIdle(const Collective* keep) {
  auto oldest = collectives_.end();
  absl::Time oldest_use = absl::InfiniteFuture();
  for (auto it = collectives_.begin(); it != collectives_.end(); ++it) {
    Collective& col = *it->second;
    if (&col == keep || !col.mu.TryLock()) continue;  // a busy one is not idle
    if (col.barrier.arrived() == 0 && col.last_used < oldest_use) {
      oldest = it;
      oldest_use = col.last_used;
    }
    col.mu.Unlock();
  }
  if (oldest == collectives_.end()) return false;
  Collective& col = *oldest->second;
  {
    absl::MutexLock lock(&col.mu);
    if (col.barrier.arrived() != 0) return true;  // busy since: the caller looks again
    col.forgotten = true;
    buffer_bytes_.fetch_sub(col.bytes, std::memory_order_relaxed);
    col.bytes = 0;
  }
  collectives_.erase(oldest);  // its buffers go when the last reply sending them is done
  return true;
}

std::vector<std::pair<std::string, AllReduceHub::CollectivePtr>> AllReduceHub::All() const {
  absl::MutexLock lock(&mu_);
  return {collectives_.begin(), collectives_.end()};
}

size_t AllReduceHub::collectives() const {
  absl::MutexLock lock(&mu_);
  return collectives_.size();
}

absl::Status AllReduceHub::Open(Collective& col, const AllReduceContribution& c) {
  absl::StatusOr<PeerBudget::Hold> opened = opened_.Take(c.peer, 1);
  if (!opened.ok()) return opened.status();
  const int64_t n = c.spec.num_elements();
  const int64_t growth = col.pool.GrowthFor(n);
  if (growth > 0 && buffer_bytes_.load(std::memory_order_relaxed) + growth > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the AllReduce buffers hold ", buffer_bytes_.load(), " bytes; collective '", c.name, "' needs ",
        growth, " more: over the limit of ", max_bytes_, " (summa-server --max_allreduce_bytes)"));
  }
  col.opened = *std::move(opened);
  col.spec = c.spec;
  col.sum = col.pool.Acquire(n, &col.sum_data);
  const int64_t bytes = col.pool.bytes();
  buffer_bytes_.fetch_add(bytes - col.bytes, std::memory_order_relaxed);
  col.bytes = bytes;
  std::memcpy(col.sum_data, c.data.data(), n * sizeof(float));
  return absl::OkStatus();
}

void AllReduceHub::Contribute(const AllReduceContribution& c, std::shared_ptr<ParkedCall> call) {
  CallsToFinish done;
  absl::Status refused = c.members && members_ == nullptr
                             ? absl::FailedPreconditionError("this server keeps no membership")
                             : Validate(c, members_ != nullptr ? members_->world_size() : 0);
  while (refused.ok()) {
    absl::StatusOr<CollectivePtr> found = Find(c);
    if (!found.ok()) {
      refused = found.status();
      break;
    }
    Collective& col = **found;
    absl::MutexLock lock(&col.mu);
    if (col.forgotten) continue;  // forgotten between Find and the lock: find (or add) it again
    col.last_used = clock_->Now();
    refused = Admit(col, c);
    if (!refused.ok()) break;
    if (col.members && c.round + 1 == col.round) {
      // A member that rejoined after the round completed: it gets the round's sum, adding nothing.
      if (call->Claim()) {
        call->Fill(c.round + 1, col.last);
        done.Add(std::move(call), absl::OkStatus());
      }
      break;
    }
    if (col.sum.empty()) {
      refused = Open(col, c);
      if (!refused.ok()) break;
    } else {
      const int64_t n = c.spec.num_elements();
      AddInto(absl::MakeSpan(col.sum_data, n),
              absl::MakeConstSpan(reinterpret_cast<const float*>(c.data.data()), n));
    }
    col.barrier.Arrive(c.rank, col.last_used).IgnoreError();  // rank and duplicates checked above
    col.parked.Park(std::move(call), col.round + 1, col.last_used + deadline_);
    MaybeComplete(col, done);
    break;
  }
  if (!refused.ok() && call != nullptr && call->Claim()) call->Finish(refused);
}

void AllReduceHub::MaybeComplete(Collective& col, CallsToFinish& done) {
  if (col.barrier.arrived() == 0) return;
  for (int r : RoundGroup(col).ranks) {
    if (!col.barrier.has_arrived(r)) return;
  }
  ++col.round;
  rounds_completed_.fetch_add(1, std::memory_order_relaxed);
  col.barrier.Reset();
  RoundGroup(col);  // the next round runs under the group as it is now
  Snapshot sum = std::move(col.sum);
  col.sum = Snapshot();
  col.sum_data = nullptr;
  col.opened.Release();
  col.parked.Release(col.round, [&]() -> const Snapshot& { return sum; }, done);
  if (col.members) {
    col.last = std::move(sum);
    col.last_shape = col.spec.shape;
    col.has_last = true;
  }
}

const GroupView& AllReduceHub::RoundGroup(Collective& col) const {
  if (!col.members) return col.group;
  if (const uint64_t epoch = members_->group_epoch(); col.group_epoch != epoch) {
    // Narrowed during a round; a round that has not begun takes the group as it is.
    const GroupView now = members_->group();
    col.group = col.barrier.arrived() == 0 ? now : col.group.Narrowed(now);
    col.group_epoch = epoch;
  }
  return col.group;
}

void AllReduceHub::OnMembershipChange() {
  if (members_ == nullptr) return;
  const bool ended = members_->job_ended();
  for (const auto& [name, col] : All()) {
    if (!col->members) continue;
    CallsToFinish done;
    absl::MutexLock lock(&col->mu);
    if (ended) {
      col->parked.FailAll(absl::AbortedError(absl::StrCat("the job has ended: ", members_->job_error())), done);
      Reset(*col);
    } else {
      MaybeComplete(*col, done);
    }
  }
}

absl::Time AllReduceHub::ExpireRounds(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [name, col] : All()) {
    CallsToFinish expired;
    absl::MutexLock lock(&col->mu);
    if (col->barrier.arrived() == 0) continue;
    const absl::Time round_deadline = col->barrier.first_arrival() + deadline_;
    if (round_deadline > now) {
      next = std::min(next, round_deadline);
      continue;
    }
    std::vector<int> missing;
    for (int r : RoundGroup(*col).ranks) {
      if (!col->barrier.has_arrived(r)) missing.push_back(r);
    }
    const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "collective '", name, "' round ", col->round, " abandoned: ", col->barrier.arrived(), " of ",
        col->barrier.group_size(), " ranks arrived within ", absl::FormatDuration(deadline_),
        "; missing rank", missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", ")));
    col->parked.FailAll(status, expired);
    Reset(*col);
    col->has_last = false;  // the abandoned round has no sum to give late members
  }
  return next;
}

void AllReduceHub::Shutdown() {
  shut_down_ = true;
  for (const auto& [name, col] : All()) {
    CallsToFinish failed;
    absl::MutexLock lock(&col->mu);
    col->parked.FailAll(absl::UnavailableError("the server is shutting down"), failed);
    Reset(*col);
  }
}

void AllReduceHub::Reset(Collective& col) {
  col.barrier.Reset();
  col.sum = Snapshot();
  col.sum_data = nullptr;
  col.opened.Release();
}

}  // namespace summa::server
