// Why a call was refused, for the peer's code to act on: a reason carried beside an absl::Status
// (as a payload), never read from its message, which is for a person and may be reworded. The
// gRPC edge carries it as a google.rpc.ErrorInfo in the status details and the socket plane in
// its reply frame (common/rpc/grpc_status.h), so both transports give it back to the client.
#ifndef SUMMA_COMMON_STATUS_REASON_H_
#define SUMMA_COMMON_STATUS_REASON_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace summa {

enum class StatusReason {
  kNone,
  // ABORTED: a push made under an older membership view (PushRequest.view); the worker refreshes
  // its view and pushes again. Other ABORTED refusals (a job's end) are final.
  kStaleView,
  // RESOURCE_EXHAUSTED: over the server's join rate (summa-server --join_rate); join again a
  // moment later. Other RESOURCE_EXHAUSTED refusals (a full server) are final.
  kJoinRate,
  // FAILED_PRECONDITION: sync mode with backup workers (summa-server --backup_workers): the push
  // reached its step after the step had completed with the first pushes, and was dropped, not
  // summed; a push-pull of it is answered with the newest weights (PullResponse.late) instead.
  kLatePush,
};

// The name on the wire (ErrorInfo.reason): "STALE_VIEW", "JOIN_RATE", "LATE_PUSH"; "" for kNone.
absl::string_view StatusReasonName(StatusReason reason);
// kNone for a name this build does not know.
StatusReason StatusReasonFromName(absl::string_view name);

// `status` with `reason` attached (an OK status stays OK and carries none).
absl::Status WithReason(absl::Status status, StatusReason reason);
StatusReason ReasonOf(const absl::Status& status);
// `status` with `prefix` and ": " before its message, its reason kept.
absl::Status Prefixed(absl::string_view prefix, const absl::Status& status);

inline bool IsStaleView(const absl::Status& s) {
  return absl::IsAborted(s) && ReasonOf(s) == StatusReason::kStaleView;
}
inline bool IsJoinRateLimited(const absl::Status& s) {
  return absl::IsResourceExhausted(s) && ReasonOf(s) == StatusReason::kJoinRate;
}
inline bool IsLatePush(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) && ReasonOf(s) == StatusReason::kLatePush;
}

// The domain of Summa's reasons in ErrorInfo.
inline constexpr absl::string_view kStatusReasonDomain = "summa.v1";

}  // namespace summa

#endif  // SUMMA_COMMON_STATUS_REASON_H_
