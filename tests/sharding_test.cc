#include "worker/sharding.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace summa::worker {
namespace {

TEST(ShardingTest, EpochOrderIsAPermutationSharedByEveryProcess) {
  const auto a = EpochOrder(1000, 42, 3);
  EXPECT_EQ(a, EpochOrder(1000, 42, 3));
  EXPECT_NE(a, EpochOrder(1000, 42, 4));
  EXPECT_NE(a, EpochOrder(1000, 43, 3));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
}

TEST(ShardingTest, ShardsTileEveryBatchIncludingUnevenAndShortOnes) {
  const int64_t count = 1000, batch = 64;  // 15 full batches and one of 40
  EXPECT_EQ(StepsPerEpoch(count, batch), 16);
  for (int world : {1, 2, 3, 5, 7}) {
    for (int64_t step = 0; step < 16; ++step) {
      int64_t expect_begin = step * batch;
      int64_t smallest = batch, largest = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = ShardOf(count, batch, step, r, world);
        EXPECT_EQ(s.begin, expect_begin) << world << " " << step << " " << r;
        expect_begin = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      EXPECT_EQ(expect_begin, std::min(count, (step + 1) * batch));
      EXPECT_LE(largest - smallest, 1) << "shards differ by at most one example";
    }
  }
  // The seed's rule: rank r of N takes [r*b/N, (r+1)*b/N) of the last batch (b = 40).
  const ShardRange last = ShardOf(count, batch, 15, 2, 3);
  EXPECT_EQ(last.begin, 960 + 2 * 40 / 3);
  EXPECT_EQ(last.end, 1000);
}

}  // namespace
}  // namespace summa::worker
