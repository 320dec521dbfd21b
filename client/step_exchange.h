// StepExchange: a training step's exchange overlapped with its compute (DDP's gradient buckets,
// ByteScheduler's per-layer waits). The trainer Begins a step before backward, names each
// partition Ready as soon as backward has finished its gradients (the last layers' first), and
// Waits for a partition's new weights only where the next forward needs them; Finish ends the
// step. A thread of the exchange's own starts each partition's push-pull the moment it is ready
// (several ready at once: the first layers' first, so that the next forward's first wait is the
// shortest) and writes each reply into the weights as it lands.
//
// The training thread calls Begin, Wait, Finish; Ready and ReadyAll may come from any thread
// (autograd's). Between Begin and Finish the client belongs to the exchange's thread.
#ifndef SUMMA_CLIENT_STEP_EXCHANGE_H_
#define SUMMA_CLIENT_STEP_EXCHANGE_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"

namespace summa::worker {

class StepExchange {
 public:
  // Borrows `client` (joined; it outlives the exchange) and starts the thread.
  explicit StepExchange(ParameterClient* client);
  // Waits for a step's calls still in flight (each has a deadline) and stops the thread.
  ~StepExchange();
  StepExchange(const StepExchange&) = delete;
  StepExchange& operator=(const StepExchange&) = delete;

  // Starts `step`: no call yet. FAILED_PRECONDITION while the last step is not finished.
  // `gradients` and `weights` are the client's flat buffers (see ParameterClient::BeginStaged).
  absl::Status Begin(uint64_t step, int64_t num_examples, const float* gradients, float* weights);
  // Partition i's gradients are final: its push-pull starts now. Naming one twice in a step
  // fails the step (FAILED_PRECONDITION): a bucket pushed twice is a trainer's bug.
  void Ready(size_t i);
  // Every partition not yet ready (parameters that had no gradient this step).
  void ReadyAll();
  // Waits until partition i's new weights are in, or the step has failed (its error).
  absl::Status Wait(size_t i);
  // The group partition i's reply named (the next step's, in sync mode), once Wait(i) returned
  // OK in this step; empty before.
  std::vector<int> live_ranks(size_t i) const;
  // Waits for every call of the step to end and ends it: its first error, or FAILED_PRECONDITION
  // naming partitions never made ready. `live_ranks` (where given): the group the replies named.
  absl::Status Finish(std::vector<int>* live_ranks = nullptr);
  // Whether a step has begun and not finished.
  bool active() const;

  // When each partition of the last step was made ready, started and answered, in
  // std::chrono::steady_clock nanoseconds (CLOCK_MONOTONIC: Python's time.monotonic_ns); -1
  // where it was not.
  struct Times {
    int64_t ready_ns = -1;
    int64_t start_ns = -1;
    int64_t end_ns = -1;
  };
  std::vector<Times> timeline() const;

 private:
  void Run();
  void MarkReady(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterClient* const client_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> ready_ ABSL_GUARDED_BY(mu_);  // made ready, not yet started
  std::vector<char> named_ ABSL_GUARDED_BY(mu_);   // per partition: made ready this step
  std::vector<char> done_ ABSL_GUARDED_BY(mu_);    // per partition: its call ended
  bool starting_ ABSL_GUARDED_BY(mu_) = false;       // the thread is starting calls
  bool calls_running_ ABSL_GUARDED_BY(mu_) = false;  // the client has staged calls in flight
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<Times> times_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_STEP_EXCHANGE_H_
