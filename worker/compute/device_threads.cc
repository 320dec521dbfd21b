#include "worker/compute/device_threads.h"

namespace summa::worker {

DeviceThreads::DeviceThreads(int devices) : devices_(devices < 1 ? 1 : devices), results_(devices_) {
  for (int d = 1; d < devices_; ++d) threads_.emplace_back([this, d] { Loop(d); });
}

DeviceThreads::~DeviceThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

absl::Status DeviceThreads::Run(absl::FunctionRef<absl::Status(int)> work) {
  if (devices_ > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    work_ = &work;
    pending_ = devices_ - 1;
    ++round_;
  }
  start_.notify_all();
  results_[0] = work(0);
  if (devices_ > 1) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    work_ = nullptr;
  }
  for (const absl::Status& s : results_) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void DeviceThreads::Loop(int device) {
  uint64_t seen = 0;
  for (;;) {
    const absl::FunctionRef<absl::Status(int)>* work = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stopping_ || round_ != seen; });
      if (stopping_) return;
      seen = round_;
      work = work_;
    }
    results_[device] = (*work)(device);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

}  // namespace summa::worker
