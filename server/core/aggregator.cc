#include "server/core/aggregator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/vector_ops.h"

namespace summa::server {
namespace {

// to = from (first) or to += from, NaN and infinity counted as zero when `zero_nonfinite`.
void CopyOrAdd(absl::Span<const float> from, absl::Span<float> to, bool first, bool zero_nonfinite) {
  if (zero_nonfinite) {
    // The shared-memory plane sums every push this way (PushRequestView::shared).
    if (first) {
      CopyFiniteOrZero(to, from);
    } else {
      AddFiniteOrZero(to, from);
    }
  } else if (first) {
    std::memcpy(to.data(), from.data(), to.size() * sizeof(float));
  } else {
    AddInto(to, from);
  }
}

}  // namespace

Aggregator::Aggregator(int64_t length, int ranks)
    : sum_(length, 0.0f), slots_(static_cast<size_t>(std::max(ranks, 0)) * length, 0.0f),
      kept_(std::max(ranks, 0), false) {}

void Aggregator::Add(int rank, absl::Span<const float> gradient, int64_t num_examples,
                     bool zero_nonfinite) {
  if (deterministic()) {
    absl::Span<float> slot = absl::MakeSpan(slots_).subspan(rank * sum_.size(), sum_.size());
    CopyOrAdd(gradient, slot, /*first=*/true, zero_nonfinite);
    kept_[rank] = true;
  } else {
    CopyOrAdd(gradient, absl::MakeSpan(sum_), contributions_ == 0, zero_nonfinite);
  }
  num_examples_ += num_examples;
  ++contributions_;
}

void Aggregator::Finish() {
  bool first = true;
  for (size_t r = 0; r < kept_.size(); ++r) {
    if (!kept_[r]) continue;
    CopyOrAdd(absl::MakeConstSpan(slots_).subspan(r * sum_.size(), sum_.size()), absl::MakeSpan(sum_),
              first, /*zero_nonfinite=*/false);
    first = false;
  }
}

void Aggregator::Reset() {
  num_examples_ = 0;
  contributions_ = 0;
  std::fill(kept_.begin(), kept_.end(), false);
}

}  // namespace summa::server
