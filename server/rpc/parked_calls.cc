#include "server/rpc/parked_calls.h"

#include <algorithm>

namespace summa::server {

const Snapshot& NoSnapshot() {
  static const Snapshot none;
  return none;
}

grpc::Status BlockedCall::Wait(const grpc::ServerContext& context, Parked& call, absl::Duration wait) {
  const absl::Time end = absl::Now() + wait;
  while (!answered_.WaitForNotificationWithTimeout(std::min(kCancelCheck, end - absl::Now()))) {
    if (context.IsCancelled()) {
      if (call.Claim()) call.Finish(absl::CancelledError("cancelled by the client"));
      break;
    }
    if (absl::Now() >= end) {
      if (call.Claim()) {
        call.Fill(0, NoSnapshot());
        call.Finish(absl::OkStatus());
      }
      break;
    }
  }
  answered_.WaitForNotification();  // by whoever claimed it
  return status_;
}

}  // namespace summa::server
