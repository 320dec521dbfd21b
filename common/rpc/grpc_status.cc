#include "common/rpc/grpc_status.h"

#include <atomic>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/server_builder.h"
#include "common/status_reason.h"
#include "summa/v1/summa.pb.h"

namespace summa {
namespace {

constexpr absl::string_view kErrorInfoUrl = "type.googleapis.com/google.rpc.ErrorInfo";

}  // namespace

std::string StatusDetails(const absl::Status& status) {
  const StatusReason reason = ReasonOf(status);
  if (status.ok() || reason == StatusReason::kNone) return "";
  summa::v1::ErrorInfo info;
  info.set_reason(std::string(StatusReasonName(reason)));
  info.set_domain(std::string(kStatusReasonDomain));
  summa::v1::RpcStatus rpc;
  rpc.set_code(static_cast<int>(status.code()));
  // No message: the status carries it already, and only the reason is read from here.
  google::protobuf::Any* any = rpc.add_details();
  any->set_type_url(std::string(kErrorInfoUrl));
  any->set_value(info.SerializeAsString());
  return rpc.SerializeAsString();
}

absl::Status StatusFromDetails(absl::StatusCode code, absl::string_view message, absl::string_view details) {
  absl::Status status(code, message);
  summa::v1::RpcStatus rpc;
  if (details.empty() || !rpc.ParseFromArray(details.data(), static_cast<int>(details.size()))) return status;
  for (const google::protobuf::Any& any : rpc.details()) {
    summa::v1::ErrorInfo info;
    if (any.type_url() != kErrorInfoUrl || !info.ParseFromString(any.value()) ||
        info.domain() != kStatusReasonDomain) {
      continue;
    }
    return WithReason(std::move(status), StatusReasonFromName(info.reason()));
  }
  return status;
}

#ifdef SUMMA_FAULT_INJECTION
namespace {
std::atomic<bool> reword_for_test{false};
}  // namespace

void RewordStatusMessagesForTest(bool on) { reword_for_test.store(on, std::memory_order_relaxed); }
#endif

// absl::StatusCode and grpc::StatusCode share their numbering (both follow google.rpc.Code).
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
#ifdef SUMMA_FAULT_INJECTION
  if (reword_for_test.load(std::memory_order_relaxed)) {
    message = absl::StrCat("reworded ", absl::StatusCodeToString(status.code()));
  }
#endif
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message), StatusDetails(status));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.error_message();
  // gRPC's transport refuses an oversized message without naming the setting behind its limit.
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      absl::StrContains(message, "message larger than max")) {
    absl::StrAppend(&message, " (the limits: summa-server --max_message_bytes, and ", kMaxMessageBytes >> 20,
                    "MiB in Summa's clients)");
  }
  return StatusFromDetails(static_cast<absl::StatusCode>(status.error_code()), message, status.error_details());
}

}  // namespace summa
