// The check that model parallelism keeps the math: LeNet split across two backends
// (worker/models/pipeline.h) against LeNet whole on one, on the same random batch and weights. Shared by
// pipeline_test (CPU backends) and cuda_backend_test (GPUs).
#ifndef SUMMA_TESTS_SPLIT_CHECK_H_
#define SUMMA_TESTS_SPLIT_CHECK_H_

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/models/lenet.h"
#include "worker/models/pipeline.h"

namespace summa::worker::testing_split {

struct Batch {
  std::vector<float> images, labels;
};

inline Batch RandomBatch(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pixel(0, 1);
  Batch b;
  b.images.resize(int64_t{n} * LeNet::kImageFloats);
  for (float& p : b.images) p = pixel(rng);
  for (int i = 0; i < n; ++i) b.labels.push_back(static_cast<float>(rng() % LeNet::kClasses));
  return b;
}

// Weights larger than the seed's, so that every layer's gradient is well above float noise.
inline std::vector<float> Weights() {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0, 0.1f);
  std::vector<float> w(LeNet::NumParams());
  for (float& v : w) v = normal(rng);
  return w;
}

struct Result {
  std::vector<float> gradient;
  double loss = 0;
  int64_t correct = 0;
};

// One step of `model` on the first n examples: its gradient, summed loss and correct count.
inline Result Step(Model& model, const std::vector<float>& w, const Batch& b, int n) {
  Result r;
  EXPECT_TRUE(model.SetWeights(w.data()).ok());
  absl::StatusOr<double> loss = GradientsAndLoss(model, b.images.data(), b.labels.data(), n);
  EXPECT_TRUE(loss.ok()) << loss.status();
  r.loss = loss.value_or(-1);
  r.gradient.resize(LeNet::NumParams());
  EXPECT_TRUE(model.GetGradients(r.gradient.data()).ok());
  absl::StatusOr<int64_t> correct = model.CountCorrect(b.images.data(), b.labels.data(), n);
  EXPECT_TRUE(correct.ok()) << correct.status();
  r.correct = correct.value_or(-1);
  return r;
}

// `split`'s step against `want` (one device's): gradient within 1e-5 of want's largest value,
// loss within 1e-5 of itself, the same predictions.
inline ::testing::AssertionResult SameStep(const Result& want, const Result& got) {
  float largest = 0;
  for (float g : want.gradient) largest = std::max(largest, std::abs(g));
  if (got.gradient.size() != want.gradient.size()) return ::testing::AssertionFailure() << "gradient sizes differ";
  for (size_t i = 0; i < got.gradient.size(); ++i) {
    if (std::abs(got.gradient[i] - want.gradient[i]) > 1e-5f * largest) {
      return ::testing::AssertionFailure() << "parameter " << i << ": " << got.gradient[i] << " against "
                                           << want.gradient[i] << " (largest " << largest << ")";
    }
  }
  if (std::abs(got.loss - want.loss) > 1e-5 * want.loss) {
    return ::testing::AssertionFailure() << "loss " << got.loss << " against " << want.loss;
  }
  if (got.correct != want.correct) {
    return ::testing::AssertionFailure() << got.correct << " correct against " << want.correct;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace summa::worker::testing_split

#endif  // SUMMA_TESTS_SPLIT_CHECK_H_
