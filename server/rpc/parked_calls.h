// The gRPC edge's parked calls: the adapter between a call that waits (a data-path call, a held
// shard report) and the core's ParkedCall (server/core/parked_call.h), which the core finishes
// when the step or round completes, or a client's cancellation or a timer does first.
#ifndef SUMMA_SERVER_RPC_PARKED_CALLS_H_
#define SUMMA_SERVER_RPC_PARKED_CALLS_H_

#include <atomic>
#include <functional>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/trace.h"
#include "server/core/limits.h"
#include "server/core/parked_call.h"
#include "common/rpc/grpc_status.h"
#include "server/rpc/service.h"

namespace summa::server {

// What a call answered without values is filled with (a held report reads the membership).
const Snapshot& NoSnapshot();

// A call that waits to be answered. The claim flag decides between the core answering and the
// client cancelling (or a timer); only the winner fills the response and sends the answer.
class Parked final : public ParkedCall {
 public:
  // The counter, the values, and whether the core marked the answer late (MarkLate).
  using FillFn = std::function<void(uint64_t, const Snapshot&, bool late)>;

  // What the trace calls the time from the call's arrival to its answer.
  struct WaitSpan {
    Tracer* tracer = nullptr;  // Not owned; may be null.
    const char* name = "wait";
    int64_t partition = -1;
  };

  // The shares of the server's limits the call holds: `parked` until it is answered, `bytes`
  // until it is forgotten too.
  struct Holds {
    PeerBudget::Hold parked;
    PeerBudget::Hold bytes;
  };

  // `answer` is not owned; alive until its Answer has been called.
  Parked(Answerable* answer, FillFn fill, WaitSpan wait, Holds holds, int value_bytes = 4)
      : answer_(answer), fill_(std::move(fill)), wait_(wait),
        arrived_(wait.tracer != nullptr ? absl::Now() : absl::InfinitePast()), holds_(std::move(holds)),
        value_bytes_(value_bytes) {}
  bool Claim() override { return !claimed_.exchange(true); }
  bool claimed() const override { return claimed_.load(); }
  void Fill(uint64_t counter, const Snapshot& values) override {
    if (wait_.tracer != nullptr) wait_.tracer->Complete(wait_.name, "server", arrived_, absl::Now(), wait_.partition);
    fill_(counter, values, late_);
  }
  void MarkLate() override { late_ = true; }
  // An answered call is no longer parked: its parked-call hold goes now, its bytes when it is
  // forgotten (an AllReduce contribution's stay in the round's sum until the round ends).
  void Finish(absl::Status status) override {
    holds_.parked.Release();
    answer_->Answer(ToGrpcStatus(status));
  }
  int value_bytes() const override { return value_bytes_; }

 private:
  std::atomic<bool> claimed_{false};
  Answerable* const answer_;
  const FillFn fill_;
  const WaitSpan wait_;
  const absl::Time arrived_;
  Holds holds_;
  const int value_bytes_;
  bool late_ = false;  // set before the core hands the call on; read by its claimer
};

// A synchronous handler's call that waits, on its own thread, to be answered through a Parked
// call (a held shard report).
class BlockedCall final : public Answerable {
 public:
  void Answer(const grpc::Status& status) override {
    status_ = status;
    answered_.Notify();
  }
  // Waits up to `wait` for the answer; answers the call itself when no one did by then (OK,
  // filled with no values) or when the client went away first (CANCELLED; looked at every
  // kCancelCheck). Returns the answer's status.
  static constexpr absl::Duration kCancelCheck = absl::Milliseconds(50);
  grpc::Status Wait(const grpc::ServerContext& context, Parked& call, absl::Duration wait);

 private:
  absl::Notification answered_;
  grpc::Status status_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_PARKED_CALLS_H_
