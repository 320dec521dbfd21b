// Test helper: a model's analytic gradient against central finite differences of its loss, on
// entries of every tensor that matter. Per tensor it checks the entries with the largest
// analytic gradient (so a tensor whose gradient is right only where it is zero cannot pass) and a
// few seeded random ones (so a gradient that is wrongly zero where it should be large cannot
// pass either), and it requires several of the checked entries to move the loss well beyond the
// absolute tolerance. A wrong or missing gradient is off by about 100%: the tolerances only need
// to cover float noise (a small step) and ReLU kinks crossed (a large one).
#ifndef SUMMA_TESTS_GRADIENT_CHECK_H_
#define SUMMA_TESTS_GRADIENT_CHECK_H_

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/models/model.h"

namespace summa::worker {

struct GradientTolerance {
  double eps = 1e-2;       // the finite-difference step
  double absolute = 2e-3;  // allowed |analytic - numeric| besides the relative part
  double relative = 2e-2;  // of |numeric|
};

inline void ExpectGradientMatchesFiniteDifferences(Model& model, const std::vector<float>& w,
                                                   const std::vector<float>& images,
                                                   const std::vector<float>& labels,
                                                   GradientTolerance tol = {}) {
  const int n = static_cast<int>(labels.size());
  ASSERT_TRUE(model.SetWeights(w.data()).ok());
  ASSERT_TRUE(GradientsAndLoss(model, images.data(), labels.data(), n).ok());
  std::vector<float> grad(w.size());
  ASSERT_TRUE(model.GetGradients(grad.data()).ok());

  std::vector<float> probe = w;
  auto loss_at = [&](int64_t i, double value) {
    probe[i] = static_cast<float>(value);
    EXPECT_TRUE(model.SetWeights(probe.data()).ok());
    const double loss = *GradientsAndLoss(model, images.data(), labels.data(), n);
    probe[i] = w[i];
    return loss;
  };
  std::mt19937_64 rng(17);
  int64_t offset = 0;
  for (const TensorSpec& s : model.specs()) {
    const int64_t size = s.num_elements();
    std::vector<int64_t> order(size);
    std::iota(order.begin(), order.end(), 0);
    const int64_t top = std::min<int64_t>(4, size);
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t b) {
      return std::abs(grad[offset + a]) > std::abs(grad[offset + b]);
    });
    std::vector<int64_t> entries(order.begin(), order.begin() + top);
    std::uniform_int_distribution<int64_t> any(0, size - 1);
    for (int k = 0; k < 3; ++k) entries.push_back(any(rng));
    int moving = 0;
    for (int64_t e : entries) {
      const int64_t i = offset + e;
      const double numeric =
          (loss_at(i, w[i] + tol.eps) - loss_at(i, w[i] - tol.eps)) / (2 * tol.eps);
      if (std::abs(numeric) > 5 * tol.absolute) ++moving;
      EXPECT_NEAR(grad[i], numeric, tol.absolute + tol.relative * std::abs(numeric))
          << s.name << "[" << e << "]";
    }
    EXPECT_GE(moving, 3) << s.name << ": too few checked entries move the loss to test anything";
    offset += size;
  }
}

}  // namespace summa::worker

#endif  // SUMMA_TESTS_GRADIENT_CHECK_H_
