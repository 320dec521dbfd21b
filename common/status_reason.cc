#include "common/status_reason.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace summa {
namespace {

// The payload's key: absl keys payloads by a type URL.
constexpr absl::string_view kPayloadUrl = "type.googleapis.com/summa.v1.StatusReason";

}  // namespace

absl::string_view StatusReasonName(StatusReason reason) {
  switch (reason) {
    case StatusReason::kNone:
      return "";
    case StatusReason::kStaleView:
      return "STALE_VIEW";
    case StatusReason::kJoinRate:
      return "JOIN_RATE";
    case StatusReason::kLatePush:
      return "LATE_PUSH";
  }
  return "";
}

StatusReason StatusReasonFromName(absl::string_view name) {
  for (StatusReason r : {StatusReason::kStaleView, StatusReason::kJoinRate, StatusReason::kLatePush}) {
    if (name == StatusReasonName(r)) return r;
  }
  return StatusReason::kNone;
}

absl::Status WithReason(absl::Status status, StatusReason reason) {
  if (status.ok()) return status;
  if (reason == StatusReason::kNone) {
    status.ErasePayload(kPayloadUrl);
  } else {
    status.SetPayload(kPayloadUrl, absl::Cord(StatusReasonName(reason)));
  }
  return status;
}

StatusReason ReasonOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayloadUrl);  // absl::optional in this Abseil
  if (!payload) return StatusReason::kNone;
  return StatusReasonFromName(std::string(*payload));
}

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  return WithReason(absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message())), ReasonOf(status));
}

}  // namespace summa
