// FaultInjectingStore: a ParameterStore that forwards to another and injects the faults of the
// process tests (summa-worker --fault_*), each at a step or round the test chooses:
//  - exit_after_push: from that step on, each PushPull becomes a Push (which replies at once)
//    and, when that push left its step waiting for other workers, the process exits at once with
//    status 137, as a worker killed between its push and the reply would; when the push completed
//    the step, the next weights are pulled and training goes on (the live group is not updated
//    on that path);
//  - repeat_push_pull_at: at that step the PushPull is sent, its reply dropped, and sent again,
//    as a client whose first reply was lost retries: the server must count it once;
//  - exit_before_round: at that round of the trainer's epoch-end loss collective
//    (kLossCollective), the process exits with status 137 before contributing: lost after the
//    last push of an epoch;
//  - delay_push: every push (PushPull or Push) waits this long first, so that this rank's pushes
//    reach the server after the others': a test forces the order pushes arrive in;
//  - pauses: before the push of each step listed, the worker says so and waits until the file
//    named exists (its lease kept by the heartbeat thread), so that a test makes something happen
//    at a step boundary of its choosing (a joiner admitted, this process killed there).
//  - hold_push_until_fenced: the first push waits (heartbeating, at most two minutes) until the
//    server refuses this process's session, fenced by a later process started as its rank; it
//    then goes, and is refused: two processes of one rank, the earlier one held at its first
//    push, in an order a test sets.
// A negative value (a zero delay, false) injects nothing.
//
// Compiled (and the flags defined, and the store wired in by RunWorker) only in a build with
// -DSUMMA_FAULT_INJECTION=ON, the test suite's (scripts/build.sh): production binaries have none
// of it.
//
// Owns nothing: the inner store and `out` are borrowed. Thread safety as the inner store's.
#ifndef SUMMA_WORKER_FAULT_INJECTING_STORE_H_
#define SUMMA_WORKER_FAULT_INJECTING_STORE_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/parameter_store.h"

namespace summa::worker {

struct FaultPlan {
  int64_t exit_after_push = -1;
  int64_t repeat_push_pull_at = -1;
  int64_t exit_before_round = -1;
  absl::Duration delay_push = absl::ZeroDuration();
  std::vector<std::pair<int64_t, std::string>> pauses;  // (step, file)
  bool hold_push_until_fenced = false;
  bool any() const {
    return exit_after_push >= 0 || repeat_push_pull_at >= 0 || exit_before_round >= 0 ||
           delay_push > absl::ZeroDuration() || !pauses.empty() || hold_push_until_fenced;
  }
};

class FaultInjectingStore final : public ParameterStore {
 public:
  // `inner` and `out` (where each fault is announced) must outlive this store.
  FaultInjectingStore(ParameterStore* inner, FaultPlan plan, std::FILE* out)
      : inner_(inner), plan_(plan), out_(out) {}

  absl::StatusOr<JoinInfo> Join(int rank, int world, const std::vector<TensorSpec>& specs,
                                const float* initial, const std::string& status_address) override;
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, float* weights) override {
    return inner_->PullAll(min_version, weights);
  }
  absl::StatusOr<uint64_t> PushPull(uint64_t step, int64_t num_examples, const float* gradients, float* weights,
                                    std::vector<int>* live_ranks) override;
  absl::StatusOr<bool> Push(uint64_t step, int64_t num_examples, const float* gradients) override {
    BeforePush(step);
    return inner_->Push(step, num_examples, gradients);
  }
  absl::Status Heartbeat(int rank) const override { return inner_->Heartbeat(rank); }
  absl::StatusOr<float*> SharedValues(size_t floats) override { return inner_->SharedValues(floats); }
  absl::Status Leave(int rank) override { return inner_->Leave(rank); }
  absl::StatusOr<std::vector<float>> AllReduce(const Collective& group,
                                               const std::vector<float>& values) override;
  std::string address() const override { return inner_->address(); }

 private:
  ParameterStore* const inner_;  // Not owned.
  [[noreturn]] void Exit(const std::string& why);
  // Before each push: the pause of `step` (until its file exists), delay_push, and
  // hold_push_until_fenced.
  void BeforePush(uint64_t step);

  const FaultPlan plan_;
  std::FILE* const out_;  // Not owned.
  int rank_ = -1;         // from the last Join, for the message
  bool held_ = false;     // hold_push_until_fenced has held its push
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_FAULT_INJECTING_STORE_H_
