// The one place where absl::Status and grpc::Status meet: service edges convert here, and a
// status's reason (common/status_reason.h) crosses as summa.v1.RpcStatus details, on gRPC and in
// the socket plane's replies alike.
#ifndef SUMMA_COMMON_RPC_GRPC_STATUS_H_
#define SUMMA_COMMON_RPC_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace summa {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A refused status's details: a serialized summa.v1.RpcStatus (google.rpc.Status) holding its
// code and its reason as an ErrorInfo (not the message, which travels beside them), or "" when it
// has no reason. StatusFromDetails puts the reason of such
// details back on a status of `code` and `message` (none when the details are empty or not ours).
std::string StatusDetails(const absl::Status& status);
absl::Status StatusFromDetails(absl::StatusCode code, absl::string_view message, absl::string_view details);

#ifdef SUMMA_FAULT_INJECTION
// Test builds only (cmake -DSUMMA_FAULT_INJECTION=ON): from now on every refusal sent from here
// carries "reworded <code>" instead of its message, its code and reason kept, so that a test
// shows no peer deciding anything on the text. Thread-safe.
void RewordStatusMessagesForTest(bool on);
#endif

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_GRPC_STATUS_H_
