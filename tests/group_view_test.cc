// GroupView: the group as a versioned value, and how a step's group follows a newer view.
#include "server/core/group_view.h"

#include "gtest/gtest.h"

namespace summa::server {
namespace {

TEST(GroupViewTest, AStepKeepsTheRanksOfItsViewThatTheNewerViewStillHolds) {
  const GroupView whole = GroupView::Whole(4);
  EXPECT_EQ(whole.ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(whole.view, 0u);
  EXPECT_TRUE(whole.Contains(3));
  EXPECT_FALSE(whole.Contains(4));
  // View 2 lost rank 1 and admitted rank 5: the step that began under view 0 goes on with 0, 2
  // and 3 (the newcomer takes part from the next step).
  const GroupView newer{2, {0, 2, 3, 5}};
  const GroupView step = whole.Narrowed(newer);
  EXPECT_EQ(step.view, 2u);
  EXPECT_EQ(step.ranks, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(step.size(), 3);
  EXPECT_FALSE(step.Contains(5));
  EXPECT_EQ(step.Narrowed(step), step);
}

}  // namespace
}  // namespace summa::server
