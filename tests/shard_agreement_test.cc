// PlanAgreement: the version a worker rolls a sync job's shards back to when they are more than
// one step apart, and which shards go back.
#include "gtest/gtest.h"
#include "worker/ps_client.h"

namespace summa::worker {
namespace {

TEST(PlanAgreementTest, ShardsOneStepApartNeedNoRollback) {
  absl::StatusOr<Agreement> plan = PlanAgreement({{7, {}}, {8, {}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 7u);
  EXPECT_TRUE(plan->roll_back.empty());
}

TEST(PlanAgreementTest, TheShardAheadGoesBackToTheRestoredShardsVersion) {
  // Shard 1 was restored at 6; shard 0 ran on to 9 and keeps 4, 6 and 8.
  absl::StatusOr<Agreement> plan = PlanAgreement({{9, {4, 6, 8}}, {6, {2, 4, 6}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 6u);
  EXPECT_EQ(plan->roll_back, (std::vector<int>{0}));
}

TEST(PlanAgreementTest, TheNewestVersionEveryShardCanReachIsTaken) {
  // Shard 1 at 7 and shard 2 at 8 agree on 7; shard 0 at 12 keeps 4 and 6, not 7: all go to 6,
  // shard 2 as well (6 is neither its version nor the one before).
  absl::StatusOr<Agreement> plan = PlanAgreement({{12, {4, 6}}, {7, {4, 6}}, {8, {6, 8}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 6u);
  EXPECT_EQ(plan->roll_back, (std::vector<int>{0, 2}));
  // One step behind the lowest is as good as its own version: 8 and 9 agree on 8 with a
  // checkpoint of 8 at the shard at 12.
  plan = PlanAgreement({{12, {8, 10}}, {9, {}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 9u - 1);
  EXPECT_EQ(plan->roll_back, (std::vector<int>{0}));
}

TEST(PlanAgreementTest, NoCommonVersionIsRefusedNamingWhatEachShardKeeps) {
  absl::StatusOr<Agreement> plan = PlanAgreement({{12, {10, 11}}, {5, {4, 5}}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("shard 0 at version 12 keeps checkpoints of versions 10, 11"),
            absl::string_view::npos)
      << plan.status();
  EXPECT_NE(plan.status().message().find("--keep_checkpoints"), absl::string_view::npos);
}

}  // namespace
}  // namespace summa::worker
