// Clock: where the server core and the AllReduce hub read the time, so that tests of leases,
// deadlines and staleness advance a FakeClock instead of sleeping (leveldb's Env idea, for time
// only). Both implementations are thread-safe.
#ifndef SUMMA_COMMON_CLOCK_H_
#define SUMMA_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace summa {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The process's real clock; never freed.
  static const Clock* Real();
};

// A clock that moves only when told to. Starts at the Unix epoch plus one day, so that
// "InfinitePast" and "a lease ago" never collide.
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::UnixEpoch() + absl::Hours(24);
};

}  // namespace summa

#endif  // SUMMA_COMMON_CLOCK_H_
