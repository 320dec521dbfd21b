#include "server/all_reduce.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace summa::server {
namespace {

absl::Status Validate(const AllReduceContribution& c) {
  if (c.name.empty()) return absl::InvalidArgumentError("the collective needs a name");
  if (c.group_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("group size must be at least 1, got ", c.group_size));
  }
  if (c.rank < 0 || c.rank >= c.group_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", c.rank, " is outside the group of ",
                                                   c.group_size, " (ranks 0..", c.group_size - 1, ")"));
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

void AllReduceHub::Contribute(const AllReduceContribution& c, std::shared_ptr<ParkedCall> call) {
  CallsToFinish done;
  absl::Status refused = Validate(c);
  if (refused.ok()) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Collective>& slot = collectives_[c.name];
    if (slot == nullptr) slot = std::make_unique<Collective>(c.group_size);
    Collective& col = *slot;
    const int64_t n = c.spec.num_elements();
    if (shut_down_) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (col.barrier.group_size() != c.group_size) {
      refused = absl::InvalidArgumentError(absl::StrCat("collective '", c.name, "' has group size ",
                                                        col.barrier.group_size(), "; this caller says ",
                                                        c.group_size));
    } else if (col.barrier.arrived() > 0 && col.spec.shape != c.spec.shape) {
      refused = absl::InvalidArgumentError(absl::StrCat(
          "collective '", c.name, "' round ", col.round, " reduces shape ", ShapeString(col.spec.shape),
          "; rank ", c.rank, " sent ", ShapeString(c.spec.shape)));
    } else if (col.barrier.arrived() > 0 && col.barrier.has_arrived(c.rank)) {
      refused = absl::AlreadyExistsError(absl::StrCat("rank ", c.rank, " already contributed to round ",
                                                      col.round, " of collective '", c.name, "'"));
    } else {
      const absl::Time now = absl::Now();
      const bool first = col.barrier.arrived() == 0;
      const bool all = *col.barrier.Arrive(c.rank, now);  // rank and duplicates checked above
      const float* in = reinterpret_cast<const float*>(c.data.data());
      if (first) {
        col.spec = c.spec;
        col.sum.resize(n);
        std::memcpy(col.sum.data(), in, n * sizeof(float));
      } else {
        for (int64_t i = 0; i < n; ++i) col.sum[i] += in[i];
      }
      col.parked.Park(std::move(call), col.round + 1, now + deadline_);
      if (all) {
        ++col.round;
        ++rounds_completed_;
        col.barrier.Reset();
        col.parked.Release(col.round, col.sum, done);
      }
    }
  }
  if (!refused.ok() && call != nullptr && call->Claim()) call->Finish(refused);
}

absl::Time AllReduceHub::ExpireRounds(absl::Time now) {
  CallsToFinish expired;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, col] : collectives_) {
      if (col->barrier.arrived() == 0) continue;
      const absl::Time round_deadline = col->barrier.first_arrival() + deadline_;
      if (round_deadline > now) {
        next = std::min(next, round_deadline);
        continue;
      }
      const std::vector<int> missing = col->barrier.Missing();
      const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
          "collective '", name, "' round ", col->round, " abandoned: ", col->barrier.arrived(), " of ",
          col->barrier.group_size(), " ranks arrived within ", absl::FormatDuration(deadline_),
          "; missing rank", missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", ")));
      col->parked.FailAll(status, expired);
      col->barrier.Reset();
    }
  }
  return next;
}

void AllReduceHub::Shutdown() {
  CallsToFinish failed;
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [name, col] : collectives_) {
    col->parked.FailAll(absl::UnavailableError("the server is shutting down"), failed);
    col->barrier.Reset();
  }
}

uint64_t AllReduceHub::rounds_completed() const {
  absl::MutexLock lock(&mu_);
  return rounds_completed_;
}

}  // namespace summa::server
