#include "server/aggregator.h"

#include <cmath>
#include <cstring>

#include "common/vector_ops.h"

namespace summa::server {

Aggregator::Aggregator(int64_t length) : sum_(length, 0.0f) {}

void Aggregator::Add(absl::Span<const float> gradient, int64_t num_examples, bool zero_nonfinite) {
  if (zero_nonfinite) {
    float* s = sum_.data();
    const float* g = gradient.data();
    const bool first = contributions_ == 0;
    for (size_t i = 0, n = sum_.size(); i < n; ++i) {
      const float v = std::isfinite(g[i]) ? g[i] : 0.0f;
      s[i] = first ? v : s[i] + v;
    }
  } else if (contributions_ == 0) {
    std::memcpy(sum_.data(), gradient.data(), sum_.size() * sizeof(float));
  } else {
    AddInto(absl::MakeSpan(sum_), gradient);
  }
  num_examples_ += num_examples;
  ++contributions_;
}

void Aggregator::Reset() {
  num_examples_ = 0;
  contributions_ = 0;
}

}  // namespace summa::server
