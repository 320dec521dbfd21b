// The trainer's DiLoCo exchange: local steps with the inner optimizer, then one push-pull of the
// pseudo-gradient (worker/local_optimizer.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "worker/sharding.h"
#include "worker/trainer.h"

namespace summa::worker {

absl::StatusOr<uint64_t> Trainer::LocalSteps(uint64_t step, int epoch, int64_t first, int64_t end,
                                             int64_t* examples, int64_t* global_examples) {
  const int64_t n = train_->count;
  const int64_t batch = options_.batch_size;
  const int64_t params = models_[0]->num_params();
  const absl::Span<float> weights(weights_->data(), params);
  const absl::Span<float> gradients(gradients_->data(), params);
  // The group of this exchange, named by the reply that ended the last one (or the Join).
  const auto me = std::find(live_.begin(), live_.end(), rank_);
  if (me == live_.end()) return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, " is no longer in the group"));
  const int index = static_cast<int>(me - live_.begin());
  const int size = static_cast<int>(live_.size());
  Tracer* const tracer = options_.tracer;
  local_->Begin(step, weights);
  int64_t covered = 0;
  for (int64_t b = first; b < end; ++b) {
    const ShardRange shard = ShardOf(n, batch, b, index, size);
    if (shard.size() > max_shard_) {
      return absl::InternalError(absl::StrCat("shard of ", shard.size(), " examples exceeds the ", max_shard_,
                                              " prepared for"));
    }
    if (options_.example_log != nullptr) {
      // The exchange's step, and which of the epoch's batches its local step took.
      std::fprintf(options_.example_log,
                   "step %llu batch %lld epoch %d rank %d index %d of %d group %s begin %lld end %lld\n",
                   static_cast<unsigned long long>(step), static_cast<long long>(b), epoch, rank_, index, size,
                   absl::StrJoin(live_, ",").c_str(), static_cast<long long>(shard.begin),
                   static_cast<long long>(shard.end));
      std::fflush(options_.example_log);
    }
    {
      TraceSpan compute(tracer, "compute", "worker");
      SUMMA_ASSIGN_OR_RETURN(const int64_t summed, ComputeGradients(shard.begin, static_cast<int>(shard.size())));
      SUMMA_RETURN_IF_ERROR(models_[0]->GetGradients(gradients.data()));
      local_->Step(weights, gradients, summed);
      covered += summed;
    }
    SUMMA_RETURN_IF_ERROR(LoadWeights());
    *examples += shard.size();
    *global_examples += std::min(batch, n - b * batch);
  }
  local_->PseudoGradient(weights, covered, gradients);
  uint64_t next = step + 1;
  {
    TraceSpan exchange(tracer, "exchange", "worker");
    SUMMA_ASSIGN_OR_RETURN(next, store_->PushPull(step, covered, gradients.data(), weights.data(), &live_));
  }
  TraceSpan load(tracer, "load", "worker");
  SUMMA_RETURN_IF_ERROR(LoadWeights());
  return next;
}

}  // namespace summa::worker
