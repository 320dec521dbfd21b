#include "server/aggregator.h"

#include <vector>

#include "gtest/gtest.h"

namespace summa::server {
namespace {

TEST(AggregatorTest, SumsIntegerValuedGradientsExactly) {
  Aggregator agg(4);
  agg.Add(std::vector<float>{1, 2, 3, 4}, 10);
  agg.Add(std::vector<float>{10, 20, 30, 40}, 5);
  agg.Add(std::vector<float>{-1, 0, 100, 7}, 1);
  EXPECT_EQ(std::vector<float>(agg.sum().begin(), agg.sum().end()),
            (std::vector<float>{10, 22, 133, 51}));
  EXPECT_EQ(agg.num_examples(), 16);
  EXPECT_EQ(agg.contributions(), 3);
}

TEST(AggregatorTest, ResetStartsTheNextStepFromTheFirstPush) {
  Aggregator agg(2);
  agg.Add(std::vector<float>{5, 5}, 3);
  agg.Reset();
  EXPECT_EQ(agg.contributions(), 0);
  EXPECT_EQ(agg.num_examples(), 0);
  agg.Add(std::vector<float>{1, 2}, 2);
  EXPECT_EQ(std::vector<float>(agg.sum().begin(), agg.sum().end()), (std::vector<float>{1, 2}));
  EXPECT_EQ(agg.num_examples(), 2);
}

}  // namespace
}  // namespace summa::server
