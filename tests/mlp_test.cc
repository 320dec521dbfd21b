// The d2l MLP: its shapes and initialisation, its gradient against finite differences on entries
// of every tensor that move the loss (gradient_check.h), chunked passes, and the model factory.
#include "worker/models/mlp.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/gradient_check.h"
#include "worker/models/model.h"

namespace summa::worker {
namespace {

TEST(MlpTest, ShapesAndInitialisationFollowD2l) {
  const auto specs = Mlp::Specs();
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{784, 256}));
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{256, 10}));
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(Mlp::NumParams(), 784 * 256 + 256 + 2560 + 10);
  const std::vector<float> w = Mlp::SeedWeights(7);
  ASSERT_EQ(static_cast<int64_t>(w.size()), Mlp::NumParams());
  EXPECT_EQ(w, Mlp::SeedWeights(7));
  EXPECT_NE(w, Mlp::SeedWeights(8));
  double sum2 = 0;
  for (int i = 0; i < 784 * 256; ++i) sum2 += double(w[i]) * w[i];
  EXPECT_NEAR(std::sqrt(sum2 / (784 * 256)), 0.01, 0.0002);
  for (int i = 784 * 256; i < 784 * 256 + 256; ++i) ASSERT_EQ(w[i], 0.0f) << "b1";
  for (int64_t i = Mlp::NumParams() - 10; i < Mlp::NumParams(); ++i) ASSERT_EQ(w[i], 0.0f) << "b2";
}

TEST(MlpTest, GradientMatchesFiniteDifferencesThroughEveryLayer) {
  auto backend = NewCpuBackend(1);
  auto net = Mlp::Create(backend.get(), 3);
  ASSERT_TRUE(net.ok()) << net.status();
  // Larger weights than the seed's, small enough that the softmax does not saturate.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0, 0.05f);
  std::vector<float> w(Mlp::NumParams());
  for (float& v : w) v = normal(rng);
  std::vector<float> images(3 * 784);
  std::uniform_real_distribution<float> pixel(0, 1);
  for (float& p : images) p = pixel(rng);
  ExpectGradientMatchesFiniteDifferences(**net, w, images, {1, 7, 4});
}

}  // namespace
}  // namespace summa::worker
