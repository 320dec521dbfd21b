// LocalOptimizer: a DiLoCo worker's side of an exchange (Douillard et al., "DiLoCo: Distributed
// Low-Communication Training of Language Models", 2023). Between exchanges the worker steps its
// own weights with an inner optimizer (common/optimizer.h, the server's own update rules); at an
// exchange it pushes the pseudo-gradient, the weights it last pulled (the anchor) less its
// weights now, times the examples its steps covered, and the server's outer optimizer averages
// the group's. The inner optimizer's state lives across exchanges, as in the paper; the state an
// exchange's steps began from is kept, so that steps the worker must take again (it rejoined a
// restarted server, or the group changed under the exchange) start from the same state and give
// the same pseudo-gradient. Owns its buffers, allocated once. Not thread-safe.
#ifndef SUMMA_WORKER_LOCAL_OPTIMIZER_H_
#define SUMMA_WORKER_LOCAL_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/optimizer.h"

namespace summa::worker {

class LocalOptimizer {
 public:
  // INVALID_ARGUMENT for inner options Optimizer::Create refuses.
  static absl::StatusOr<std::unique_ptr<LocalOptimizer>> Create(const OptimizerOptions& inner, int64_t params);

  // Exchange `step`'s local steps begin from `weights`, just pulled: they become the anchor. The
  // inner state is what it was when `step` began before, if it was the exchange begun last (the
  // steps are taken again); for an older one (a server restored from an older checkpoint) the
  // state the last one began from, the nearest kept; otherwise the state as the last steps left
  // it, remembered for a repeat.
  void Begin(uint64_t step, absl::Span<const float> weights);
  // One local step of the weights from a gradient summed over `examples` (none: no step).
  void Step(absl::Span<float> weights, absl::Span<const float> grad_sum, int64_t examples);
  // examples * (anchor - weights): what the exchange pushes, with `examples`.
  void PseudoGradient(absl::Span<const float> weights, int64_t examples, absl::Span<float> out) const;

  // "sgd(lr=0.1, momentum=0, ...)".
  std::string Describe() const { return optimizer_->Describe(); }
  // Local steps taken (the inner optimizer's update count).
  uint64_t updates() const { return updates_; }

 private:
  LocalOptimizer(std::unique_ptr<const Optimizer> optimizer, int64_t params);

  const std::unique_ptr<const Optimizer> optimizer_;
  std::vector<float> anchor_;
  std::vector<std::vector<float>> slots_;  // by optimizer_->SlotNames()
  // Views of slots_, which keep their buffers: they are only ever assigned vectors of their size.
  std::vector<absl::Span<float>> slot_spans_;
  uint64_t updates_ = 0;
  // The state exchange `begun_` began from, for a repeat of its steps.
  bool has_begun_ = false;
  uint64_t begun_ = 0;
  std::vector<std::vector<float>> begun_slots_;
  uint64_t begun_updates_ = 0;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_LOCAL_OPTIMIZER_H_
