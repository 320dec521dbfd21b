// A ParkedCall for tests: records what the core answered and lets the test wait for it.
#ifndef SUMMA_TESTS_FAKE_CALL_H_
#define SUMMA_TESTS_FAKE_CALL_H_

#include <atomic>
#include <future>
#include <vector>

#include "server/core/parked_call.h"

namespace summa::server {

class FakeCall : public ParkedCall {
 public:
  bool Claim() override { return !claimed_.exchange(true); }
  bool claimed() const override { return claimed_.load(); }
  void Fill(uint64_t counter, const Snapshot& values) override {
    counter_ = counter;
    values_.assign(values.values().begin(), values.values().end());
  }
  void Finish(absl::Status status) override { done_.set_value(std::move(status)); }
  void MarkLate() override { late_ = true; }

  // Waits at most `timeout` for the answer; DEADLINE_EXCEEDED "not answered" otherwise.
  absl::Status Wait(absl::Duration timeout = absl::Seconds(10)) {
    if (future_.wait_for(absl::ToChronoSeconds(timeout)) != std::future_status::ready) {
      return absl::DeadlineExceededError("not answered");
    }
    return future_.get();
  }
  bool answered() const {
    return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  uint64_t counter() const { return counter_; }
  const std::vector<float>& values() const { return values_; }
  bool late() const { return late_; }  // the core marked the answer a late push's

 private:
  std::atomic<bool> claimed_{false};
  uint64_t counter_ = 0;
  std::vector<float> values_;
  bool late_ = false;
  std::promise<absl::Status> done_;
  std::shared_future<absl::Status> future_ = done_.get_future().share();
};

}  // namespace summa::server

#endif  // SUMMA_TESTS_FAKE_CALL_H_
