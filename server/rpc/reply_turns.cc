#include "server/rpc/reply_turns.h"

namespace summa::server {

ReplyTurns::Turn& ReplyTurns::Turn::operator=(Turn&& other) noexcept {
  if (this != &other) {
    Release();
    turns_ = std::exchange(other.turns_, nullptr);
    worker_ = std::move(other.worker_);
  }
  return *this;
}

void ReplyTurns::Turn::Release() {
  if (turns_ != nullptr) std::exchange(turns_, nullptr)->Release(worker_);
}

ReplyTurns::Turn ReplyTurns::Take(const std::string& worker, int64_t partition) {
  absl::MutexLock lock(&mu_);
  Queue& q = queues_[worker];
  const std::pair<int64_t, uint64_t> mine = {partition, arrivals_++};
  q.waiting.insert(mine);
  ++waiting_;
  const absl::Time deadline = absl::Now() + kLongestWait;
  while (q.writing || *q.waiting.begin() != mine) {
    if (turned_.WaitWithDeadline(&mu_, deadline) && (q.writing || *q.waiting.begin() != mine)) {
      q.waiting.erase(mine);  // out of order: the queue stays (another holds or waits for it)
      --waiting_;
      turned_.SignalAll();  // the next earliest may be free to go now
      return Turn();
    }
  }
  q.waiting.erase(q.waiting.begin());
  --waiting_;
  q.writing = true;
  return Turn(this, worker);
}

void ReplyTurns::Release(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(worker);
  it->second.writing = false;
  if (it->second.waiting.empty()) {
    queues_.erase(it);
  } else {
    turned_.SignalAll();  // the earliest of them goes (one CondVar for every worker: few wait)
  }
}

int64_t ReplyTurns::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

}  // namespace summa::server
