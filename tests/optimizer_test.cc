#include "server/optimizer.h"

#include <vector>

#include "gtest/gtest.h"

namespace summa::server {
namespace {

TEST(OptimizerTest, PlainSgdDividesBySummedExamples) {
  SgdOptimizer sgd({.learning_rate = 0.5});
  std::vector<float> w = {10, 20};
  std::vector<float> v;
  sgd.Apply(absl::MakeSpan(w), absl::MakeSpan(v), std::vector<float>{8, -4}, 4);
  // w -= 0.5 * g / 4
  EXPECT_EQ(w, (std::vector<float>{9, 20.5}));
}

TEST(OptimizerTest, MomentumAndWeightDecayFollowPyTorch) {
  SgdOptimizer sgd({.learning_rate = 1.0, .momentum = 0.5, .weight_decay = 0.25});
  std::vector<float> w = {4};
  std::vector<float> v = {0};
  sgd.Apply(absl::MakeSpan(w), absl::MakeSpan(v), std::vector<float>{2}, 1);
  // d = 2 + 0.25*4 = 3; v = 3; w = 4 - 3 = 1
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(w[0], 1);
  sgd.Apply(absl::MakeSpan(w), absl::MakeSpan(v), std::vector<float>{4}, 2);
  // d = 2 + 0.25*1 = 2.25; v = 1.5 + 2.25 = 3.75; w = 1 - 3.75
  EXPECT_EQ(v[0], 3.75f);
  EXPECT_EQ(w[0], -2.75f);
}

TEST(OptimizerTest, ZeroExamplesLeavesWeightsAlone) {
  SgdOptimizer sgd({.learning_rate = 1.0});
  std::vector<float> w = {3};
  std::vector<float> v;
  sgd.Apply(absl::MakeSpan(w), absl::MakeSpan(v), std::vector<float>{100}, 0);
  EXPECT_EQ(w[0], 3);
}

TEST(OptimizerTest, ValidateRefusesNonsense) {
  EXPECT_TRUE(SgdOptimizer::Validate({.learning_rate = 0.2}).ok());
  EXPECT_FALSE(SgdOptimizer::Validate({.learning_rate = -1}).ok());
  EXPECT_FALSE(SgdOptimizer::Validate({.learning_rate = 0.1, .momentum = 1.0}).ok());
  EXPECT_FALSE(SgdOptimizer::Validate({.learning_rate = 0.1, .weight_decay = -0.1}).ok());
}

}  // namespace
}  // namespace summa::server
