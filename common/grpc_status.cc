#include "common/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/server_builder.h"

namespace summa {

// absl::StatusCode and grpc::StatusCode share their numbering (both follow google.rpc.Code).
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
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
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), std::move(message));
}

}  // namespace summa
