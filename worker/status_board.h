// StatusBoard: what the worker is doing, written by the training loop and read by the
// summa.v1.Worker service. Thread-safe.
#ifndef SUMMA_WORKER_STATUS_BOARD_H_
#define SUMMA_WORKER_STATUS_BOARD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace summa::worker {

struct WorkerState {
  int rank = -1;
  int world_size = 0;
  std::string device;
  std::string model;  // "lenet", "mlp"
  std::string server;
  int epoch = 0;   // 1-based epoch in progress or last finished
  int epochs = 0;
  uint64_t step = 0;  // global steps completed (the weights' version)
  double examples_per_second = 0;
  double last_loss = 0;
  double last_test_accuracy = 0;
  std::string state = "starting";
  std::string mode;
  int joins = 0;
};

class StatusBoard {
 public:
  void Update(const std::function<void(WorkerState&)>& change) {
    absl::MutexLock lock(&mu_);
    change(state_);
  }
  WorkerState Get() const {
    absl::MutexLock lock(&mu_);
    return state_;
  }
  absl::Duration uptime() const { return absl::Now() - started_; }

 private:
  const absl::Time started_ = absl::Now();
  mutable absl::Mutex mu_;
  WorkerState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_STATUS_BOARD_H_
