// ParameterClient: a step exchanged partition by partition (BeginStaged, StartStaged,
// NextStaged), for StepExchange (client/step_exchange.h). The rest is client/ps_client.cc.
#include "client/ps_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/status_reason.h"

namespace summa::worker {

namespace pb = ::summa::v1;

absl::Status ParameterClient::BeginStaged(uint64_t step, int64_t num_examples, const float* gradients,
                                          float* weights) {
  if (rank_ < 0) return absl::FailedPreconditionError("a staged step before Join");
  if (staged_in_flight_ != 0) return absl::FailedPreconditionError("a staged step while the last one's calls run");
  SUMMA_RETURN_IF_ERROR(ChooseDataPlane());
  const size_t n = partitions_.size();
  staged_ = Staged{step, num_examples, gradients, weights, std::vector<int>(n, 0), std::vector<bool>(n, false), n};
  if (tracer_ != nullptr && call_begun_.size() < n) call_begun_.resize(n);
  return absl::OkStatus();
}

void ParameterClient::StartStaged(size_t i) {
  if (encoder_.per_partition()) {
    // This partition alone, now: float32 as a slice of the gradients, a 16-bit wire encoded (a
    // refused push is resent with these bytes).
    encoder_.EncodePartition(i, staged_.gradients);
  } else {
    // Top-k takes the whole gradient at once (and keeps it for a resend): wait for the last.
    if (!staged_.marked[i]) {
      staged_.marked[i] = true;
      --staged_.unmarked;
    }
    if (staged_.unmarked != 0) return;
    encoder_.Encode(staged_.step, staged_.num_examples, staged_.gradients);
    std::fill(staged_.marked.begin(), staged_.marked.end(), false);
    staged_.unmarked = partitions_.size();
    for (size_t k = 0; k < partitions_.size(); ++k) LaunchStaged(k);
    return;
  }
  LaunchStaged(i);
}

void ParameterClient::LaunchStaged(size_t i) {
  EncodePush(i, staged_.step, staged_.num_examples, staged_.gradients);
  if (tracer_ != nullptr) call_begun_[i] = absl::Now();
  transport_->Start(i, shard_of_[i], DataMethod::kPushPull, &requests_[i], &replies_[i], absl::Now() + data_deadline_);
  ++staged_in_flight_;
}

bool ParameterClient::NextStaged(size_t* partition, absl::Status* status) {
  for (;;) {
    if (staged_in_flight_ == 0) return false;
    size_t i;
    absl::Status st;
    // Every call has a deadline, so every call comes back.
    if (!transport_->Next(&i, &st)) {
      *partition = 0;
      *status = absl::InternalError("the client lost track of its calls in flight");
      staged_in_flight_ = 0;
      return true;
    }
    if (i == DataTransport::kWoken) return false;
    --staged_in_flight_;
    if (tracer_ != nullptr) tracer_->Complete("pushpull", "client", call_begun_[i], absl::Now(), static_cast<int64_t>(i));
    if (!st.ok()) {
      if (RetryRefusedPush(i, staged_.step, &staged_.refreshes[i], &st)) {
        LaunchStaged(i);
        // As if woken: the wait that took this refusal may also have taken a wake (the socket
        // plane reads its eventfd in the same poll), so the caller looks for ready partitions.
        return false;
      }
      *status = Prefixed(partition_names_[i], st);
    } else {
      *status = DecodePushPull(i, staged_.step, staged_.weights);
      if (status->ok()) {
        staged_live_ranks_.assign(pull_headers_[i].live_ranks().begin(), pull_headers_[i].live_ranks().end());
      }
    }
    if (staged_in_flight_ == 0 && transport_->lost()) plane_chosen_ = false;  // ask where the plane is again
    *partition = i;
    return true;
  }
}

}  // namespace summa::worker
