// The one place where absl::Status and grpc::Status meet: service edges convert here.
#ifndef SUMMA_COMMON_GRPC_STATUS_H_
#define SUMMA_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace summa {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The words that begin a push's refusal for a stale membership view (PushRequest.view): the
// server writes them after ABORTED, and a worker that sees them refreshes its view and pushes
// again (other ABORTED refusals, a job's end, are final).
inline constexpr absl::string_view kStaleView = "stale membership view";
inline bool IsStaleView(const absl::Status& s) {
  return absl::IsAborted(s) && absl::StartsWith(s.message(), kStaleView);
}

}  // namespace summa

#endif  // SUMMA_COMMON_GRPC_STATUS_H_
