#include "server/core/aggregator.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace summa::server {
namespace {

TEST(AggregatorTest, SumsIntegerValuedGradientsExactly) {
  Aggregator agg(4);
  agg.Add(0, std::vector<float>{1, 2, 3, 4}, 10);
  agg.Add(0, std::vector<float>{10, 20, 30, 40}, 5);
  agg.Add(0, std::vector<float>{-1, 0, 100, 7}, 1);
  EXPECT_EQ(std::vector<float>(agg.sum().begin(), agg.sum().end()),
            (std::vector<float>{10, 22, 133, 51}));
  EXPECT_EQ(agg.num_examples(), 16);
  EXPECT_EQ(agg.contributions(), 3);
}

TEST(AggregatorTest, ResetStartsTheNextStepFromTheFirstPush) {
  Aggregator agg(2);
  agg.Add(0, std::vector<float>{5, 5}, 3);
  agg.Reset();
  EXPECT_EQ(agg.contributions(), 0);
  EXPECT_EQ(agg.num_examples(), 0);
  agg.Add(0, std::vector<float>{1, 2}, 2);
  EXPECT_EQ(std::vector<float>(agg.sum().begin(), agg.sum().end()), (std::vector<float>{1, 2}));
  EXPECT_EQ(agg.num_examples(), 2);
}

std::vector<float> Sum(const Aggregator& agg) { return {agg.sum().begin(), agg.sum().end()}; }

// Three pushes whose float sum depends on the order they are added in: 1e8 + 1 rounds to 1e8.
const std::vector<std::vector<float>> kOrderSensitive = {{1.0f, 3.0f}, {1e8f, -1e8f}, {-1e8f, 1e8f}};
const std::vector<std::vector<int>> kArrivalOrders = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                                      {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

std::vector<float> SumInOrder(Aggregator& agg, const std::vector<int>& order) {
  agg.Reset();
  for (int rank : order) agg.Add(rank, kOrderSensitive[rank], 1);
  agg.Finish();
  return Sum(agg);
}

TEST(AggregatorTest, DeterministicSumIsTheSameBitsInEveryArrivalOrder) {
  Aggregator agg(2, /*ranks=*/3);
  ASSERT_TRUE(agg.deterministic());
  // Rank order: (1 + 1e8) - 1e8 = 0 and (3 - 1e8) + 1e8 = 0.
  for (const std::vector<int>& order : kArrivalOrders) {
    EXPECT_EQ(SumInOrder(agg, order), (std::vector<float>{0, 0})) << order[0] << order[1] << order[2];
    EXPECT_EQ(agg.contributions(), 3);
    EXPECT_EQ(agg.num_examples(), 3);
  }
}

// What the deterministic mode is for: summed on arrival, the same pushes give other bits.
TEST(AggregatorTest, SumOnArrivalDependsOnTheArrivalOrder) {
  Aggregator agg(2);
  ASSERT_FALSE(agg.deterministic());
  EXPECT_EQ(SumInOrder(agg, {0, 1, 2}), (std::vector<float>{0, 0}));
  EXPECT_EQ(SumInOrder(agg, {1, 2, 0}), (std::vector<float>{1, 3}));
}

TEST(AggregatorTest, DeterministicSumSkipsRanksThatDidNotPushAndZeroesNonFinite) {
  Aggregator agg(2, /*ranks=*/3);
  agg.Add(2, std::vector<float>{5, std::numeric_limits<float>::infinity()}, 4, /*zero_nonfinite=*/true);
  agg.Add(0, std::vector<float>{1, 2}, 1);
  agg.Finish();
  EXPECT_EQ(Sum(agg), (std::vector<float>{6, 2}));
  EXPECT_EQ(agg.num_examples(), 5);
  // A rank that pushed last step and not this one adds nothing.
  agg.Reset();
  agg.Add(1, std::vector<float>{7, 8}, 1);
  agg.Finish();
  EXPECT_EQ(Sum(agg), (std::vector<float>{7, 8}));
}

}  // namespace
}  // namespace summa::server
