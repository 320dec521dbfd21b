// The d2l MLP: its shapes and initialisation, its gradient against finite differences on entries
// of every tensor that move the loss (gradient_check.h), chunked passes, and the model factory.
#include "worker/mlp.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/gradient_check.h"
#include "worker/model.h"

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

TEST(MlpTest, ChunkedPassesSumToTheWholeBatchGradient) {
  auto backend = NewCpuBackend(1);
  auto whole = Mlp::Create(backend.get(), 5);
  auto chunked = Mlp::Create(backend.get(), 5, 2);  // chunks of 2, 2 and 1
  ASSERT_TRUE(whole.ok() && chunked.ok());
  const std::vector<float> w = Mlp::SeedWeights(4);
  std::vector<float> images(5 * 784);
  for (size_t i = 0; i < images.size(); ++i) images[i] = float(i % 97) / 97;
  const std::vector<float> labels = {0, 3, 3, 9, 1};
  std::vector<float> g1(w.size()), g2(w.size());
  for (auto* net : {&*whole, &*chunked}) ASSERT_TRUE((*net)->SetWeights(w.data()).ok());
  const double l1 = *(*whole)->ComputeGradients(images.data(), labels.data(), 5);
  const double l2 = *(*chunked)->ComputeGradients(images.data(), labels.data(), 5);
  EXPECT_NEAR(l1, l2, 1e-5);
  ASSERT_TRUE((*whole)->GetGradients(g1.data()).ok());
  ASSERT_TRUE((*chunked)->GetGradients(g2.data()).ok());
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g1[i], g2[i], 1e-6 + 1e-4 * std::abs(g1[i])) << i;
  EXPECT_EQ(*(*whole)->CountCorrect(images.data(), labels.data(), 5),
            *(*chunked)->CountCorrect(images.data(), labels.data(), 5));
  auto empty = (*whole)->ComputeGradients(nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, 0.0);
  ASSERT_TRUE((*whole)->GetGradients(g1.data()).ok());
  EXPECT_EQ(g1, std::vector<float>(w.size(), 0.0f));
  EXPECT_FALSE((*whole)->ComputeGradients(images.data(), labels.data(), 6).ok());
}

TEST(MlpTest, TheFactoryKnowsEveryModelAndNamesTheChoices) {
  auto backend = NewCpuBackend(1);
  EXPECT_EQ(ModelNames(), (std::vector<std::string>{"lenet", "mlp"}));
  for (const std::string& name : ModelNames()) {
    auto model = NewModel(name, backend.get(), 2);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->name(), name);
    EXPECT_EQ((*model)->image_floats(), 784);
    EXPECT_EQ((*model)->classes(), 10);
    EXPECT_EQ((*model)->num_params(), CountParams(*ModelSpecs(name)));
    EXPECT_EQ(static_cast<int64_t>((*model)->InitialWeights(1).size()), (*model)->num_params());
  }
  const auto unknown = NewModel("vgg", backend.get(), 2);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_EQ(unknown.status().message(), "unknown model 'vgg' (choose one of lenet, mlp)");
  EXPECT_TRUE(absl::IsInvalidArgument(ModelSpecs("vgg").status()));
}

}  // namespace
}  // namespace summa::worker
