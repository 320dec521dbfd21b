#include "worker/fault_injecting_store.h"

#include <filesystem>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer.h"

namespace summa::worker {

absl::StatusOr<JoinInfo> FaultInjectingStore::Join(int rank, int world,
                                                   const std::vector<TensorSpec>& specs,
                                                   const float* initial,
                                                   const std::string& status_address) {
  absl::StatusOr<JoinInfo> joined = inner_->Join(rank, world, specs, initial, status_address);
  if (joined.ok()) rank_ = joined->rank;
  return joined;
}

void FaultInjectingStore::Exit(const std::string& why) {
  std::fprintf(out_, "rank %d: fault injection: exiting %s\n", rank_, why.c_str());
  std::fflush(out_);
  std::_Exit(137);
}

void FaultInjectingStore::BeforePush(uint64_t step) {
  for (const auto& [at, file] : plan_.pauses) {
    if (static_cast<int64_t>(step) != at || std::filesystem::exists(file)) continue;
    std::fprintf(out_, "rank %d: fault injection: pausing before the push of step %llu until %s exists\n", rank_,
                 static_cast<unsigned long long>(step), file.c_str());
    std::fflush(out_);
    while (!std::filesystem::exists(file)) absl::SleepFor(absl::Milliseconds(20));
  }
  if (plan_.delay_push > absl::ZeroDuration()) absl::SleepFor(plan_.delay_push);
  if (!plan_.hold_push_until_fenced || held_) return;
  held_ = true;
  std::fprintf(out_, "rank %d: fault injection: holding the first push until a later process of this rank "
               "fences this one\n", rank_);
  std::fflush(out_);
  const absl::Time give_up = absl::Now() + absl::Minutes(2);
  absl::Status heard = inner_->Heartbeat(rank_);
  // FAILED_PRECONDITION: this session is not the rank's (summa::server::Membership::CheckSession).
  while (!absl::IsFailedPrecondition(heard) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    heard = inner_->Heartbeat(rank_);
  }
  std::fprintf(out_, "rank %d: fault injection: pushing now (%s)\n", rank_,
               heard.ok() ? "not fenced after 2 minutes" : std::string(heard.message()).c_str());
  std::fflush(out_);
}

absl::StatusOr<uint64_t> FaultInjectingStore::PushPull(uint64_t step, int64_t num_examples,
                                                       const float* gradients, float* weights,
                                                       std::vector<int>* live_ranks) {
  BeforePush(step);
  const int64_t s = static_cast<int64_t>(step);
  if (s == plan_.repeat_push_pull_at) {
    SUMMA_RETURN_IF_ERROR(inner_->PushPull(step, num_examples, gradients, weights, live_ranks).status());
    std::fprintf(out_, "rank %d: fault injection: dropping the reply to the push-pull of step %lld "
                 "and sending it again\n", rank_, static_cast<long long>(s));
    std::fflush(out_);
    return inner_->PushPull(step, num_examples, gradients, weights, live_ranks);
  }
  if (plan_.exit_after_push < 0 || s < plan_.exit_after_push) {
    return inner_->PushPull(step, num_examples, gradients, weights, live_ranks);
  }
  SUMMA_ASSIGN_OR_RETURN(bool completed, inner_->Push(step, num_examples, gradients));
  if (!completed) Exit(absl::StrCat("after the push of step ", step));
  SUMMA_RETURN_IF_ERROR(inner_->PullAll(step + 1, weights).status());
  return step + 1;
}

absl::StatusOr<std::vector<float>> FaultInjectingStore::AllReduce(const Collective& group,
                                                                  const std::vector<float>& values) {
  if (group.name == kLossCollective && static_cast<int64_t>(group.round) == plan_.exit_before_round) {
    Exit(absl::StrCat("before round ", group.round, " of '", group.name, "'"));
  }
  return inner_->AllReduce(group, values);
}

}  // namespace summa::worker
