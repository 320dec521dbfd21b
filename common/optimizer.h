// Optimizer: the update weights take from a step's summed gradient, with the state it keeps per
// weight in named slots (the momentum buffer; Adam's two moments): a server partition's master
// weights (which own the slots, and checkpoints carry them by name), a DiLoCo worker's local
// weights (its inner optimizer), and, in DiLoCo, the server's outer weights. PyTorch semantics, so a job matches
// torch.optim given the same gradients: the gradient is the pushed sum divided by the examples
// it covers; `sgd` (momentum, nesterov, L2 weight decay added to the gradient), `adam` (L2 decay
// added to the gradient), `adamw` (decoupled decay) and `adagrad` (L2 decay added to the
// gradient; the embedding tables' row-wise Adagrad), each under a learning-rate schedule.
// Immutable after Create; thread-safe (const).
#ifndef SUMMA_COMMON_OPTIMIZER_H_
#define SUMMA_COMMON_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace summa {

enum class LrSchedule { kConstant, kStep, kCosine };

struct OptimizerOptions {
  std::string name = "sgd";  // sgd, adam, adamw or adagrad
  double learning_rate = 0.1;
  double weight_decay = 0.0;
  // sgd
  double momentum = 0.0;
  bool nesterov = false;
  // adam, adamw (eps: adagrad's too)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // The learning rate at update t (0-based): constant; step: lr * gamma^floor(t / step_size);
  // cosine: linear warm-up over warmup_steps (lr * (t + 1) / warmup_steps), then half a cosine
  // from lr down to 0 at total_steps, and 0 after.
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t step_size = 0;
  double gamma = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
};

absl::StatusOr<LrSchedule> ParseLrSchedule(const std::string& name);
const char* LrScheduleName(LrSchedule schedule);

class Optimizer {
 public:
  // INVALID_ARGUMENT naming the option for an unknown name or an out-of-range value.
  static absl::StatusOr<std::unique_ptr<const Optimizer>> Create(const OptimizerOptions& options);
  virtual ~Optimizer() = default;

  // The per-weight state, in order; each slot has the weights' length and starts at zero.
  virtual std::vector<std::string> SlotNames() const = 0;

  // Update number `t` (0-based: how many updates these weights have taken before; Adam's bias
  // correction counts them) at `learning_rate` (the schedule's, LearningRate(step)), from a
  // gradient summed over `num_examples` examples. `slots` are SlotNames()' buffers. With zero
  // examples nothing changes: there is nothing to average, and the caller counts no update.
  virtual void Apply(uint64_t t, double learning_rate, absl::Span<float> weights,
                     absl::Span<const absl::Span<float>> slots, absl::Span<const float> grad_sum,
                     int64_t num_examples) const = 0;

  const OptimizerOptions& options() const { return options_; }
  const std::string& name() const { return options_.name; }
  double LearningRate(uint64_t t) const;
  // "adam(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0), schedule constant".
  std::string Describe() const;

 protected:
  explicit Optimizer(OptimizerOptions options) : options_(std::move(options)) {}
  virtual std::string DescribeRule() const = 0;

 private:
  const OptimizerOptions options_;
};

}  // namespace summa

#endif  // SUMMA_COMMON_OPTIMIZER_H_
