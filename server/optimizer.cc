#include "server/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace summa::server {

absl::Status SgdOptimizer::Validate(const SgdOptions& o) {
  if (!std::isfinite(o.learning_rate) || o.learning_rate < 0) {
    return absl::InvalidArgumentError(absl::StrCat("learning rate ", o.learning_rate,
                                                   " must be finite and not negative"));
  }
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("momentum ", o.momentum, " must be in [0, 1)"));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    return absl::InvalidArgumentError(absl::StrCat("weight decay ", o.weight_decay,
                                                   " must be finite and not negative"));
  }
  return absl::OkStatus();
}

void SgdOptimizer::Apply(absl::Span<float> weights, absl::Span<float> velocity,
                         absl::Span<const float> grad_sum, int64_t num_examples) const {
  if (num_examples <= 0) return;
  const float scale = static_cast<float>(1.0 / static_cast<double>(num_examples));
  const float lr = static_cast<float>(options_.learning_rate);
  const float wd = static_cast<float>(options_.weight_decay);
  const float mu = static_cast<float>(options_.momentum);
  const size_t n = weights.size();
  float* w = weights.data();
  const float* g = grad_sum.data();
  if (mu == 0.0f) {
    for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] * scale + wd * w[i]);
    return;
  }
  float* v = velocity.data();
  for (size_t i = 0; i < n; ++i) {
    v[i] = mu * v[i] + (g[i] * scale + wd * w[i]);
    w[i] -= lr * v[i];
  }
}

std::string SgdOptimizer::Describe() const {
  return absl::StrCat("sgd(lr=", options_.learning_rate, ", momentum=", options_.momentum,
                      ", weight_decay=", options_.weight_decay, ")");
}

}  // namespace summa::server
