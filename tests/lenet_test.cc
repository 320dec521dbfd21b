// LeNet as a whole: the seed's shapes and initialisation, and its gradient against finite
// differences on entries of every tensor that move the loss (gradient_check.h).
#include "worker/models/lenet.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/gradient_check.h"

namespace summa::worker {
namespace {

TEST(LeNetTest, ShapesAndInitialisationFollowTheSeed) {
  const auto specs = LeNet::Specs();
  ASSERT_EQ(specs.size(), 8u);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{20, 1, 3, 3}));
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{50, 20, 5, 5}));
  EXPECT_EQ(specs[4].shape, (std::vector<int64_t>{800, 128}));
  EXPECT_EQ(specs[6].shape, (std::vector<int64_t>{128, 10}));
  EXPECT_EQ(LeNet::NumParams(), 180 + 20 + 25000 + 50 + 102400 + 128 + 1280 + 10);
  const std::vector<float> w = LeNet::SeedWeights(7);
  EXPECT_EQ(w, LeNet::SeedWeights(7));
  EXPECT_NE(w, LeNet::SeedWeights(8));
  // W3 [800,128] starts at 180 + 20 + 25000 + 50: its values have std 0.01; b3 after it is zero.
  double sum2 = 0;
  for (int i = 25250; i < 25250 + 102400; ++i) sum2 += double(w[i]) * w[i];
  EXPECT_NEAR(std::sqrt(sum2 / 102400), 0.01, 0.0005);
  for (int i = 25250 + 102400; i < 25250 + 102400 + 128; ++i) ASSERT_EQ(w[i], 0.0f);
}

TEST(LeNetTest, GradientMatchesFiniteDifferencesThroughEveryLayer) {
  auto backend = NewCpuBackend(1);
  auto net = LeNet::Create(backend.get(), 3);
  ASSERT_TRUE(net.ok()) << net.status();
  // Larger weights than the seed's so that every layer's signal is well above float noise.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0, 0.3f);
  std::vector<float> w(LeNet::NumParams());
  for (float& v : w) v = normal(rng);
  std::vector<float> images(3 * 784);
  std::uniform_real_distribution<float> pixel(0, 1);
  for (float& p : images) p = pixel(rng);
  // Gradients reach tens here and a step of 1e-2 crosses a few ReLU kinks (up to ~5% off);
  // smaller steps drown in the float loss's noise.
  ExpectGradientMatchesFiniteDifferences(**net, w, images, {1, 7, 4},
                                         {/*eps=*/1e-2, /*absolute=*/2e-2, /*relative=*/8e-2});
}

TEST(LeNetTest, EmptyShardGivesZeroGradient) {
  auto backend = NewCpuBackend(1);
  auto net = LeNet::Create(backend.get(), 2);
  ASSERT_TRUE(net.ok());
  const std::vector<float> w = LeNet::SeedWeights(1);
  ASSERT_TRUE((*net)->SetWeights(w.data()).ok());
  std::vector<float> images(2 * 784, 0.5f);
  ASSERT_TRUE(GradientsAndLoss(**net, images.data(), std::vector<float>{1, 2}.data(), 2).ok());
  auto loss = GradientsAndLoss(**net, nullptr, nullptr, 0);
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(*loss, 0.0);
  std::vector<float> grad(w.size(), 1.0f);
  ASSERT_TRUE((*net)->GetGradients(grad.data()).ok());
  EXPECT_EQ(grad, std::vector<float>(w.size(), 0.0f));
  EXPECT_FALSE(GradientsAndLoss(**net, images.data(), std::vector<float>{1, 2, 3}.data(), 3).ok());
}

}  // namespace
}  // namespace summa::worker
