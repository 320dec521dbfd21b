// PlanAgreement: the version a worker rolls a sync job's shards back to when they are more than
// one step apart, and which shards are asked.
#include "gtest/gtest.h"
#include "client/shard_agreement.h"

namespace summa::worker {
namespace {

const std::vector<int> kBoth = {0, 1};

TEST(PlanAgreementTest, TheShardAheadGoesBackToTheRestoredShardsVersion) {
  // Shard 1 was restored at 6; shard 0 ran on to 9 and keeps 4, 6 and 8.
  absl::StatusOr<Agreement> plan = PlanAgreement({{9, {4, 6, 8}}, {6, {2, 4, 6}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 6u);
  EXPECT_EQ(plan->roll_back, kBoth) << "every shard is asked; the one at 6 may hold partitions at 7";
}

TEST(PlanAgreementTest, TheNewestVersionEveryShardCanReachIsTaken) {
  // Shard 1 at 7, shard 2 at 8 keeping 6 and 8, shard 0 at 12 keeping 4 and 6, not 7: all go to 6.
  absl::StatusOr<Agreement> plan = PlanAgreement({{12, {4, 6}}, {7, {4, 6}}, {8, {6, 8}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 6u);
  EXPECT_EQ(plan->roll_back, (std::vector<int>{0, 1, 2}));
  // One step past a version is no longer taken as being at it: the shard at 9 goes back to 8,
  // which it keeps, rather than redoing step 8 on weights of two versions.
  plan = PlanAgreement({{12, {8, 10}}, {9, {8}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version, 8u);
  EXPECT_EQ(plan->roll_back, kBoth);
}

TEST(NeedsAgreementTest, OneStepApartIsAgreementUnlessTheShardBehindWasRestored) {
  EXPECT_FALSE(NeedsAgreement({{7, {}}, {7, {}}}));
  EXPECT_FALSE(NeedsAgreement({{8, {}}, {7, {}}})) << "a push-pull that reached shard 0 only";
  EXPECT_TRUE(NeedsAgreement({{8, {}}, {7, {}, /*restored=*/true}})) << "shard 1 went back to a checkpoint";
  EXPECT_FALSE(NeedsAgreement({{8, {}, /*restored=*/true}, {7, {}}})) << "the restored one is ahead";
  EXPECT_FALSE(NeedsAgreement({{7, {}, true}, {7, {}, true}})) << "restored together";
  EXPECT_TRUE(NeedsAgreement({{9, {}}, {7, {}}}));
}

TEST(PlanAgreementTest, NoCommonVersionIsRefusedNamingWhatEachShardKeeps) {
  // Shard 1 at 9 keeps nothing at or below 9 that shard 0 keeps.
  absl::StatusOr<Agreement> plan = PlanAgreement({{12, {10, 11}}, {9, {4, 5}}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("shard 0 at version 12 keeps checkpoints of versions 10, 11"),
            absl::string_view::npos)
      << plan.status();
  EXPECT_NE(plan.status().message().find("--keep_checkpoints"), absl::string_view::npos);
}

}  // namespace
}  // namespace summa::worker
