// ReplyTurns (server/rpc/reply_turns.h): a worker's replies one at a time, the earliest
// partition first; other workers' not held up; a reply stalled ahead held up for no more than
// kLongestWait.
#include "server/rpc/reply_turns.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace summa::server {
namespace {

TEST(ReplyTurnsTest, WaitingRepliesGoTheEarliestPartitionFirstAndOtherWorkersAreNotHeldUp) {
  ReplyTurns turns;
  std::vector<int64_t> order;
  absl::Mutex mu;
  {
    ReplyTurns::Turn first = turns.Take("rank 0 session 1", 9);
    // Another worker's reply goes while rank 0's is written.
    { ReplyTurns::Turn other = turns.Take("rank 1 session 2", 5); }
    std::vector<std::thread> waiting;
    for (int64_t p : {7, 3, 5}) {
      waiting.emplace_back([&, p] {
        ReplyTurns::Turn t = turns.Take("rank 0 session 1", p);
        absl::MutexLock lock(&mu);
        order.push_back(p);
      });
      while (turns.waiting() < static_cast<int64_t>(waiting.size())) absl::SleepFor(absl::Milliseconds(1));
    }
    first = ReplyTurns::Turn();  // written: the earliest waiting goes next
    for (std::thread& t : waiting) t.join();
  }
  EXPECT_EQ(order, (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(turns.waiting(), 0);
}

TEST(ReplyTurnsTest, AReplyStalledAheadHoldsTheNextUpForNoLongerThanTheLongestWait) {
  ReplyTurns turns;
  ReplyTurns::Turn stalled = turns.Take("rank 0 session 1", 0);  // never let go in this test
  const absl::Time start = absl::Now();
  { ReplyTurns::Turn late = turns.Take("rank 0 session 1", 1); }
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, ReplyTurns::kLongestWait);
  EXPECT_LT(waited, ReplyTurns::kLongestWait + absl::Seconds(30));  // it came back at all
  EXPECT_EQ(turns.waiting(), 0);
}

}  // namespace
}  // namespace summa::server
