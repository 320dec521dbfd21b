#include "client/step_exchange.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace summa::worker {

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

StepExchange::StepExchange(ParameterClient* client) : client_(client), thread_([this] { Run(); }) {}

StepExchange::~StepExchange() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (calls_running_) client_->WakeStaged();
  }
  thread_.join();
}

absl::Status StepExchange::Begin(uint64_t step, int64_t num_examples, const float* gradients, float* weights) {
  absl::MutexLock lock(&mu_);
  if (active_) return absl::FailedPreconditionError(absl::StrCat("step ", step, " begun before step ", step_, " finished"));
  // The thread is idle (the last step finished): the client is the caller's until active_.
  if (absl::Status begun = client_->BeginStaged(step, num_examples, gradients, weights); !begun.ok()) return begun;
  const size_t n = client_->partitions().size();
  step_ = step;
  named_.assign(n, 0);
  done_.assign(n, 0);
  times_.assign(n, Times{});
  ready_.clear();
  ready_.reserve(n);
  error_ = absl::OkStatus();
  active_ = true;
  return absl::OkStatus();
}

void StepExchange::MarkReady(size_t i) {
  if (!active_) return;
  if (i >= named_.size()) {
    if (error_.ok()) error_ = absl::OutOfRangeError(absl::StrCat("partition ", i, " of ", named_.size()));
    return;
  }
  if (named_[i]) {
    if (error_.ok()) {
      error_ = absl::FailedPreconditionError(
          absl::StrCat("partition ", i, " was made ready twice in step ", step_, " (a bucket pushed twice)"));
    }
    return;
  }
  named_[i] = 1;
  times_[i].ready_ns = NowNs();
  ready_.push_back(i);
  if (calls_running_) client_->WakeStaged();
}

void StepExchange::Ready(size_t i) {
  absl::MutexLock lock(&mu_);
  MarkReady(i);
}

void StepExchange::ReadyAll() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < named_.size(); ++i) {
    if (!named_[i]) MarkReady(i);
  }
}

absl::Status StepExchange::Wait(size_t i) {
  absl::MutexLock lock(&mu_);
  if (!active_) return absl::OkStatus();
  if (i >= done_.size()) return absl::OutOfRangeError(absl::StrCat("partition ", i, " of ", done_.size()));
  struct Partition {
    StepExchange* exchange;
    size_t i;
  } waited{this, i};
  mu_.Await(absl::Condition(
      +[](Partition* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !p->exchange->error_.ok() || p->exchange->done_[p->i]; },
      &waited));
  return error_;
}

std::vector<int> StepExchange::live_ranks(size_t i) const {
  absl::MutexLock lock(&mu_);
  // A partition's call that ended OK is not started again in this step.
  if (!active_ || i >= done_.size() || !done_[i] || !error_.ok()) return {};
  return client_->staged_live_ranks_of(i);
}

absl::Status StepExchange::Finish(std::vector<int>* live_ranks) {
  absl::MutexLock lock(&mu_);
  if (!active_) return absl::OkStatus();
  std::vector<size_t> never;
  for (size_t i = 0; i < named_.size(); ++i) {
    if (!named_[i]) never.push_back(i);
  }
  if (!never.empty() && error_.ok()) {
    error_ = absl::FailedPreconditionError(absl::StrCat("partition(s) ", absl::StrJoin(never, ", "),
                                                        " never made ready in step ", step_, " (buckets never pushed)"));
  }
  // Every started call ends (each has a deadline); partitions never named are never started.
  mu_.Await(absl::Condition(
      +[](StepExchange* e) ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->ready_.empty() && !e->starting_ && !e->calls_running_; },
      this));
  active_ = false;
  if (live_ranks != nullptr) *live_ranks = client_->staged_live_ranks();
  return error_;
}

bool StepExchange::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

std::vector<StepExchange::Times> StepExchange::timeline() const {
  absl::MutexLock lock(&mu_);
  return times_;
}

void StepExchange::Run() {
  std::vector<size_t> starting;
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](StepExchange* e) ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->stop_ || !e->ready_.empty() || e->calls_running_; },
        this));
    if (stop_ && ready_.empty() && !calls_running_) return;
    if (!ready_.empty()) {
      // The first layers' partitions first: the next forward waits for them first.
      starting.swap(ready_);
      std::sort(starting.begin(), starting.end());
      starting_ = true;
      const int64_t now = NowNs();
      for (size_t i : starting) times_[i].start_ns = now;
      mu_.Unlock();
      for (size_t i : starting) client_->StartStaged(i);
      mu_.Lock();
      starting.clear();
      starting_ = false;
      calls_running_ = client_->staged_in_flight() > 0;
      continue;  // more may have been made ready meanwhile
    }
    // Calls are running and nothing waits to start: collect one (Ready wakes this).
    mu_.Unlock();
    size_t i = 0;
    absl::Status status;
    const bool ended = client_->NextStaged(&i, &status);
    mu_.Lock();
    if (ended) {
      times_[i].end_ns = NowNs();
      done_[i] = 1;
      if (!status.ok() && error_.ok()) error_ = std::move(status);
    }
    calls_running_ = client_->staged_in_flight() > 0;
  }
}

}  // namespace summa::worker
