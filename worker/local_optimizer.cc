#include "worker/local_optimizer.h"

#include <algorithm>

#include "common/logging.h"
#include "common/status_macros.h"

namespace summa::worker {

absl::StatusOr<std::unique_ptr<LocalOptimizer>> LocalOptimizer::Create(const OptimizerOptions& inner, int64_t params) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<const Optimizer> optimizer, Optimizer::Create(inner));
  return std::unique_ptr<LocalOptimizer>(new LocalOptimizer(std::move(optimizer), params));
}

LocalOptimizer::LocalOptimizer(std::unique_ptr<const Optimizer> optimizer, int64_t params)
    : optimizer_(std::move(optimizer)), anchor_(params) {
  const size_t slots = optimizer_->SlotNames().size();
  slots_.assign(slots, std::vector<float>(params, 0.0f));
  begun_slots_.assign(slots, std::vector<float>(params, 0.0f));
  for (std::vector<float>& slot : slots_) slot_spans_.emplace_back(slot);
}

void LocalOptimizer::Begin(uint64_t step, absl::Span<const float> weights) {
  std::copy(weights.begin(), weights.end(), anchor_.begin());
  if (has_begun_ && step <= begun_) {
    // The exchange begun last, again: its state. An older one (the server came back from an
    // older checkpoint): the state of the last, the nearest kept; those steps are then not the
    // first run's to the bit.
    if (step < begun_) {
      SUMMA_LOG(WARNING) << "exchange " << step << " begins again from the inner optimizer's state of exchange "
                         << begun_ << " (the state before " << step << " is not kept)";
    }
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i] = begun_slots_[i];
    updates_ = begun_updates_;
    begun_ = step;
    return;
  }
  has_begun_ = true;
  begun_ = step;
  for (size_t i = 0; i < slots_.size(); ++i) begun_slots_[i] = slots_[i];
  begun_updates_ = updates_;
}

void LocalOptimizer::Step(absl::Span<float> weights, absl::Span<const float> grad_sum, int64_t examples) {
  if (examples <= 0) return;
  optimizer_->Apply(updates_, optimizer_->LearningRate(updates_), weights, slot_spans_, grad_sum, examples);
  ++updates_;
}

void LocalOptimizer::PseudoGradient(absl::Span<const float> weights, int64_t examples, absl::Span<float> out) const {
  const float n = static_cast<float>(examples);
  for (size_t i = 0; i < weights.size(); ++i) out[i] = n * (anchor_[i] - weights[i]);
}

}  // namespace summa::worker
