// DeviceThreads: runs one piece of work per local device at once, device 0's on the calling
// thread and each other's on a thread of its own, started once and kept for the object's life
// (no thread is started per step). What lets a worker's shard, split across several CPU backends
// (--threads, --devices=cpu,cpu), use several cores: each backend is used by one thread at a time,
// as backend.h asks. Run() is called from one thread at a time.
#ifndef SUMMA_WORKER_COMPUTE_DEVICE_THREADS_H_
#define SUMMA_WORKER_COMPUTE_DEVICE_THREADS_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace summa::worker {

class DeviceThreads {
 public:
  explicit DeviceThreads(int devices);
  ~DeviceThreads();
  DeviceThreads(const DeviceThreads&) = delete;
  DeviceThreads& operator=(const DeviceThreads&) = delete;

  int devices() const { return devices_; }
  // work(d) for every device d in [0, devices()), all at once; returns when every one has, with
  // the first error in device order (each one runs whatever the others return).
  absl::Status Run(absl::FunctionRef<absl::Status(int)> work);

 private:
  void Loop(int device);

  const int devices_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  uint64_t round_ = 0;       // guarded by mu_: bumped by Run to start the threads
  int pending_ = 0;          // guarded by mu_: threads still working in this round
  bool stopping_ = false;    // guarded by mu_
  const absl::FunctionRef<absl::Status(int)>* work_ = nullptr;  // valid during Run
  std::vector<absl::Status> results_;  // one per device, each written by its own thread
  std::vector<std::thread> threads_;   // devices 1..devices-1
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_COMPUTE_DEVICE_THREADS_H_
