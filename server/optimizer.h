// SgdOptimizer: the seed's update, w -= lr * g_sum / examples, with PyTorch's optional momentum
// and weight decay (decay is added to the mean gradient before momentum). Stateless apart from
// its options: the caller owns the weights and the velocity. Thread-safe (const).
#ifndef SUMMA_SERVER_OPTIMIZER_H_
#define SUMMA_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace summa::server {

struct SgdOptions {
  double learning_rate = 0.1;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

class SgdOptimizer {
 public:
  explicit SgdOptimizer(SgdOptions options) : options_(options) {}

  // Rejects a negative or non-finite rate, momentum outside [0, 1), or negative decay.
  static absl::Status Validate(const SgdOptions& options);

  // One step on `weights` from a gradient summed over `num_examples` examples. `velocity` has the
  // weights' size and is read and written only when momentum > 0. With zero examples the step is
  // skipped: there is nothing to average.
  void Apply(absl::Span<float> weights, absl::Span<float> velocity,
             absl::Span<const float> grad_sum, int64_t num_examples) const;

  const SgdOptions& options() const { return options_; }
  // "sgd(lr=0.2, momentum=0, weight_decay=0)".
  std::string Describe() const;

 private:
  SgdOptions options_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_OPTIMIZER_H_
