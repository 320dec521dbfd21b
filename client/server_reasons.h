// Why a server refused a call, as the client acts on it: the reason the server put in the status
// (common/status_reason.h). A server from before reasons put none; for it (one release) the words
// its messages began with or named stand in: "stale membership view", "--join_rate". A current
// server always sends the reason, so rewording its messages changes nothing here.
#ifndef SUMMA_CLIENT_SERVER_REASONS_H_
#define SUMMA_CLIENT_SERVER_REASONS_H_

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/status_reason.h"

namespace summa::worker {

inline bool RefusedForStaleView(const absl::Status& s) {
  if (ReasonOf(s) != StatusReason::kNone) return IsStaleView(s);
  return absl::IsAborted(s) && absl::StartsWith(s.message(), "stale membership view");
}

inline bool RefusedForJoinRate(const absl::Status& s) {
  if (ReasonOf(s) != StatusReason::kNone) return IsJoinRateLimited(s);
  return absl::IsResourceExhausted(s) && absl::StrContains(s.message(), "--join_rate");
}

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_SERVER_REASONS_H_
