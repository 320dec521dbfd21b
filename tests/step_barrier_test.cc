#include "server/core/step_barrier.h"

#include "gtest/gtest.h"

namespace summa::server {
namespace {

TEST(StepBarrierTest, CompletesWhenEveryRankArrived) {
  StepBarrier barrier(3);
  const absl::Time t0 = absl::FromUnixSeconds(100);
  EXPECT_EQ(*barrier.Arrive(2, t0), false);
  EXPECT_EQ(barrier.first_arrival(), t0);
  EXPECT_EQ(*barrier.Arrive(0, t0 + absl::Seconds(1)), false);
  EXPECT_EQ(barrier.Missing(), std::vector<int>{1});
  EXPECT_EQ(*barrier.Arrive(1, t0 + absl::Seconds(2)), true);
  EXPECT_EQ(barrier.first_arrival(), t0);
  barrier.Reset();
  EXPECT_EQ(barrier.arrived(), 0);
  EXPECT_EQ(barrier.Missing(), (std::vector<int>{0, 1, 2}));
}

TEST(StepBarrierTest, DuplicateAndForeignRanksChangeNothing) {
  StepBarrier barrier(2);
  ASSERT_TRUE(barrier.Arrive(0, absl::Now()).ok());
  EXPECT_EQ(barrier.Arrive(0, absl::Now()).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(barrier.Arrive(2, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(barrier.Arrive(-1, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(barrier.arrived(), 1);
  EXPECT_EQ(*barrier.Arrive(1, absl::Now()), true);
}

}  // namespace
}  // namespace summa::server
