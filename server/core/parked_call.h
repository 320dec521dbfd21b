// ParkedCall: an RPC that waits, without a thread, for a counter (a partition's version, a
// collective's round) to reach a value. The gRPC edge implements it over an async data-path call
// (or, for a held shard report, a handler's thread); tests implement it over a promise.
//
// Protocol, which keeps a cancelled call from being touched after gRPC frees it: whoever wants
// to answer first calls Claim(); only a successful claimer may then call Fill (under the owner's
// lock, to take the result) and Finish (outside every lock).
#ifndef SUMMA_SERVER_CORE_PARKED_CALL_H_
#define SUMMA_SERVER_CORE_PARKED_CALL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/core/snapshot.h"

namespace summa::server {

class ParkedCall {
 public:
  virtual ~ParkedCall() = default;
  // True exactly once over the call's life; false when the call was already answered or
  // cancelled.
  virtual bool Claim() = 0;
  // True once Claim() has succeeded: answered (or being answered) or cancelled.
  virtual bool claimed() const = 0;
  // Takes the result, a reference to immutable values shared by every call answered with them
  // (no copy); `counter` is the version (or round) the values belong to.
  virtual void Fill(uint64_t counter, const Snapshot& values) = 0;
  virtual void Finish(absl::Status status) = 0;
  // The answer is a late push's (sync mode with backup workers: its step completed without it,
  // and the values are the partition's newest, whose version may be past the step after it).
  // Called by the core before it hands the call on; calls that answer no push-pull ignore it.
  virtual void MarkLate() {}
  // The bytes each value takes in the answer (4, or 2 for a pull in a 16-bit wire dtype): what
  // the server counts as sent.
  virtual int value_bytes() const { return 4; }
};

// Claimed calls with the status to finish them with, collected under a lock and finished after
// it is released.
class CallsToFinish {
 public:
  CallsToFinish() = default;
  CallsToFinish(CallsToFinish&&) = default;
  CallsToFinish& operator=(CallsToFinish&&) = default;
  ~CallsToFinish() { FinishAll(); }

  void Add(std::shared_ptr<ParkedCall> call, absl::Status status) {
    calls_.push_back({std::move(call), std::move(status)});
  }
  size_t size() const { return calls_.size(); }
  // The calls' value_bytes, summed.
  int64_t value_bytes() const {
    int64_t total = 0;
    for (const auto& entry : calls_) total += entry.first->value_bytes();
    return total;
  }
  void FinishAll() {
    for (auto& [call, status] : calls_) call->Finish(std::move(status));
    calls_.clear();
  }

 private:
  std::vector<std::pair<std::shared_ptr<ParkedCall>, absl::Status>> calls_;
};

// Calls parked until a counter reaches their target. Not thread-safe: its owner's lock guards it.
class ParkingLot {
 public:
  // Calls answered by someone else while parked (a client that went away) are forgotten as the
  // lot grows, every time it doubles: their parked-call holds went when they were answered, so
  // without this a caller that parks and cancels could grow the lot without a bound until the
  // counter moves.
  // `after_push`: the call is a push-pull's, whose push was counted for the step it waits on.
  void Park(std::shared_ptr<ParkedCall> call, uint64_t target, absl::Time deadline, bool after_push = false) {
    if (parked_.size() >= prune_at_) {
      DropClaimed();
      prune_at_ = std::max<size_t>(kMinPruneAt, 2 * parked_.size());
    }
    parked_.push_back({std::move(call), target, deadline, after_push});
  }
  size_t size() const { return parked_.size(); }

  // Claims and fills every call whose target is <= counter; adds them to `out` with OK. The
  // calls are filled with `values()` as of `version` (by default the counter itself); `values`
  // is called only when some call is answered, and then once.
  void Release(uint64_t counter, absl::FunctionRef<const Snapshot&()> values, CallsToFinish& out) {
    Release(counter, counter, values, out);
  }
  void Release(uint64_t counter, uint64_t version, absl::FunctionRef<const Snapshot&()> values,
               CallsToFinish& out) {
    FillWhere([&](const Entry& e) { return e.target <= counter; }, version, values, out);
  }

  // Claims and fills, as Release does, every call whatever its target (a server that stops
  // holding calls whose wait is not a failure: a follower's held report).
  void ReleaseAll(uint64_t counter, absl::FunctionRef<const Snapshot&()> values, CallsToFinish& out) {
    FillWhere([](const Entry&) { return true; }, counter, values, out);
  }

  // Claims every call whose deadline is at or before `now`; `why` gives each its status.
  template <typename Why>
  void Expire(absl::Time now, Why why, CallsToFinish& out) {
    Sweep([&](const Entry& e) { return e.deadline <= now; },
          [&](ParkedCall&) { return why(); }, out);
  }

  // Claims every call, whatever its target; `status` is what each gets.
  void FailAll(const absl::Status& status, CallsToFinish& out) {
    Sweep([](const Entry&) { return true; }, [&](ParkedCall&) { return status; }, out);
  }

  // Claims every push-pull's call (Park's after_push) whose target is <= `target`; `status` is
  // what each gets: their pushes were dropped.
  void FailPushesUpTo(uint64_t target, const absl::Status& status, CallsToFinish& out) {
    Sweep([&](const Entry& e) { return e.after_push && e.target <= target; },
          [&](ParkedCall&) { return status; }, out);
  }

 private:
  struct Entry {
    std::shared_ptr<ParkedCall> call;
    uint64_t target;
    absl::Time deadline;
    bool after_push;
  };

  // Forgets the calls claimed already (answered by someone else: a timer, a cancellation).
  void DropClaimed() {
    parked_.erase(std::remove_if(parked_.begin(), parked_.end(), [](const Entry& e) { return e.call->claimed(); }),
                  parked_.end());
  }

  // Claims every call `pred` picks and fills it with `values()` as of `version` (called only
  // when some call is answered, and then once); adds them to `out` with OK.
  template <typename Pred>
  void FillWhere(Pred pred, uint64_t version, absl::FunctionRef<const Snapshot&()> values, CallsToFinish& out) {
    const Snapshot* taken = nullptr;
    Sweep(pred,
          [&](ParkedCall& call) {
            if (taken == nullptr) taken = &values();
            call.Fill(version, *taken);
            return absl::OkStatus();
          },
          out);
  }

  template <typename Pred, typename Answer>
  void Sweep(Pred pred, Answer answer, CallsToFinish& out) {
    size_t kept = 0;
    for (size_t i = 0; i < parked_.size(); ++i) {
      Entry& e = parked_[i];
      if (!pred(e)) {
        if (kept != i) parked_[kept] = std::move(e);
        ++kept;
        continue;
      }
      // A call that fails to claim was answered already (its client went away, a timer): drop it.
      if (e.call->Claim()) {
        absl::Status status = answer(*e.call);
        out.Add(std::move(e.call), std::move(status));
      }
    }
    parked_.resize(kept);
  }

  static constexpr size_t kMinPruneAt = 16;
  std::vector<Entry> parked_;
  size_t prune_at_ = kMinPruneAt;  // Park drops the claimed calls when the lot reaches this size
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_PARKED_CALL_H_
